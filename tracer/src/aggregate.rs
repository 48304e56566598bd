//! Streaming aggregation of request outcomes: one HDR histogram per part, plus `total` and
//! `overhead` (= total − upstream), with exact ns sums for means and exact maxima. Memory is
//! fixed whatever the session length.
//!
//! Percentiles are HDR values ([`session::stats`]), capped at the exact max.

use std::collections::BTreeMap;

use crate::requests::{Hits, Outcome, PARTS, Part, RequestRecord};
use session::stats::{Hist, Stats};

/// What a distribution is of: one part, or the request's total or overhead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    Total,
    Overhead,
    Part(Part),
}

impl Metric {
    /// Total, overhead, then every part in [`Part::ALL`] order.
    pub fn all() -> impl Iterator<Item = Metric> {
        [Metric::Total, Metric::Overhead]
            .into_iter()
            .chain(Part::ALL.into_iter().map(Metric::Part))
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::Total => "total",
            Metric::Overhead => "overhead",
            Metric::Part(p) => p.name(),
        }
    }

    pub fn of(self, r: &RequestRecord) -> u64 {
        match self {
            Metric::Total => r.total_ns(),
            Metric::Overhead => r.overhead_ns(),
            Metric::Part(p) => r.part_ns(p),
        }
    }
}

/// Mean probe hits per complete request, per kind (breakdown.json's `hits_per_request`).
pub use session::breakdown::Hits as HitsPerRequest;

pub struct Aggregate {
    total: Hist,
    overhead: Hist,
    parts: Vec<Hist>,
    requests: u64,
    incomplete: BTreeMap<String, u64>,
    hits: [u64; 5],
}

impl Default for Aggregate {
    fn default() -> Self {
        Self::new()
    }
}

impl Aggregate {
    pub fn new() -> Self {
        Aggregate {
            total: Hist::default(),
            overhead: Hist::default(),
            parts: (0..PARTS).map(|_| Hist::default()).collect(),
            requests: 0,
            incomplete: BTreeMap::new(),
            hits: [0; 5],
        }
    }

    pub fn add(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Complete(r) => self.add_record(r),
            Outcome::Incomplete(i) => *self.incomplete.entry(i.reason.clone()).or_default() += 1,
        }
    }

    fn add_record(&mut self, r: &RequestRecord) {
        self.requests += 1;
        self.total.record(r.total_ns());
        self.overhead.record(r.overhead_ns());
        for (dist, &ns) in self.parts.iter_mut().zip(&r.parts) {
            dist.record(ns);
        }
        let Hits {
            sites,
            syscalls,
            sock,
            sched,
            samples,
        } = r.hits;
        for (sum, n) in self
            .hits
            .iter_mut()
            .zip([sites, syscalls, sock, sched, samples])
        {
            *sum += u64::from(n);
        }
    }

    /// Complete requests.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    pub fn incomplete(&self) -> u64 {
        self.incomplete.values().sum()
    }

    /// Incomplete requests by reason, in reason order.
    pub fn incomplete_reasons(&self) -> &BTreeMap<String, u64> {
        &self.incomplete
    }

    pub fn stats(&self, metric: Metric) -> Stats {
        match metric {
            Metric::Total => self.total.stats(),
            Metric::Overhead => self.overhead.stats(),
            Metric::Part(p) => self.parts[p.index()].stats(),
        }
    }

    /// Overhead at quantile `q` (0..=1), ns: the running p99 for live progress, band edges.
    pub fn overhead_quantile_ns(&self, q: f64) -> u64 {
        self.overhead.quantile(q)
    }

    pub fn hits_per_request(&self) -> HitsPerRequest {
        let n = self.requests.max(1) as f64;
        let [sites, syscalls, sock, sched, samples] = self.hits.map(|h| h as f64 / n);
        HitsPerRequest {
            sites,
            syscalls,
            sock,
            sched,
            samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::Incomplete;
    use crate::requests::synthetic::record_of_parts;

    fn record(id: u64, upstream: u64, scheduling: u64) -> Outcome {
        let mut parts = [0; PARTS];
        parts[Part::Upstream.index()] = upstream;
        parts[Part::Scheduling.index()] = scheduling;
        let hits = Hits {
            sites: 10,
            syscalls: id as u32,
            ..Hits::default()
        };
        Outcome::Complete(record_of_parts(id, 200, 1000, parts, hits))
    }

    #[test]
    fn exact_means_and_maxima_with_hdr_percentiles() {
        let mut agg = Aggregate::new();
        for id in 1..=100 {
            agg.add(&record(id, 5000, id * 1000));
        }
        agg.add(&Outcome::Incomplete(Incomplete {
            req_id: 0,
            reason: "events lost".into(),
        }));
        assert_eq!(agg.requests(), 100);
        assert_eq!(agg.incomplete(), 1);
        let s = agg.stats(Metric::Part(Part::Scheduling));
        assert_eq!(s.max_ns, 100_000);
        assert_eq!(s.mean_ns, 50_500.0);
        assert!((s.p50_ns as f64 - 50_000.0).abs() <= 50.0, "{s:?}");
        assert!((s.p99_ns as f64 - 99_000.0).abs() <= 100.0, "{s:?}");
        let o = agg.stats(Metric::Overhead);
        assert_eq!((o.max_ns, o.mean_ns), (100_000, 50_500.0));
        assert_eq!(agg.stats(Metric::Total).max_ns, 105_000);
        let h = agg.hits_per_request();
        assert_eq!((h.sites, h.syscalls), (10.0, 50.5));
    }

    #[test]
    fn empty_is_zero_not_a_panic() {
        let agg = Aggregate::new();
        assert_eq!(agg.stats(Metric::Total), Stats::default());
        assert_eq!(agg.overhead_quantile_ns(0.99), 0);
    }
}
