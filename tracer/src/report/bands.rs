//! The tail view and the median band: mean part contributions of the requests whose overhead
//! is above the p99 of overhead, and of those between its p45 and p55 (both inclusive).
//! Computed by re-reading `requests.csv` at the end, so memory stays bounded. [`Bands`] is the
//! one definition of both bands: the flamegraphs and the timeline select with it too.

use session::requests::RequestRow;
use session::stats::nearest_rank;

use crate::requests::{PARTS, Part};

/// Which requests are "tail" and which "median", by overhead (total − upstream) in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bands {
    /// Tail: overhead strictly above this (the p99 of overhead).
    pub tail_above_ns: u64,
    /// Median band: overhead within `[median_lo_ns, median_hi_ns]` (p45..p55, inclusive).
    pub median_lo_ns: u64,
    pub median_hi_ns: u64,
    /// The p50 of overhead: the timeline's median requests are those closest to it.
    pub median_ns: u64,
}

impl Bands {
    /// From a quantile function of overhead, e.g. `|q| aggregate.overhead_quantile_ns(q)`
    /// (what breakdown.json uses).
    pub fn from_quantiles(quantile_ns: impl Fn(f64) -> u64) -> Bands {
        Bands {
            tail_above_ns: quantile_ns(0.99),
            median_lo_ns: quantile_ns(0.45),
            median_hi_ns: quantile_ns(0.55),
            median_ns: quantile_ns(0.5),
        }
    }

    /// Nearest-rank percentiles of `overheads` (for callers without an aggregate, and tests):
    /// the p-th percentile is the smallest value with at least p% of values at or below it.
    pub fn nearest_rank(overheads: &[u64]) -> Option<Bands> {
        let mut sorted = overheads.to_vec();
        sorted.sort_unstable();
        let at = |permille| nearest_rank(&sorted, permille);
        Some(Bands {
            tail_above_ns: at(990)?,
            median_lo_ns: at(450)?,
            median_hi_ns: at(550)?,
            median_ns: at(500)?,
        })
    }

    pub fn is_tail(&self, overhead_ns: u64) -> bool {
        overhead_ns > self.tail_above_ns
    }

    pub fn is_median(&self, overhead_ns: u64) -> bool {
        (self.median_lo_ns..=self.median_hi_ns).contains(&overhead_ns)
    }
}

/// Requests selected by overhead, and their mean ns per part.
#[derive(Clone, Debug, PartialEq)]
pub struct Band {
    pub requests: u64,
    pub mean_ns: [f64; PARTS],
    pub mean_overhead_ns: f64,
}

impl Band {
    /// Share of the band's mean overhead for each non-upstream part (None for upstream).
    /// Over the non-upstream parts these sum to 1, as overhead is exactly their sum.
    pub fn share(&self, part: Part) -> Option<f64> {
        if part == Part::Upstream {
            return None;
        }
        if self.mean_overhead_ns == 0.0 {
            return Some(0.0);
        }
        Some(self.mean_ns[part.index()] / self.mean_overhead_ns)
    }
}

pub(crate) struct BandSum {
    requests: u64,
    sums: [u128; PARTS],
    overhead: u128,
}

impl BandSum {
    pub(crate) fn new() -> Self {
        BandSum {
            requests: 0,
            sums: [0; PARTS],
            overhead: 0,
        }
    }

    pub(crate) fn add(&mut self, row: &RequestRow) {
        self.requests += 1;
        self.overhead += u128::from(row.overhead_ns);
        for (s, ns) in self.sums.iter_mut().zip(row.parts()) {
            *s += u128::from(ns);
        }
    }

    pub(crate) fn band(&self) -> Band {
        let n = self.requests.max(1) as f64;
        Band {
            requests: self.requests,
            mean_ns: self.sums.map(|s| s as f64 / n),
            mean_overhead_ns: self.overhead as f64 / n,
        }
    }
}
