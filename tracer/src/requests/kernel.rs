//! The model's own view of two kernel quantities, for the independent cross-check
//! (`crosscheck`, issue 6): fsync/fdatasync durations as the writer log stores them, and
//! run-queue delays as the thread histories replay them (preempted or woken → switched in).
//! HDR histograms: bounded memory over any session, values within 0.1%.

use hdrhistogram::Histogram;

use crate::aggregate::Stats;

#[derive(Clone, Debug)]
pub struct KernelHist {
    hist: Histogram<u64>,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for KernelHist {
    fn default() -> Self {
        KernelHist {
            hist: Histogram::new(3).expect("3 significant digits is a valid precision"),
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl KernelHist {
    pub(crate) fn record(&mut self, ns: u64) {
        // Auto-resizing `record` grows the range; `saturating_record` alone would clamp to
        // the initial range, so it is only the fallback past u64 range.
        if self.hist.record(ns).is_err() {
            self.hist.saturating_record(ns);
        }
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    pub fn stats(&self) -> Stats {
        let n = self.hist.len();
        let q = |q: f64| {
            if n == 0 {
                0
            } else {
                self.hist.value_at_quantile(q).min(self.max_ns)
            }
        };
        Stats {
            p50_ns: q(0.50),
            p90_ns: q(0.90),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            max_ns: self.max_ns,
            mean_ns: if n == 0 {
                0.0
            } else {
                self.sum_ns as f64 / n as f64
            },
        }
    }
}

/// What the model saw, over every event pushed into it.
#[derive(Clone, Debug, Default)]
pub struct KernelStats {
    /// fsync/fdatasync (exit − enter) of any target thread: the intervals `ledger_fsync` is
    /// cut from.
    pub fsync: KernelHist,
    /// Blocked → woken → switched in: wakeup to switch-in.
    pub runqueue_after_wakeup: KernelHist,
    /// Switched out runnable → switched in.
    pub runqueue_after_preemption: KernelHist,
    /// Both of the above.
    pub runqueue: KernelHist,
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

impl KernelHist {
    /// `count`, then µs percentiles, max and mean (the shape the cross-check prints beside).
    pub fn to_json(&self) -> serde_json::Value {
        let s = self.stats();
        let us = |ns: u64| ns as f64 / 1000.0;
        serde_json::json!({
            "count": self.count(),
            "p50_us": us(s.p50_ns),
            "p90_us": us(s.p90_ns),
            "p99_us": us(s.p99_ns),
            "p999_us": us(s.p999_ns),
            "max_us": us(s.max_ns),
            "mean_us": s.mean_ns / 1000.0,
        })
    }
}

impl KernelStats {
    /// The `kernel` section of breakdown.json.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "fsync": self.fsync.to_json(),
            "runqueue": self.runqueue.to_json(),
            "runqueue_after_wakeup": self.runqueue_after_wakeup.to_json(),
            "runqueue_after_preemption": self.runqueue_after_preemption.to_json(),
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
