//! results.json of `cargo xtask bench`: every row's two sides (through the gateway, and
//! direct to the upstream), what the gateway added, and the gate's verdict on it.
//!
//! Every struct denies unknown fields; keys older runs lack have a default.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::machine::Machine;
use crate::targets::{GATE_P99_ADDED_US, Verdict};

/// An open-loop side that achieved less than this share of its target rate did not run the
/// load it was asked for.
pub const MIN_ACHIEVED_SHARE: f64 = 0.95;
/// A direct (load side only) run sent later than this at p99 fell behind by itself, µs.
pub const MAX_DIRECT_SEND_LAG_US: f64 = 1000.0;

/// A row's verdict against the gate ([`GATE_P99_ADDED_US`], and no errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Gate {
    #[serde(rename = "PASS")]
    Pass,
    #[serde(rename = "FAIL")]
    Fail,
    /// The gateway side had errors, whatever its latency.
    #[serde(rename = "FAIL (errors)")]
    FailErrors,
    /// The row did not run as asked: no added figures, no verdict.
    #[serde(rename = "INVALID")]
    Invalid,
}

impl Gate {
    /// The gate on a gateway side and what it added over the direct side.
    pub fn judge(gateway: &Side, added: &Added) -> Gate {
        if gateway.error_count() > 0 {
            return Gate::FailErrors;
        }
        match GATE_P99_ADDED_US.verdict(Some(added.p99_us)) {
            Verdict::Meets => Gate::Pass,
            Verdict::Misses | Verdict::Unmeasured => Gate::Fail,
        }
    }

    pub fn verdict(self) -> Verdict {
        match self {
            Gate::Pass => Verdict::Meets,
            Gate::Fail | Gate::FailErrors => Verdict::Misses,
            Gate::Invalid => Verdict::Unmeasured,
        }
    }

