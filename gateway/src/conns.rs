//! The connection cap, and which connections give way at it.
//!
//! Every open connection holds a slot. At the cap, a new connection is let in by closing the
//! connections that have waited longest for a request head: accepted and silent, stopped inside
//! their head (slowloris), or idle between keep-alive requests, as nginx reclaims idle
//! keep-alive connections when it runs out. Refusing the new one instead would let clients
//! that send nothing keep everyone else out until their header timeout.
//!
//! Each slot's state is one word of an array the acceptor scans: its connection is serving a
//! request, or the (coarse, monotonic) time since which it has waited for a head. A request
//! writes it twice, when its head is parsed and when its response is ready: a store each, no
//! lock, no syscall. A reclaimed connection is told through its own channel and decides for
//! itself: between requests it closes at once; if a request began meanwhile, it finishes that
//! request, then closes. A reclaim never cuts a request short.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::time::{ClockId, clock_gettime};
use tokio::sync::{Notify, oneshot};

use crate::probe::InFlight;

/// A slot's word: no connection.
const FREE: u64 = u64::MAX;
/// A slot's word: reclaimed, closing.
const CLOSING: u64 = u64::MAX - 1;
/// A slot's word: serving a request (its head parsed, its response not yet ready). Any other
/// value is the time since which the connection has waited for a head.
const SERVING: u64 = 0;

/// Connections reclaimed at once, at most: one scan makes room for this many new ones.
const RECLAIM_BATCH: usize = 32;
/// Reclaimed connections still closing, at most: the slots kept beyond the cap for them.
/// One between requests closes on its next poll, so these are free again within moments.
const HEADROOM: usize = 2 * RECLAIM_BATCH;
/// Reclaims are logged at most this often (ns).
const LOG_EVERY_NS: u64 = 1_000_000_000;

/// The slots of every open connection, up to the cap.
pub struct Slots {
    max: usize,
    /// Per slot: [`FREE`], [`CLOSING`], [`SERVING`] or waiting since (ns).
    words: Box<[AtomicU64]>,
    inner: Mutex<Inner>,
    /// Told whenever a slot is released.
    released: Notify,
}

/// What a slot holds, beside its word.
enum Held {
    Free,
    /// Open and counted against the cap; the sender reclaims it.
    Open(oneshot::Sender<()>),
    /// Reclaimed, not yet closed; counted against [`HEADROOM`].
    Closing,
}

struct Inner {
    held: Vec<Held>,
    free: Vec<usize>,
    open: usize,
    closing: usize,
    /// Reclaimed since the start, and since the last log line.
    reclaimed: u64,
    unlogged: u64,
    /// The longest wait among the unlogged reclaims (ns).
    longest_ns: u64,
    logged_at: Option<u64>,
    /// Scratch for the scan: (waiting since, slot).
    candidates: Vec<(u64, usize)>,
}

/// A connection's hold on its slot, shared by its task and its requests; the slot is free
/// again when the last of them is dropped, which is when the connection has closed.
pub struct Conn {
    slots: Arc<Slots>,
    index: usize,
    /// The request in flight, for the probe sites and for deciding how to close.
    pub in_flight: InFlight,
}

impl Slots {
    /// `max` connections are counted against the cap; up to [`HEADROOM`] more may be closing.
    pub fn new(max: u32) -> Arc<Slots> {
        let max = max as usize;
        let total = max + HEADROOM;
        Arc::new(Slots {
            max,
            words: (0..total).map(|_| AtomicU64::new(FREE)).collect(),
            inner: Mutex::new(Inner {
                held: (0..total).map(|_| Held::Free).collect(),
                free: (0..total).rev().collect(),
                open: 0,
                closing: 0,
                reclaimed: 0,
                unlogged: 0,
                longest_ns: 0,
                logged_at: None,
                candidates: Vec::new(),
            }),
            released: Notify::new(),
        })
    }

    /// A slot for a new connection, reclaiming the longest-waiting ones at the cap; `None`
    /// when every connection is serving a request or closing. The receiver completes when
    /// the connection is reclaimed.
    pub fn admit(self: &Arc<Self>) -> Option<(Conn, oneshot::Receiver<()>)> {
        let now = now_ns();
        let mut inner = self.lock();
        if inner.open >= self.max {
            self.reclaim(&mut inner, now);
        }
        let index = if inner.open < self.max {
            inner.free.pop()
        } else {
            None
        };
        let admitted = index.map(|index| {
            let (reclaim, reclaimed) = oneshot::channel();
            inner.held[index] = Held::Open(reclaim);
            inner.open += 1;
            self.words[index].store(now, Ordering::Relaxed);
            let conn = Conn {
                slots: self.clone(),
                index,
                in_flight: InFlight::default(),
            };
            (conn, reclaimed)
        });
        let line = inner.log_line(self.max, now);
        drop(inner);
        if let Some(line) = line {
            eprintln!("{line}");
        }
        admitted
    }

    /// Completes once no connection holds a slot.
    pub async fn all_closed(&self) {
        self.released_until(|inner| inner.open + inner.closing == 0)
            .await;
    }

    /// Completes once a slot is free, or reclaimed connections can be told to close:
    /// [`Slots::admit`] may then find room. Reclaimed connections close on their task's next
    /// poll, which the acceptor can outrun; waiting for them (briefly) keeps it from turning
    /// a new client away meanwhile.
    pub async fn room(&self) {
        self.released_until(|inner| inner.open < self.max || inner.closing < HEADROOM)
            .await;
    }

    async fn released_until(&self, done: impl Fn(&Inner) -> bool) {
        loop {
            let notified = self.released.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a release between the two still wakes it.
            notified.as_mut().enable();
            if done(&self.lock()) {
                return;
            }
            notified.await;
        }
    }

