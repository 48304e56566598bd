//! Which requests are committed to an upstream action, so a shutdown never cuts one off
//! between its upstream call and its receipt.
//!
//! A request takes a [`Pass`] before its decision steps (the upstream call is the last of them)
//! and keeps it until its receipt is durable or has failed. The shutdown's grace period bounds
//! only the requests without a pass: once it has run out, [`Acting::close`] refuses new passes
//! and waits for every pass taken to be returned, however long that is (each is bounded by its
//! service's upstream timeout and one ledger commit).

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// Set in `state` once no more passes are given.
const CLOSED: u64 = 1 << 63;

#[derive(Debug, Default)]
pub struct Acting {
    /// [`CLOSED`] | passes out. One atomic word: a pass is never given after `close` has seen
    /// the count it waits for.
    state: AtomicU64,
    returned_last: Notify,
}

/// Held from before the upstream call until the receipt is settled.
#[derive(Debug)]
pub struct Pass<'a>(&'a Acting);

impl Acting {
    /// A pass, or `None` once the shutdown no longer waits for new actions.
    pub fn enter(&self) -> Option<Pass<'_>> {
        let before = self.state.fetch_add(1, Ordering::AcqRel);
        let pass = Pass(self);
        (before & CLOSED == 0).then_some(pass)
    }

    /// Passes still out.
    pub fn outstanding(&self) -> u64 {
        self.state.load(Ordering::Acquire) & !CLOSED
    }

    /// Gives no more passes and waits until every pass given has been returned.
    pub async fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
        loop {
            let returned = self.returned_last.notified();
            let mut returned = std::pin::pin!(returned);
            // Registered before the check, so a return between the two still wakes it.
            returned.as_mut().enable();
            if self.outstanding() == 0 {
                return;
            }
            returned.await;
        }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let before = self.0.state.fetch_sub(1, Ordering::AcqRel);
        if before == CLOSED | 1 {
            self.0.returned_last.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn close_waits_for_every_pass_and_refuses_new_ones() {
        let acting = Arc::new(Acting::default());
        std::mem::forget(acting.enter().expect("a pass before close"));
        assert_eq!(acting.outstanding(), 1);

        let closing = tokio::spawn({
            let acting = acting.clone();
            async move { acting.close().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!closing.is_finished(), "close returned with a pass out");
        assert!(acting.enter().is_none(), "a pass given after close");
        assert_eq!(acting.outstanding(), 1, "a refused pass is not counted");

        // The forgotten pass, returned.
        drop(Pass(&acting));
        tokio::time::timeout(Duration::from_secs(5), closing)
            .await
            .expect("close still waiting after the last pass came back")
            .expect("close task");
    }

    #[tokio::test]
    async fn close_with_no_pass_out_returns_at_once() {
        let acting = Acting::default();
        drop(acting.enter());
        tokio::time::timeout(Duration::from_secs(5), acting.close())
            .await
            .expect("close waited with no pass out");
    }
}
