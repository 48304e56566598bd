//! A line a second on stderr while a run goes, so a long run is visibly alive.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::conn::Outcome;

#[derive(Default)]
pub struct Progress {
    done: AtomicU64,
    errors: AtomicU64,
}

impl Progress {
    pub fn count(&self, outcome: Outcome) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if !outcome.is_ok() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Prints until the returned task is aborted.
    pub fn spawn_ticker(self: &Arc<Self>, label: String) -> tokio::task::JoinHandle<()> {
        let progress = self.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let mut last = 0;
            loop {
                tick.tick().await;
                let done = progress.done.load(Ordering::Relaxed);
                let errors = progress.errors.load(Ordering::Relaxed);
                eprintln!(
                    "loadgen: {label} {:>4.0}s  {:>8} done  {:>7} /s  {errors} errors",
                    start.elapsed().as_secs_f64(),
                    done,
                    done - last,
                );
                last = done;
            }
        })
    }
}
