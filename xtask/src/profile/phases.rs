//! The session README's per-phase on-CPU table: the sampled split from pictures.json
//! (`phase_samples`: samples by the gateway's phase frame), beside the exact `cpu.<phase>`
//! means from breakdown.json when the session traced the phase site (`--phases`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

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
pub fn section(sampled: &BandPhases, bands: &[Band<'_>], exact: bool) -> String {
    let mut md = String::new();
    let w = &mut md;
    let hz = sampled.sample_hz.unwrap_or(0);
    let _ = writeln!(
        w,
        "\n## On-CPU time by phase (sampled)\n\n**Sampled**: {} on-CPU samples of complete requests at {hz} Hz, counted by the \
         gateway's phase frame (`gw_phase_<phase>`) in their user stack; each sample stands for 1/{hz} s of CPU, so µs per \
         request = samples × period / requests, an estimate good to about ±√n samples. Samples outside every phase frame \
         are hyper's and the runtime's work between phases and the response write.{}\n",
        sampled.all.samples,
        if exact {
            " The exact columns are the `cpu.<phase>` means of the same band from the `phase` site (`--phases`), which \
             also charge the work between phases to the phase in force."
        } else {
            " The exact split needs the `phase` site (`--phases`), at ~9 more uprobe traps a request."
        }
    );
    let mut header = String::from("| phase |");
    let mut rule = String::from("|---|");
    for band in bands {
        let _ = write!(
            header,
            " {0} samples | {0} share | {0} µs/req (sampled) |",
            band.name
        );
        rule.push_str("---|---|---|");
        if exact && band.exact.is_some() {
            let _ = write!(header, " {} µs/req (exact) |", band.name);
            rule.push_str("---|");
        }
    }
    let _ = writeln!(w, "{header}\n{rule}");
    let period_us = if hz > 0 { 1e6 / hz as f64 } else { f64::NAN };
    let rows = PHASES
        .iter()
        .map(|phase| (*phase, Some(*phase)))
        .chain([("outside phase frames", None), ("unresolved stacks", None)]);
    for (label, phase) in rows {
        let mut row = format!("| {label} |");
        for band in bands {
            let s = band.samples;
            let n = match (phase, label) {
                (Some(p), _) => s.phases.get(p).copied().unwrap_or(0),
                (None, "outside phase frames") => s.outside,
                (None, _) => s.unresolved,
            };
            let share = if s.samples > 0 {
                format!("{:.1}%", n as f64 / s.samples as f64 * 100.0)
            } else {
                "–".to_owned()
            };
            let per_request = if band.requests > 0 && hz > 0 {
                format!("{:.1}", n as f64 * period_us / band.requests as f64)
            } else {
                "–".to_owned()
            };
            let _ = write!(row, " {n} | {share} | {per_request} |");
            if exact && let Some(view) = &band.exact {
                let exact = phase
                    .and_then(|p| exact_mean_us(view, p))
                    .map_or("–".to_owned(), |us| format!("{us:.1}"));
                let _ = write!(row, " {exact} |");
            }
        }
        let _ = writeln!(w, "{row}");
    }
    md
}

/// The Reading's point on phases: the band's largest sampled phase, or why there is none.
pub fn reading(sampled: &BandPhases, tail_requests: u64) -> String {
    let tail = &sampled.tail;
    let top = PHASES
        .iter()
        .map(|p| (*p, tail.phases.get(*p).copied().unwrap_or(0)))
        .max_by_key(|(_, n)| *n);
    match top {
        Some((phase, n)) if n > 0 => format!(
            "On CPU (sampled, {} samples of the {tail_requests} tail requests), the tail's largest phase is **{phase}**: \
             {:.0}% of its samples ({:.0}% outside every phase frame); see *On-CPU time by phase*.",
            tail.samples,
            n as f64 / tail.samples as f64 * 100.0,
            tail.outside as f64 / tail.samples.max(1) as f64 * 100.0
        ),
        _ => format!(
            "No on-CPU sample of the {tail_requests} tail requests fell in a phase frame ({} samples): the per-phase \
             split says nothing about the tail in this session.",
            tail.samples
        ),
    }
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
