//! Exact order statistics of a sample of signed ns values (validation sets are small enough to
//! sort, and a negative gap must stay visible rather than clamp to 0).

use serde::{Deserialize, Serialize};

use crate::stats::nearest_rank;

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

/// A [`Dist`] as validation.json holds it: µs with ns precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistUs {
    pub count: u64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    pub negative: u64,
}

impl Dist {
    pub fn of(mut values: Vec<i64>) -> Dist {
        values.sort_unstable();
        let (Some(&min_ns), Some(&max_ns)) = (values.first(), values.last()) else {
            return Dist::default();
        };
        let rank = |permille| nearest_rank(&values, permille).expect("not empty");
        let sum: i128 = values.iter().map(|&v| i128::from(v)).sum();
        Dist {
            count: values.len() as u64,
            min_ns,
            p50_ns: rank(500),
            p90_ns: rank(900),
            p99_ns: rank(990),
            p999_ns: rank(999),
            max_ns,
            mean_ns: sum as f64 / values.len() as f64,
            negative: values.iter().filter(|&&v| v < 0).count() as u64,
        }
    }

    pub fn to_us(&self) -> DistUs {
        let us = |ns: i64| ns as f64 / 1000.0;
        DistUs {
            count: self.count,
            min_us: us(self.min_ns),
            p50_us: us(self.p50_ns),
            p90_us: us(self.p90_ns),
            p99_us: us(self.p99_ns),
            p999_us: us(self.p999_ns),
            max_us: us(self.max_ns),
            mean_us: self.mean_ns / 1000.0,
            negative: self.negative,
        }
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
        assert_eq!(d.to_us().p50_us, 0.042);
    }
}
