//! The reader's scheduling policy. It needs throughput, not latency (the ring holds seconds of
//! events), so it runs as SCHED_IDLE: any other task on its CPU runs first. But a reader that
//! gets no CPU at all fills the ring and loses events: a haproxy session at 10k req/s, both
//! CPUs near full, lost 237064 events over 20 s that way. So it leaves SCHED_IDLE for normal
//! priority while it is behind (one drain read a quarter of the ring), and returns once it has
//! kept up for a second, twice as long after each spell (a machine that starves it once tends
//! to again). The time spent behind is reported: the CPU it took then was not idle.

use std::time::{Duration, Instant};

use anyhow::Context as _;

/// A drain that reads this share of the ring (1/N) means the reader is behind.
const BEHIND_SHARE: u64 = 4;
/// While behind, a drain under this share (1/N) of the ring is keeping up.
const KEPT_UP_SHARE: u64 = 16;
/// How long the drains must keep up before the reader yields again, after its first spell
/// behind; it doubles with each spell, up to [`KEPT_UP_MAX`].
const KEPT_UP_FOR: Duration = Duration::from_secs(1);
const KEPT_UP_MAX: Duration = Duration::from_secs(64);

/// What a drain changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// It fell behind: run at normal priority.
    Behind,
    /// It has kept up long enough: back to SCHED_IDLE.
    CaughtUp,
}

/// The decision alone, from the bytes each drain read; no syscalls.
#[derive(Clone, Debug)]
pub struct Backlog {
    ring_bytes: u64,
    behind_since: Option<Instant>,
    kept_up_since: Option<Instant>,
    behind_before: Duration,
    spells: u32,
}

impl Backlog {
    pub fn new(ring_bytes: u64) -> Self {
        Backlog {
            ring_bytes,
            behind_since: None,
            kept_up_since: None,
            behind_before: Duration::ZERO,
            spells: 0,
        }
    }

    /// The bytes one drain must read to count as behind.
    pub fn behind_bytes(&self) -> u64 {
        self.ring_bytes / BEHIND_SHARE
    }

    /// A drain read `bytes` (so far) at `now`.
    pub fn drained(&mut self, bytes: u64, now: Instant) -> Option<Change> {
        let Some(since) = self.behind_since else {
            if bytes >= self.behind_bytes() {
                self.behind_since = Some(now);
                self.spells += 1;
                return Some(Change::Behind);
            }
            return None;
        };
        if bytes >= self.ring_bytes / KEPT_UP_SHARE {
            self.kept_up_since = None;
            return None;
        }
        let kept_up_since = *self.kept_up_since.get_or_insert(now);
        let needed = KEPT_UP_FOR
            .saturating_mul(1 << (self.spells - 1).min(6))
            .min(KEPT_UP_MAX);
        if now.duration_since(kept_up_since) < needed {
            return None;
        }
        self.behind_before += now.duration_since(since);
        self.behind_since = None;
        self.kept_up_since = None;
        Some(Change::CaughtUp)
    }

    /// Time spent behind up to `now`, and in how many spells.
    pub fn behind(&self, now: Instant) -> (Duration, u32) {
        let ongoing = self
            .behind_since
            .map_or(Duration::ZERO, |since| now.duration_since(since));
        (self.behind_before + ongoing, self.spells)
    }
}

/// The reader thread's policy, following its [`Backlog`] once [`ReaderPriority::run_idle`]
/// was called (before that, while attaching, it keeps the normal policy).
pub struct ReaderPriority {
    backlog: Backlog,
    managed: bool,
}

impl ReaderPriority {
    pub fn new(ring_bytes: u64) -> Self {
        ReaderPriority {
            backlog: Backlog::new(ring_bytes),
            managed: false,
        }
    }

    /// From now on the reader runs as SCHED_IDLE while it keeps up. Called once attached:
    /// calibration times itself, and a starved attach would let a short-lived target exit
    /// before it is traced.
    pub fn run_idle(&mut self) -> anyhow::Result<()> {
        set_policy(libc::SCHED_IDLE).context("sched_setscheduler(SCHED_IDLE)")?;
        self.managed = true;
        Ok(())
    }

    pub fn behind_bytes(&self) -> u64 {
        self.backlog.behind_bytes()
    }

    /// A drain read `bytes` (so far).
    pub fn drained(&mut self, bytes: u64) {
        if !self.managed {
            return;
        }
        // The backlog's changes alternate, so each one is a change of policy.
        let change = self.backlog.drained(bytes, Instant::now());
        let policy = match change {
            Some(Change::Behind) => libc::SCHED_OTHER,
            Some(Change::CaughtUp) => libc::SCHED_IDLE,
            None => return,
        };
        if let Err(err) = set_policy(policy) {
            // It stays as it is from here on, said once.
            self.managed = false;
            say!(
                "tracer: WARNING the reader's priority could not be changed ({err}); it stays \
                 as it is, and the time reported behind may be off"
            );
            return;
        }
        if change == Some(Change::Behind) && self.backlog.spells == 1 {
            say!(
                "tracer: the reader fell behind ({} MiB in one drain); it runs at normal \
                 priority until it keeps up, taking CPU the other tasks would have had",
                bytes >> 20
            );
        }
    }

    /// Seconds spent behind so far, and in how many spells.
    pub fn behind(&self) -> (f64, u32) {
        let (time, spells) = self.backlog.behind(Instant::now());
        (time.as_secs_f64(), spells)
    }
}

/// Sets this thread's scheduling policy (priority 0, the only one for both).
fn set_policy(policy: libc::c_int) -> std::io::Result<()> {
    // rustix has no sched_setscheduler.
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscall on this thread, with a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING: u64 = 64 << 20;

    #[test]
    fn a_quarter_of_the_ring_in_one_drain_is_behind_and_a_second_of_small_drains_catches_up() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = Backlog::new(RING);
        assert_eq!(b.drained(RING / 4 - 1, at(0)), None);
        assert_eq!(b.drained(RING / 4, at(10)), Some(Change::Behind));
        // Still reading a lot: not kept up.
        assert_eq!(b.drained(RING / 8, at(20)), None);
        assert_eq!(b.drained(RING / 32, at(30)), None);
        // A large drain restarts the second.
        assert_eq!(b.drained(RING / 16, at(900)), None);
        assert_eq!(b.drained(0, at(1000)), None);
        assert_eq!(b.drained(0, at(1999)), None);
        assert_eq!(b.drained(0, at(2000)), Some(Change::CaughtUp));
        assert_eq!(b.behind(at(5000)), (Duration::from_millis(1990), 1));
        // A second spell adds to the first, counted while it lasts, and needs two seconds.
        assert_eq!(b.drained(RING, at(6000)), Some(Change::Behind));
        assert_eq!(b.behind(at(6500)), (Duration::from_millis(2490), 2));
        assert_eq!(b.drained(0, at(7000)), None);
        assert_eq!(b.drained(0, at(8999)), None);
        assert_eq!(b.drained(0, at(9000)), Some(Change::CaughtUp));
        assert_eq!(b.behind(at(9000)), (Duration::from_millis(4990), 2));
    }

    #[test]
    fn unmanaged_it_changes_nothing() {
        let mut reader = ReaderPriority::new(RING);
        reader.drained(RING);
        assert_eq!(reader.behind(), (0.0, 0));
    }
}
