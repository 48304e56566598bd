//! validation.json: what `cargo xtask validate` measured, as its README renders it.
//!
//! Keys that older runs lack are `Option`; a figure computed from others (a ratio, a median)
//! is `Option` too, since a missing input writes null. Every struct denies unknown fields, so
//! a renamed key fails to parse with its name instead of rendering as "—".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::analysis::{ab, accuracy::Accuracy, crosscheck};
use crate::breakdown;
use crate::machine::Machine;

/// The file's name in a validation run's directory.
pub const VALIDATION_JSON: &str = "validation.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Validation {
    pub command: String,
    pub machine: Machine,
    pub pinning: Vec<Pin>,
    pub settings: Settings,
    pub max_rate: MaxRate,
    /// The open loop's rate, req/s: `settings.load` × the untraced max.
    pub rate: f64,
    pub accuracy: AccuracyRun,
    pub crosscheck: crosscheck::Report,
    pub ab: Ab,
    /// Each mode's cost. Absent from runs before modes were costed.
    pub modes: Option<Vec<Mode>>,
    /// breakdown.json's `calibration` of the accuracy run.
    pub calibration: Option<breakdown::Calibration>,
    pub cost: Cost,
    pub loss: Vec<LossRun>,
    pub soak: Soak,
    pub wall_time_s: f64,
}

/// Where a process was pinned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    pub process: String,
    pub asked: String,
    pub applied: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub load: f64,
    pub quick: bool,
    pub connections: u64,
    pub accuracy_s: f64,
    pub window_s: f64,
    pub windows_per_arm: u64,
    pub mode_window_s: Option<f64>,
    pub mode_windows_per_arm: Option<u64>,
    pub loss_s: f64,
    pub soak_s: f64,
    pub workers: u64,
    pub forced_ring_mib: u32,
    pub forced_stall_s: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxRate {
    /// The search (or `--max-rate`) that set the load.
    pub untraced: f64,
    pub untraced_source: String,
    /// Untraced-then-traced searches. Absent from runs before the searches were paired.
    pub searches: Option<Vec<Search>>,
    /// Median of the searches' untraced halves.
    pub untraced_alongside: Option<f64>,
    pub traced: f64,
    pub ratio_traced_untraced: Option<f64>,
    /// The floor: the traced max with the tracepoints alone.
    pub traced_tracepoints_only: Option<f64>,
    pub ratio_tracepoints_only_untraced: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Search {
    pub untraced: f64,
    pub traced: f64,
    pub ratio: Option<f64>,
}

/// Loadgen's summary of a run, as far as validation keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSummary {
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub achieved_rate: Option<f64>,
    pub p99_us: Option<f64>,
}

/// What the tracer's breakdown.json counted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracerCounts {
    pub requests: u64,
    pub incomplete: u64,
    pub incomplete_reasons: BTreeMap<String, u64>,
    pub lost_events: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccuracyRun {
    pub loadgen: LoadSummary,
    pub tracer: TracerCounts,
    pub join: Accuracy,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ab {
    pub windows: Vec<WindowRecord>,
    pub comparison: ab::Comparison,
}

/// One A/B window (validation.json `ab.windows`, profile's probe-effect.json `windows`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowRecord {
    pub index: u64,
    pub arm: ab::Arm,
    /// Client latency from the scheduled send, µs.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub max_us: Option<f64>,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub achieved_rate: Option<f64>,
    /// The gateway's utime + stime over the window.
    pub gateway_cpu_s: Option<f64>,
    pub gateway_cpu_us_per_request: Option<f64>,
    pub gateway_cpu_share: Option<f64>,
    /// Share of the gateway's CPU not idle over the window.
    pub cpu0_busy: Option<f64>,
    /// The tracer process over the load. Absent from older runs.
    pub tracer_cpu_cores: Option<f64>,
    /// Written by one older run only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracer_bpf_ns_per_request: Option<f64>,
    pub tracer_lost_events: Option<u64>,
    pub tracer_requests: Option<u64>,
    pub tracer_hits_per_request: Option<Hits>,
}

impl WindowRecord {
    /// The figures the arms are compared on; None when one is missing.
    pub fn compared(&self) -> Option<ab::Window> {
        Some(ab::Window {
            arm: self.arm,
            p50_us: self.p50_us?,
            p99_us: self.p99_us?,
            p999_us: self.p999_us?,
            gateway_cpu_us_per_request: self.gateway_cpu_us_per_request?,
            cpu0_busy: self.cpu0_busy?,
        })
    }
}

/// Hits per complete request, by probe kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hits {
    pub sites: Option<f64>,
    pub syscalls: Option<f64>,
    pub sock: Option<f64>,
    pub sched: Option<f64>,
    pub samples: Option<f64>,
}

