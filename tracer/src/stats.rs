//! One streaming distribution of ns values: an HDR histogram (3 significant digits, so within
//! 0.1%) with the exact sum and maximum, for means and maxima. Memory is fixed whatever the
//! session length. Percentiles are capped at the exact max.

use hdrhistogram::Histogram;

/// Percentiles, max and mean of one distribution, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub mean_ns: f64,
}

#[derive(Clone, Debug)]
pub struct Hist {
    hist: Histogram<u64>,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Hist {
            hist: Histogram::new(3).expect("3 significant digits is a valid precision"),
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl Hist {
    pub fn record(&mut self, ns: u64) {
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

    /// The value at quantile `q` (0 when empty).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.hist.is_empty() {
            0
        } else {
            self.hist.value_at_quantile(q).min(self.max_ns)
        }
    }

    pub fn stats(&self) -> Stats {
        let n = self.hist.len();
        Stats {
            p50_ns: self.quantile(0.50),
            p90_ns: self.quantile(0.90),
            p99_ns: self.quantile(0.99),
            p999_ns: self.quantile(0.999),
            max_ns: self.max_ns,
            mean_ns: if n == 0 {
                0.0
            } else {
                self.sum_ns as f64 / n as f64
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_distribution_is_all_zeros_and_percentiles_stop_at_the_max() {
        assert_eq!(Hist::default().stats(), Stats::default());
        let mut h = Hist::default();
        for ns in [1_000, 2_000, 3_000, 1_000_001] {
            h.record(ns);
        }
        let s = h.stats();
        assert_eq!((s.max_ns, s.p999_ns), (1_000_001, 1_000_001));
        assert_eq!(s.mean_ns, 251_500.25);
        assert_eq!(h.count(), 4);
    }
}