    /// As RESULTS.md and results.json write it.
    pub fn label(self) -> &'static str {
        match self {
            Gate::Pass => "PASS",
            Gate::Fail => "FAIL",
            Gate::FailErrors => "FAIL (errors)",
            Gate::Invalid => "INVALID",
        }
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl Side {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

impl Added {
    /// Gateway − direct at each percentile.
    pub fn between(gateway: &Side, direct: &Side) -> Added {
        Added {
            p50_us: gateway.p50_us - direct.p50_us,
            p99_us: gateway.p99_us - direct.p99_us,
            p999_us: gateway.p999_us - direct.p999_us,
        }
    }
}

fn connections_before_256() -> usize {
    128
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pinning {
    pub gateway_cpus: String,
    pub gateway_cpus_allowed: String,
    pub load_cpus: String,
    pub mock_upstream_cpus_allowed: String,
    pub gateway_workers: usize,
}

/// Raw fdatasync, two ways: overwriting blocks of a preallocated file (how SQLite reuses its
/// WAL after a checkpoint: data only) and appending (a growing WAL: the size change is
/// journalled too).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsyncProbe {
    pub overwrite: FsyncStats,
    pub append: FsyncStats,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsyncStats {
    pub samples: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// What one loadgen run reported (from its `--out` JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Side {
    pub achieved_rate: f64,
    pub sent: u64,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub p50_first_third_us: Option<f64>,
    pub p50_last_third_us: Option<f64>,
    /// Open loop: p99 of how late loadgen sent requests after their scheduled time.
    pub send_lag_p99_us: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Added {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    pub mode: String,
    /// `c16` or `25%`.
    pub load: String,
    pub delay_ms: u64,
    pub concurrency: Option<usize>,
    pub fraction_of_max: Option<f64>,
    pub target_rate: Option<f64>,
    pub gateway: Side,
    pub direct: Side,
    /// None when the row is INVALID: a difference of two runs that did not run as asked.
    pub added: Option<Added>,
    pub receipts_at_start: u64,
    pub receipts_at_end: u64,
    pub wal_bytes_after: u64,
    /// The gateway's CPU time (user + system, /proc/PID/stat) over the row's loadgen run,
    /// warm-up included, per request sent. Absent from older results.json.
    #[serde(default)]
    pub gateway_cpu_us_per_request: Option<f64>,
    pub gate: Gate,
    /// Why the row is INVALID. Absent from older results.json; `judge` recomputes it.
    #[serde(default)]
    pub invalid_reason: Option<String>,
    /// The same row against the `--baseline` gateway, judged against the same direct side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<BaselineRow>,
}

/// A `--baseline` gateway's side of a row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineRow {
    pub gateway: Side,
    pub added: Option<Added>,
    pub gateway_cpu_us_per_request: Option<f64>,
    pub receipts_at_end: u64,
    pub gate: Gate,
    pub invalid_reason: Option<String>,
}

impl Row {
    /// A row that did not run as asked gets no added figures and no verdict.
    pub fn judge(&mut self) {
        if let Some(reason) = invalid_reason(self.target_rate, &self.gateway, &self.direct) {
            self.gate = Gate::Invalid;
            self.invalid_reason = Some(reason);
            self.added = None;
        }
        if let Some(b) = &mut self.baseline
            && let Some(reason) = invalid_reason(self.target_rate, &b.gateway, &self.direct)
        {
            b.gate = Gate::Invalid;
            b.invalid_reason = Some(reason);
            b.added = None;
        }
    }

    pub fn is_valid(&self) -> bool {
        self.invalid_reason.is_none()
    }
}

/// Why a row's figures do not measure the load it asked for, if they do not: a side (gateway
/// or direct) left requests unsent, or, in the open loop, achieved under 95% of the target.
pub fn invalid_reason(target_rate: Option<f64>, gateway: &Side, direct: &Side) -> Option<String> {
    let mut reasons = Vec::new();
    for (name, side) in [("gateway", gateway), ("direct", direct)] {
        let unsent = side.errors.get("unsent").copied().unwrap_or(0);
        if unsent > 0 {
            reasons.push(format!("the {name} side left {unsent} requests unsent"));
        }
        if let Some(target) = target_rate
            && side.achieved_rate < MIN_ACHIEVED_SHARE * target
        {
            reasons.push(format!(
                "the {name} side achieved {:.0} of {target:.0} req/s ({:.0}%)",
                side.achieved_rate,
                100.0 * side.achieved_rate / target
            ));
        }
    }
    // The baseline is what the load side alone costs: if loadgen sent it late, or it came out
    // slower than the gateway's run, the load side set these latencies, not the gateway.
    if let Some(lag) = direct
        .send_lag_p99_us
        .filter(|&lag| lag > MAX_DIRECT_SEND_LAG_US)
    {
        reasons.push(format!(
            "loadgen sent the direct side late (send lag p99 {lag:.0} µs)"
        ));
    }
    for (name, g, d) in [
        ("p50", gateway.p50_us, direct.p50_us),
        ("p99", gateway.p99_us, direct.p99_us),
        ("p99.9", gateway.p999_us, direct.p999_us),
    ] {
        if d > g {
            reasons.push(format!(
                "the direct side was slower than the gateway at {name} ({d:.0} vs {g:.0} µs)"
            ));
        }
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxRate {
    pub delay_ms: u64,
    pub max_rate: f64,
    pub best_concurrency: u64,
    pub receipts_in_template: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineRev {
    pub rev: String,
    pub commit: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Results {
    pub machine: Machine,
    pub pinning: Pinning,
    pub ledger_filesystem: String,
    pub quick: bool,
    pub row_duration_s: f64,
    pub row_warmup_s: f64,
    pub gate_p99_added_us: f64,
    /// Older results.json do not say: they ran with 128.
    #[serde(default = "connections_before_256")]
    pub open_connections: usize,
    pub fdatasync_before: FsyncProbe,
    pub fdatasync_after: FsyncProbe,
    pub max_rates: Vec<MaxRate>,
    /// `--baseline`: the revision asked for and the commit it named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<BaselineRev>,
    pub rows: Vec<Row>,
    pub wall_time_s: f64,
    pub load_average_at_end: String,
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::json::assert_rename_is_named;

    fn side(achieved_rate: f64, errors: &[(&str, u64)]) -> Side {
        Side {
            achieved_rate,
            sent: 0,
            ok: 0,
            errors: errors.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect(),
            p50_us: 0.0,
            p90_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            max_us: 0.0,
            p50_first_third_us: None,
            p50_last_third_us: None,
            send_lag_p99_us: None,
        }
    }

    #[test]
    fn a_row_that_ran_as_asked_is_valid() {
        let target = Some(1000.0);
        assert_eq!(
            invalid_reason(target, &side(1000.0, &[]), &side(990.0, &[])),
            None
        );
        assert_eq!(
            invalid_reason(target, &side(950.0, &[]), &side(950.0, &[])),
            None,
            "95% of the target is enough"
        );
        // A server error is the gateway's failure to judge, not a load that did not run.
        assert_eq!(
            invalid_reason(target, &side(1000.0, &[("500", 3)]), &side(1000.0, &[])),
            None
        );
        // The closed loop has no target rate: any achieved rate is what it measures.
        assert_eq!(
            invalid_reason(None, &side(10.0, &[]), &side(5.0, &[])),
            None
        );
    }

    #[test]
    fn a_direct_baseline_that_is_not_one_makes_a_row_invalid() {
        let gateway = Side {
            p50_us: 500.0,
            p99_us: 2000.0,
            p999_us: 3000.0,
            ..side(1000.0, &[])
        };
        // Slower than the gateway at p99: the load side set the latencies.
        let slow = Side {
            p50_us: 100.0,
            p99_us: 30_000.0,
            p999_us: 2000.0,
            ..side(1000.0, &[])
        };
        let reason = invalid_reason(Some(1000.0), &gateway, &slow).unwrap();
        assert!(
            reason.contains("slower than the gateway at p99"),
            "{reason}"
        );
        assert!(!reason.contains("at p50"), "{reason}");
        // Sent late by loadgen itself.
        let late = Side {
            send_lag_p99_us: Some(1500.0),
            ..side(1000.0, &[])
        };
        let reason = invalid_reason(Some(1000.0), &gateway, &late).unwrap();
        assert!(reason.contains("send lag p99 1500"), "{reason}");
        // The gateway side's own send lag is its queueing, charged to it: not a reason.
        let queued = Side {
            send_lag_p99_us: Some(50_000.0),
            ..gateway.clone()
        };
        assert_eq!(
            invalid_reason(Some(1000.0), &queued, &side(1000.0, &[])),
            None
        );
    }

    #[test]
    fn unsent_requests_on_either_side_make_a_row_invalid() {
        let gateway = invalid_reason(None, &side(100.0, &[("unsent", 7)]), &side(100.0, &[]));
        assert!(
            gateway
                .as_deref()
                .is_some_and(|r| r.contains("gateway") && r.contains('7'))
        );
        let direct = invalid_reason(None, &side(100.0, &[]), &side(100.0, &[("unsent", 2)]));
        assert!(
            direct
                .as_deref()
                .is_some_and(|r| r.contains("direct") && !r.contains("gateway"))
        );
    }

    #[test]
    fn an_open_loop_below_95_percent_of_its_target_is_invalid() {
        let reason = invalid_reason(Some(1000.0), &side(1000.0, &[]), &side(949.0, &[]));
        assert!(
            reason
                .as_deref()
                .is_some_and(|r| r.contains("direct") && r.contains("949"))
        );
        let both = invalid_reason(Some(1000.0), &side(500.0, &[]), &side(400.0, &[]));
        assert!(
            both.as_deref()
                .is_some_and(|r| r.contains("gateway") && r.contains("direct"))
        );
    }

    #[test]
    fn judging_an_invalid_row_drops_its_added_figures_and_verdict() {
        let mut row = Row {
            mode: "open".to_owned(),
            load: "75%".to_owned(),
            delay_ms: 5,
            concurrency: None,
            fraction_of_max: Some(0.75),
            target_rate: Some(1000.0),
            gateway: side(700.0, &[("unsent", 9)]),
            direct: side(1000.0, &[]),
            added: Some(Added {
                p50_us: -1.0,
                p99_us: -1.0,
                p999_us: -1.0,
            }),
            receipts_at_start: 0,
            receipts_at_end: 0,
            wal_bytes_after: 0,
            gateway_cpu_us_per_request: Some(50.0),
            gate: Gate::FailErrors,
            invalid_reason: None,
            baseline: None,
        };
        row.judge();
        assert_eq!(row.gate, Gate::Invalid);
        assert!(row.added.is_none() && !row.is_valid());
        let json = serde_json::to_value(&row).unwrap();
        assert!(json["added"].is_null() && json["invalid_reason"].is_string());
    }

    #[test]
    fn a_baseline_side_is_judged_on_its_own() {
        let figures = Added {
            p50_us: 10.0,
            p99_us: 10.0,
            p999_us: 10.0,
        };
        let mut row = Row {
            mode: "open".to_owned(),
            load: "25%".to_owned(),
            delay_ms: 0,
            concurrency: None,
            fraction_of_max: Some(0.25),
            target_rate: Some(1000.0),
            gateway: side(1000.0, &[]),
            direct: side(1000.0, &[]),
            added: Some(figures.clone()),
            receipts_at_start: 0,
            receipts_at_end: 0,
            wal_bytes_after: 0,
            gateway_cpu_us_per_request: Some(50.0),
            gate: Gate::Pass,
            invalid_reason: None,
            baseline: Some(BaselineRow {
                gateway: side(600.0, &[]),
                added: Some(figures),
                gateway_cpu_us_per_request: Some(90.0),
                receipts_at_end: 0,
                gate: Gate::Pass,
                invalid_reason: None,
            }),
        };
        row.judge();
        assert!(row.is_valid() && row.added.is_some() && row.gate.verdict().met());
        let base = row.baseline.as_ref().unwrap();
        assert_eq!(base.gate, Gate::Invalid);
        assert!(base.added.is_none());
        assert!(
            base.invalid_reason
                .as_deref()
                .unwrap()
                .contains("achieved 600 of 1000")
        );
    }

    fn committed() -> Vec<PathBuf> {
        let profiles = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
        let dirs = crate::runs_holding(&profiles, "results.json").unwrap();
        dirs.iter().map(|dir| dir.join("results.json")).collect()
    }

    #[test]
    fn every_committed_results_json_parses_and_keeps_its_verdicts() {
        let files = committed();
        assert!(!files.is_empty(), "no profiles/*/results.json");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let results: Results = serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            for row in &results.rows {
                // A recorded verdict is what the gate says of the recorded figures.
                if let Some(added) = &row.added {
                    assert_eq!(
                        row.gate,
                        Gate::judge(&row.gateway, added),
                        "{}",
                        path.display()
                    );
                }
            }
        }
    }

    #[test]
    fn a_renamed_key_is_an_error_naming_it() {
        let text = std::fs::read_to_string(&committed()[0]).unwrap();
        assert_rename_is_named::<Results>(&text, "receipts_at_end", "receipts_end");
        assert_rename_is_named::<Results>(&text, "PASS", "PASSED");
    }
}