impl From<breakdown::Hits> for Hits {
    fn from(h: breakdown::Hits) -> Hits {
        Hits {
            sites: Some(h.sites),
            syscalls: Some(h.syscalls),
            sock: Some(h.sock),
            sched: Some(h.sched),
            samples: Some(h.samples),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracedUntraced {
    pub untraced: Option<f64>,
    pub traced: Option<f64>,
}

/// One row of the cost-by-mode table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mode {
    pub mode: String,
    pub flags: Vec<String>,
    pub windows_per_arm: u64,
    /// None for a floor row: its session rebuilds no request.
    pub hits_per_request: Option<Hits>,
    pub probe_ns_per_request: Option<f64>,
    /// The calibration's unmeasured kinds, left out of `probe_ns_per_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_ns_per_request_leaves_out: Option<Vec<String>>,
    pub bpf_ns_per_request: Option<f64>,
    pub gateway_cpu_us_per_request: TracedUntraced,
    pub cpu_ratio: Option<f64>,
    /// Absent from runs before the tracer process's CPU was measured per window.
    pub tracer_cpu_cores: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    pub accuracy_run: Option<breakdown::Cost>,
    pub max_traced_run: Option<breakdown::Cost>,
    pub hits_per_request: Hits,
    /// The tracer process's CPU over the accuracy session, in cores.
    pub tracer_cpu_cores: Option<f64>,
    /// The attach mode (breakdown.json `attach_modes.mode`).
    pub mode: Option<String>,
    /// breakdown.json `drops`: kernel-side drops by counter.
    pub drops: Option<breakdown::Drops>,
}

/// One loss run: at the traced max, above it, or with a forced-small ring.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossRun {
    pub name: String,
    pub rate: f64,
    /// Absent from runs before the loss runs were set by the traced max.
    pub of_traced_max: Option<f64>,
    /// The forced-loss run's ring; None: the default ring.
    pub ring_mib: Option<u32>,
    pub tracer_stopped_s: Option<f64>,
    pub loadgen: LoadSummary,
    /// The same open loop untraced, just before. Absent or null for the forced-loss run and
    /// older runs.
    pub untraced: Option<Untraced>,
    pub events_per_s: Option<f64>,
    pub lost_events: u64,
    pub requests: u64,
    pub incomplete: u64,
    pub incomplete_reasons: BTreeMap<String, u64>,
    /// How many loss spans the tracer listed; None when it listed none.
    pub loss_spans: Option<u64>,
    /// Complete requests across a loss span (must be 0); None when spans were not listed.
    pub complete_crossing_loss: Option<u64>,
    pub accuracy: Accuracy,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Untraced {
    pub achieved_rate: Option<f64>,
    pub p99_us: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Soak {
    pub seconds: f64,
    pub rate: f64,
    pub loadgen: LoadSummary,
    pub tracer_peak_rss_kib: Option<u64>,
    pub tracer_cpu_s_at_end: Option<f64>,
    pub cpu_per_minute: Vec<Minute>,
    pub samples: Vec<SoakSample>,
    pub requests: u64,
    pub incomplete: u64,
    pub lost_events: u64,
    pub cost: Option<breakdown::Cost>,
}

/// The tracer's CPU within one minute of the soak.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Minute {
    pub minute: u64,
    pub cpu_s: f64,
    pub span_s: f64,
    pub cpu_share: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoakSample {
    pub t_s: f64,
    pub cpu_s: Option<f64>,
    pub rss_kib: Option<u64>,
    pub hwm_kib: Option<u64>,
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::json::assert_rename_is_named;

    fn committed() -> Vec<PathBuf> {
        let profiles = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
        let dirs = crate::runs_holding(&profiles, VALIDATION_JSON).unwrap();
        dirs.iter().map(|dir| dir.join(VALIDATION_JSON)).collect()
    }

    #[test]
    fn every_committed_validation_json_parses() {
        let files = committed();
        assert!(!files.is_empty(), "no profiles/*/validation.json");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            if let Err(err) = serde_json::from_str::<Validation>(&text) {
                panic!("{}: {err}", path.display());
            }
        }
    }

    /// The sections validation.json copies from a tracer session's breakdown.json, as every
    /// committed session's breakdown writes them: the next run's copy parses too.
    #[derive(Deserialize)]
    #[expect(dead_code, reason = "parsed to check the types, not read")]
    struct Copied {
        calibration: Option<breakdown::Calibration>,
        cost: Option<breakdown::Cost>,
        drops: Option<breakdown::Drops>,
        hits_per_request: Hits,
    }

    #[test]
    fn every_committed_breakdown_fits_the_sections_validation_copies() {
        let profiles = concat!(env!("CARGO_MANIFEST_DIR"), "/../profiles");
        let mut read = 0;
        for dir in std::fs::read_dir(profiles).unwrap() {
            let dir = dir.unwrap().path();
            for name in ["breakdown.json", "accuracy-breakdown.json"] {
                let Ok(text) = std::fs::read_to_string(dir.join(name)) else {
                    continue;
                };
                if let Err(err) = serde_json::from_str::<Copied>(&text) {
                    panic!("{}/{name}: {err}", dir.display());
                }
                read += 1;
            }
        }
        assert!(read > 0, "no committed breakdown.json");
    }

    #[test]
    fn a_renamed_key_is_an_error_naming_it() {
        let text = std::fs::read_to_string(&committed()[0]).unwrap();
        assert_rename_is_named::<Validation>(&text, "ratio_traced_untraced", "ratio_traced");
        assert_rename_is_named::<Validation>(&text, "wall_time_s", "wall_time");
    }
}