    /// Tells the longest-waiting connections to close: up to an eighth of those waiting, at
    /// least one, at most [`RECLAIM_BATCH`] and what the headroom allows.
    fn reclaim(&self, inner: &mut Inner, now: u64) {
        let room = HEADROOM - inner.closing;
        if room == 0 {
            return;
        }
        let mut candidates = std::mem::take(&mut inner.candidates);
        candidates.clear();
        for (index, word) in self.words.iter().enumerate() {
            let since = word.load(Ordering::Relaxed);
            if since != SERVING && since < CLOSING {
                candidates.push((since, index));
            }
        }
        let n = (candidates.len() / 8)
            .clamp(1, RECLAIM_BATCH)
            .min(room)
            .min(candidates.len());
        if n > 0 && n < candidates.len() {
            candidates.select_nth_unstable(n - 1);
        }
        for &(since, index) in &candidates[..n] {
            // Its word may have changed since the scan: the connection decides when told.
            let tell = match std::mem::replace(&mut inner.held[index], Held::Closing) {
                Held::Open(tell) => tell,
                Held::Closing => {
                    // Told already: a request that began since then wrote over its word.
                    self.words[index].store(CLOSING, Ordering::Relaxed);
                    continue;
                }
                Held::Free => {
                    inner.held[index] = Held::Free;
                    continue;
                }
            };
            let _ = tell.send(());
            let _ = self.words[index].compare_exchange(
                since,
                CLOSING,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            inner.open -= 1;
            inner.closing += 1;
            inner.reclaimed += 1;
            inner.unlogged += 1;
            inner.longest_ns = inner.longest_ns.max(now.saturating_sub(since));
        }
        inner.candidates = candidates;
    }

    fn release(&self, index: usize) {
        let mut inner = self.lock();
        match std::mem::replace(&mut inner.held[index], Held::Free) {
            Held::Open(_) => inner.open -= 1,
            Held::Closing => inner.closing -= 1,
            Held::Free => return,
        }
        self.words[index].store(FREE, Ordering::Relaxed);
        inner.free.push(index);
        drop(inner);
        self.released.notify_waiters();
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    /// A line for the reclaims not yet logged, at most once per [`LOG_EVERY_NS`].
    fn log_line(&mut self, max: usize, now: u64) -> Option<String> {
        if self.unlogged == 0 || self.logged_at.is_some_and(|at| now - at < LOG_EVERY_NS) {
            return None;
        }
        let line = format!(
            "connections: at the cap of {max}, closed {} that waited longest for a request head \
             (up to {} ms) to make room; {} since start",
            self.unlogged,
            self.longest_ns / 1_000_000,
            self.reclaimed
        );
        self.unlogged = 0;
        self.longest_ns = 0;
        self.logged_at = Some(now);
        Some(line)
    }
}

impl Conn {
    /// A request head is parsed: the connection serves it.
    pub fn serving(&self) {
        self.slots.words[self.index].store(SERVING, Ordering::Relaxed);
    }

    /// The response is ready: the connection waits for its next head from now.
    pub fn waiting(&self) {
        self.slots.words[self.index].store(now_ns(), Ordering::Relaxed);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.slots.release(self.index);
    }
}

/// CLOCK_MONOTONIC_COARSE in ns (the vDSO, no syscall; a tick's resolution is plenty to
/// order waits), never [`SERVING`].
fn now_ns() -> u64 {
    let t = clock_gettime(ClockId::MonotonicCoarse);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
        .clamp(1, CLOSING - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(reclaimed: &mut oneshot::Receiver<()>) -> bool {
        reclaimed.try_recv().is_ok()
    }

    #[test]
    fn at_the_cap_the_longest_waiting_give_way_and_serving_ones_never() {
        let slots = Slots::new(16);
        let mut conns: Vec<_> = (0..16)
            .map(|_| slots.admit().expect("under the cap"))
            .collect();
        // Waits in the order 0..16, by hand: the coarse clock may not tick between admits.
        for (i, (conn, _)) in conns.iter().enumerate() {
            slots.words[conn.index].store(100 + i as u64, Ordering::Relaxed);
        }
        conns[0].0.serving();
        conns[3].0.serving();
        // 14 waiting: an eighth rounds to 1, so one gives way per admit, oldest first.
        let (extra, _) = slots.admit().expect("room made");
        assert!(!told(&mut conns[0].1), "serving");
        assert!(told(&mut conns[1].1), "the longest waiting");
        assert!(!told(&mut conns[2].1));
        // The reclaimed one still holds its slot (closing) until it is dropped.
        let reclaimed = conns.remove(1);
        assert_eq!(slots.lock().closing, 1);
        drop(reclaimed);
        assert_eq!(slots.lock().closing, 0);
        let (_, _) = slots.admit().expect("room made");
        assert!(told(&mut conns[1].1), "next oldest, past the serving one");
        assert!(!told(&mut conns[2].1));
        drop(extra);
    }

    #[test]
    fn no_room_when_every_connection_serves() {
        let slots = Slots::new(16);
        let conns: Vec<_> = (0..16)
            .map(|_| slots.admit().expect("under the cap"))
            .collect();
        for (conn, _) in &conns {
            conn.serving();
        }
        assert!(slots.admit().is_none());
        // A response ready: that connection waits for a head again, and gives way.
        conns[5].0.waiting();
        assert!(slots.admit().is_some());
    }

    #[test]
    fn all_closed_waits_for_the_last_slot() {
        let slots = Slots::new(4);
        let (conn, _) = slots.admit().expect("admit");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let waiting =
                tokio::time::timeout(std::time::Duration::from_millis(50), slots.all_closed());
            assert!(waiting.await.is_err(), "a connection is still open");
            drop(conn);
            slots.all_closed().await;
        });
    }
}
