//! Re-polls a task's future at once when it woke itself during its poll.
//!
//! hyper signals between halves that live in one task: a request body read wakes the
//! connection's dispatcher ("want more"), a client response delivered by the upstream
//! connection wakes the response future. Each such self-wake costs tokio a full round trip
//! (schedule, queue, poll the whole task again) for work the task could have done in the same
//! poll, and, traced, two probe hits. [`Repoll`] absorbs a wake that arrives while the inner
//! future is being polled and polls it again, up to [`MAX_REPOLLS`] times; a wake at any other
//! time, or one still pending after the last re-poll, goes to the task as usual, so a future
//! that yields on purpose is still rescheduled.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Re-polls per task poll, at most: a future that keeps waking itself still yields.
pub const MAX_REPOLLS: usize = 4;

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

struct Shared {
    state: AtomicU8,
    task: Mutex<Option<Waker>>,
}

impl Shared {
    fn wake_task(&self) {
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // While polling, note the wake; the poll loop acts on it. Otherwise pass it on.
        match self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {}
            Err(WOKEN) => {}
            Err(_) => self.wake_task(),
        }
    }
}

pub struct Repoll<F> {
    shared: Arc<Shared>,
    waker: Waker,
    inner: F,
}

impl<F> Repoll<F> {
    pub fn new(inner: F) -> Self {
        let shared = Arc::new(Shared {
            state: AtomicU8::new(IDLE),
            task: Mutex::new(None),
        });
        Repoll {
            waker: Waker::from(shared.clone()),
            shared,
            inner,
        }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned; it is never moved out of `self`.
        let this = unsafe { self.get_unchecked_mut() };
        {
            let mut task = this.shared.task.lock().unwrap_or_else(|p| p.into_inner());
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..=MAX_REPOLLS {
            this.shared.state.store(POLLING, Ordering::Release);
            // SAFETY: see above.
            let out = unsafe { Pin::new_unchecked(&mut this.inner) }.poll(&mut inner_cx);
            let woken = this.shared.state.swap(IDLE, Ordering::AcqRel) == WOKEN;
            if out.is_ready() || !woken {
                return out;
            }
        }
        // Still waking itself: let the scheduler run others first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future that wakes itself `wakes` times, then is ready; counts its polls.
    struct SelfWaking {
        wakes: usize,
        polls: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.wakes == 0 {
                return Poll::Ready(self.polls);
            }
            self.wakes -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(0.into()));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn self_wakes_are_polled_again_in_the_same_task_poll() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(Repoll::new(SelfWaking { wakes: 2, polls: 0 }));
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(3));
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "the task was never woken"
        );
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields_to_the_task() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(Repoll::new(SelfWaking {
            wakes: 100,
            polls: 0
        }));
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(fut.inner.polls, MAX_REPOLLS + 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "rescheduled once");
    }

    #[test]
    fn a_wake_after_the_poll_goes_to_the_task() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(Repoll::new(std::future::pending::<()>()));
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        fut.waker.wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
