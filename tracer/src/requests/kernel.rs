//! The model's own view of two kernel quantities, for the independent cross-check
//! (`crosscheck`, issue 6): fsync/fdatasync durations as the writer log stores them, and
//! run-queue delays as the thread histories replay them (preempted or woken → switched in).
//! HDR histograms: bounded memory over any session, values within 0.1%.

use session::stats::Hist;

/// What the model saw, over every event pushed into it.
#[derive(Clone, Debug, Default)]
pub struct KernelStats {
    /// fsync/fdatasync (exit − enter) of any target thread: the intervals `ledger_fsync` is
    /// cut from.
    pub fsync: Hist,
    /// Blocked → woken → switched in: wakeup to switch-in.
    pub runqueue_after_wakeup: Hist,
    /// Switched out runnable → switched in.
    pub runqueue_after_preemption: Hist,
    /// Both of the above.
    pub runqueue: Hist,
}

impl KernelStats {
    pub(crate) fn runqueue_delay(&mut self, ns: u64, preempted: bool) {
        self.runqueue.record(ns);
        if preempted {
            self.runqueue_after_preemption.record(ns);
        } else {
            self.runqueue_after_wakeup.record(ns);
        }
    }
}

/// `count`, then µs percentiles, max and mean (the shape the cross-check prints beside).
fn hist_json(h: &Hist) -> serde_json::Value {
    let s = h.stats();
    let us = |ns: u64| ns as f64 / 1000.0;
    serde_json::json!({
        "count": h.count(),
        "p50_us": us(s.p50_ns),
        "p90_us": us(s.p90_ns),
        "p99_us": us(s.p99_ns),
        "p999_us": us(s.p999_ns),
        "max_us": us(s.max_ns),
        "mean_us": s.mean_ns / 1000.0,
    })
}

impl KernelStats {
    /// The `kernel` section of breakdown.json.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "fsync": hist_json(&self.fsync),
            "runqueue": hist_json(&self.runqueue),
            "runqueue_after_wakeup": hist_json(&self.runqueue_after_wakeup),
            "runqueue_after_preemption": hist_json(&self.runqueue_after_preemption),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_by_cause_and_renders() {
        let mut k = KernelStats::default();
        k.runqueue_delay(1_000, true);
        k.runqueue_delay(3_000, false);
        k.fsync.record(250_000);
        let v = k.to_json();
        assert_eq!(v["runqueue"]["count"], 2);
        assert_eq!(v["runqueue"]["mean_us"], 2.0);
        assert_eq!(v["runqueue_after_preemption"]["max_us"], 1.0);
        assert_eq!(v["runqueue_after_wakeup"]["count"], 1);
        assert_eq!(v["fsync"]["p50_us"], 250.0);
    }
}
