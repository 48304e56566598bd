//! Distributions and percentiles, defined once.
//!
//! [`Hist`] is one streaming distribution of ns values: an HDR histogram (3 significant digits,
//! so within 0.1%) with the exact sum and maximum, for means and maxima. Memory is fixed
//! whatever the session length. Percentiles are capped at the exact max.
//! [`nearest_rank`] is the exact percentile of a sorted slice, for the figures of recorded runs,
//! and [`median`] the median of a few measured figures (windows, rounds).

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

/// The nearest-rank percentile of an ascending slice, `permille` in 0..=1000: the smallest
/// value with at least that share of values at or below it. `None` when empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], permille: usize) -> Option<T> {
    let n = sorted.len();
    // Integer ranks: `0.55 * 200` in floating point is 110.00000000000001.
    (n > 0).then(|| sorted[(permille * n).div_ceil(1000).clamp(1, n) - 1])
}

/// The median of the finite values (the mean of the middle two for an even count); `None`
/// when there is none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    finite.sort_by(f64::total_cmp);
    let n = finite.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(finite[n / 2]),
        _ => Some((finite[n / 2 - 1] + finite[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_is_the_smallest_value_covering_the_share() {
        let values: Vec<u64> = (1..=200).collect();
        assert_eq!(nearest_rank(&values, 990), Some(198));
        assert_eq!(nearest_rank(&values, 550), Some(110));
        assert_eq!(nearest_rank(&values, 0), Some(1));
        assert_eq!(nearest_rank(&values, 1000), Some(200));
        assert_eq!(nearest_rank::<u64>(&[], 500), None);
        assert_eq!(nearest_rank(&[-3i64, 5], 500), Some(-3));
    }

    #[test]
    fn the_median_skips_non_finite_values() {
        assert_eq!(median(&[3.0, f64::NAN, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::INFINITY]), None);
    }

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
