//! The session README's per-phase on-CPU table: the sampled split from pictures.json
//! (`phase_samples`: samples by the gateway's phase frame), beside the exact `cpu.<phase>`
//! means from breakdown.json when the session traced the phase site (`--phases`).

use std::collections::BTreeMap;

use session::pictures::{BandPhases, PhaseCounts};

/// The phases in request order (pictures.json's map is keyed by name).
const PHASES: [&str; 9] = [
    "auth",
    "parse",
    "scope",
    "ratelimit",
    "registry",
    "vault",
    "upstream",
    "receipt",
    "respond",
];

/// A band's mean µs per part (breakdown.json), by part name.
pub type Means = BTreeMap<String, f64>;

/// One band's requests, for µs per request.
pub struct Band<'a> {
    pub name: &'static str,
    pub samples: &'a PhaseCounts,
    pub requests: u64,
    /// breakdown.json's view of the same band, for the exact `cpu.<phase>` means.
    pub exact: Option<Means>,
}

fn exact_mean_us(means: &Means, phase: &str) -> Option<f64> {
    means.get(&format!("cpu.{phase}")).copied()
}

/// The section: a row per phase, then the samples outside every phase frame and the
/// unresolved ones. `exact`: the session traced the phase site.
#[derive(askama::Template)]
#[template(path = "profile/phases.md", escape = "none")]
struct Section {
    all_samples: u64,
    hz: u64,
    exact: bool,
    bands: Vec<BandColumns>,
    rows: Vec<Row>,
}

struct BandColumns {
    name: &'static str,
    /// The band has an exact column (the session traced the phase site).
    exact_column: bool,
}

struct Row {
    label: &'static str,
    cells: Vec<Cell>,
}

struct Cell {
    n: u64,
    /// Of the band's samples; none without samples.
    share: Option<f64>,
    /// Samples × period / requests; none without requests or a sampling rate.
    per_request_us: Option<f64>,
    /// The exact column, when the band has one: the `cpu.<phase>` mean, if any.
    exact: Option<Option<f64>>,
}

pub fn section(sampled: &BandPhases, bands: &[Band<'_>], exact: bool) -> String {
    use askama::Template as _;
    let hz = sampled.sample_hz.unwrap_or(0);
    let period_us = if hz > 0 { 1e6 / hz as f64 } else { f64::NAN };
    let labels = PHASES
        .iter()
        .map(|phase| (*phase, Some(*phase)))
        .chain([("outside phase frames", None), ("unresolved stacks", None)]);
    let rows = labels
        .map(|(label, phase)| Row {
            label,
            cells: (bands.iter())
                .map(|band| {
                    let s = band.samples;
                    let n = match (phase, label) {
                        (Some(p), _) => s.phases.get(p).copied().unwrap_or(0),
                        (None, "outside phase frames") => s.outside,
                        (None, _) => s.unresolved,
                    };
                    Cell {
                        n,
                        share: (s.samples > 0).then(|| n as f64 / s.samples as f64),
                        per_request_us: (band.requests > 0 && hz > 0)
                            .then(|| n as f64 * period_us / band.requests as f64),
                        exact: (band.exact.as_ref())
                            .filter(|_| exact)
                            .map(|means| phase.and_then(|p| exact_mean_us(means, p))),
                    }
                })
                .collect(),
        })
        .collect();
    Section {
        all_samples: sampled.all.samples,
        hz,
        exact,
        bands: (bands.iter())
            .map(|band| BandColumns {
                name: band.name,
                exact_column: exact && band.exact.is_some(),
            })
            .collect(),
        rows,
    }
    .render()
    .expect("the per-phase template renders")
}

/// The Reading's point on phases: the band's largest sampled phase, or why there is none.
#[derive(askama::Template)]
#[template(path = "profile/phases_reading.md", escape = "none")]
struct Reading<'a> {
    tail: &'a PhaseCounts,
    tail_requests: u64,
    /// The largest phase, its share of the tail's samples and the share outside every phase.
    top: Option<(&'static str, f64, f64)>,
}

pub fn reading(sampled: &BandPhases, tail_requests: u64) -> String {
    use askama::Template as _;
    let tail = &sampled.tail;
    let top = PHASES
        .iter()
        .map(|p| (*p, tail.phases.get(*p).copied().unwrap_or(0)))
        .max_by_key(|(_, n)| *n)
        .filter(|(_, n)| *n > 0)
        .map(|(phase, n)| {
            (
                phase,
                n as f64 / tail.samples as f64,
                tail.outside as f64 / tail.samples.max(1) as f64,
            )
        });
    Reading {
        tail,
        tail_requests,
        top,
    }
    .render()
    .expect("the phase reading renders")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band(samples: u64, upstream: u64, auth: u64, outside: u64) -> PhaseCounts {
        PhaseCounts {
            samples,
            phases: BTreeMap::from([("upstream".to_owned(), upstream), ("auth".to_owned(), auth)]),
            outside,
            unresolved: samples - upstream - auth - outside,
        }
    }

    fn sampled() -> BandPhases {
        BandPhases {
            sample_hz: Some(1000),
            tail: band(10, 6, 1, 2),
            median: band(20, 10, 5, 4),
            all: band(100, 50, 20, 20),
        }
    }

    #[test]
    fn samples_turn_into_shares_and_time_per_request() {
        let sampled = sampled();
        let text = section(
            &sampled,
            &[Band {
                name: "tail",
                samples: &sampled.tail,
                requests: 2,
                exact: Some(Means::from([("cpu.upstream".to_owned(), 123.4)])),
            }],
            true,
        );
        // 6 samples of 1 ms over 2 requests.
        assert!(
            text.contains("| upstream | 6 | 60.0% | 3000.0 | 123.4 |"),
            "{text}"
        );
        assert!(
            text.contains("| outside phase frames | 2 | 20.0% | 1000.0 | – |"),
            "{text}"
        );
        assert!(
            text.contains("| unresolved stacks | 1 | 10.0% | 500.0 | – |"),
            "{text}"
        );
        assert!(reading(&sampled, 2).contains("largest phase is **upstream**: 60%"));
    }
}
