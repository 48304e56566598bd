//! Exact order statistics of a sample of signed ns values (validation sets are small enough to
//! sort, and a negative gap must stay visible rather than clamp to 0).

use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Dist {
    pub count: u64,
    pub min_ns: i64,
    pub p50_ns: i64,
    pub p90_ns: i64,
    pub p99_ns: i64,
    pub p999_ns: i64,
    pub max_ns: i64,
    pub mean_ns: f64,
    /// Values below 0.
    pub negative: u64,
}

/// Nearest-rank quantile of sorted `v` (q in 0..=1).
fn rank(sorted: &[i64], q: f64) -> i64 {
    let n = sorted.len();
    let k = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[k - 1]
}

impl Dist {
    pub fn of(mut values: Vec<i64>) -> Dist {
        if values.is_empty() {
            return Dist::default();
        }
        values.sort_unstable();
        let sum: i128 = values.iter().map(|&v| i128::from(v)).sum();
        Dist {
            count: values.len() as u64,
            min_ns: values[0],
            p50_ns: rank(&values, 0.50),
            p90_ns: rank(&values, 0.90),
            p99_ns: rank(&values, 0.99),
            p999_ns: rank(&values, 0.999),
            max_ns: values[values.len() - 1],
            mean_ns: sum as f64 / values.len() as f64,
            negative: values.iter().filter(|&&v| v < 0).count() as u64,
        }
    }

    /// The JSON shape used in validation.json: µs with ns precision.
    pub fn to_json(&self) -> Value {
        let us = |ns: i64| ns as f64 / 1000.0;
        json!({
            "count": self.count,
            "min_us": us(self.min_ns),
            "p50_us": us(self.p50_ns),
            "p90_us": us(self.p90_ns),
            "p99_us": us(self.p99_ns),
            "p999_us": us(self.p999_ns),
            "max_us": us(self.max_ns),
            "mean_us": self.mean_ns / 1000.0,
            "negative": self.negative,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles_keep_negatives() {
        let d = Dist::of((1..=1000).rev().map(|v| v - 3).collect());
        assert_eq!((d.count, d.min_ns, d.max_ns), (1000, -2, 997));
        assert_eq!((d.p50_ns, d.p99_ns, d.p999_ns), (497, 987, 996));
        assert_eq!(d.negative, 2);
        assert_eq!(d.mean_ns, 497.5);
    }

    #[test]
    fn empty_and_single() {
        assert_eq!(Dist::of(Vec::new()), Dist::default());
        let d = Dist::of(vec![42]);
        assert_eq!((d.p50_ns, d.p999_ns, d.max_ns, d.min_ns), (42, 42, 42, 42));
    }
}
