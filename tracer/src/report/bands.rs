//! The tail view and the median band: mean part contributions of the requests whose overhead
//! is above the p99 of overhead, and of those between its p45 and p55 (both inclusive).
//! Computed by re-reading `requests.csv` at the end, so memory stays bounded.

use crate::requests::{PARTS, Part};

use super::csv::Row;

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

    pub(crate) fn add(&mut self, row: &Row) {
        self.requests += 1;
        self.overhead += u128::from(row.overhead_ns);
        for (s, &ns) in self.sums.iter_mut().zip(&row.parts) {
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
