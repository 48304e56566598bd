//! CLOCK_MONOTONIC, read directly, so every timestamp loadgen writes joins with the kernel's
//! `bpf_ktime_get_ns` and with the tracer's records.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, clock_gettime,
    timerfd_create, timerfd_settime,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Nanoseconds on CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    let ts = clock_gettime(ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An absolute CLOCK_MONOTONIC deadline in the runtime's own reactor (a timerfd), to the µs:
/// tokio's timer works in whole ms. Its expiry wakes the runtime's thread directly; a thread
/// sleeping to each deadline and then waking the runtime cost two more context switches a
/// request (loadgen's CPU per request at 15-22k req/s: 36 µs that way, 29-35 µs this way).
pub struct Deadline(AsyncFd<Timer>);

/// The timerfd, seen by tokio through its raw fd.
struct Timer(OwnedFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Deadline {
    /// Must be called inside a tokio runtime with I/O enabled.
    pub fn new() -> io::Result<Self> {
        let timer = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // SAFETY: the AsyncFd owns the timerfd, whose fd stays open and the same until the
        // AsyncFd drops it.
        let registered =
            unsafe { AsyncFd::register_with_interest(Timer(timer), Interest::READABLE) };
        Ok(Deadline(registered?))
    }

    /// Returns once CLOCK_MONOTONIC has reached `deadline_ns` (at once if it has already).
    pub async fn until(&self, deadline_ns: u64) -> io::Result<()> {
        // A zero expiry would disarm the timer instead.
        let at = Timespec::try_from(Duration::from_nanos(deadline_ns.max(1)))
            .map_err(|_| io::ErrorKind::InvalidInput)?;
        let once = Itimerspec {
            it_interval: Timespec::default(),
            it_value: at,
        };
        timerfd_settime(&self.0.get_ref().0, TimerfdTimerFlags::ABSTIME, &once)?;
        loop {
            let mut ready = self.0.readable().await?;
            // Reading the expiry count fails with EAGAIN on this non-blocking fd until the
            // deadline, which `try_io` takes as "not ready yet".
            let expired = ready.try_io(|timer| {
                let mut count = [0u8; 8];
                rustix::io::read(&timer.get_ref().0, &mut count)?;
                Ok(())
            });
            match expired {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_deadline_is_never_early_and_a_past_one_returns_at_once() {
        let deadline = Deadline::new().unwrap();
        for wait_ns in [0, 200_000, 1_500_000] {
            let at = monotonic_ns() + wait_ns;
            deadline.until(at).await.unwrap();
            assert!(
                monotonic_ns() >= at,
                "woke before the deadline ({wait_ns} ns)"
            );
        }
        let past = monotonic_ns() - 1_000_000;
        tokio::time::timeout(Duration::from_secs(5), deadline.until(past))
            .await
            .expect("a deadline in the past returns at once")
            .unwrap();
    }
}
