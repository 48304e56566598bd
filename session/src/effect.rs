//! probe-effect.json: a profile session's own probe effect, windows of its open loop with and
//! without its tracer (`cargo xtask profile`), and their comparison (`analysis::ab`).

use serde::{Deserialize, Serialize};

pub use crate::analysis::ab::{Arm, Comparison, MetricComparison, Spread};
use crate::targets::{Bound, PROBE_EFFECT_RATIO, Verdict};
use crate::traced::Target;
use crate::validation::WindowRecord;

pub const FILE: &str = "probe-effect.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeEffect {
    /// What the windows loaded and traced; left out for the gateway (every session before
    /// `--target`).
    #[serde(default, skip_serializing_if = "Target::is_gateway")]
    pub target: Target,
    /// The target's version as it reports it (`nginx -v`); left out for the gateway, whose
    /// version is the session's commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// The `tracer record` flags of the windows and of the session alike.
    pub tracer_flags: Vec<String>,
    pub windows_per_arm: u64,
    pub window_s: f64,
    pub comparison: Comparison,
    pub windows: Vec<WindowRecord>,
}

/// One budgeted ratio, by name.
pub struct Ratio<'a> {
    pub name: &'static str,
    pub metric: &'a MetricComparison,
}

impl Ratio<'_> {
    /// The paired ratio's median against [`PROBE_EFFECT_RATIO`]; an arm without a finite
    /// figure is unmeasured, which nothing counts as within.
    pub fn verdict(&self) -> Verdict {
        PROBE_EFFECT_RATIO.verdict(self.metric.paired_ratio.median)
    }
}

impl ProbeEffect {
    /// The bound each ratio is held to.
    pub const BUDGET: Bound = PROBE_EFFECT_RATIO;

    /// The ratios the budget applies to, in the order the README gives them.
    pub fn ratios(&self) -> [Ratio<'_>; 4] {
        let m = &self.comparison.metrics;
        [
            Ratio {
                name: "client p50",
                metric: &m.p50_us,
            },
            Ratio {
                name: "client p99",
                metric: &m.p99_us,
            },
            Ratio {
                name: "client p99.9",
                metric: &m.p999_us,
            },
            Ratio {
                name: self.target.cpu_per_request(),
                metric: &m.gateway_cpu_us_per_request,
            },
        ]
    }

    /// The ratios that do not meet the budget (over it, or unmeasured).
    pub fn over_budget(&self) -> Vec<(&'static str, Option<f64>)> {
        self.ratios()
            .iter()
            .filter(|r| !r.verdict().met())
            .map(|r| (r.name, r.metric.paired_ratio.median))
            .collect()
    }

    pub fn traced(&self) -> impl Iterator<Item = &WindowRecord> {
        self.windows.iter().filter(|w| w.arm == Arm::Traced)
    }

    /// Median over the traced windows of the tracer process's CPU, in cores.
    pub fn tracer_cores(&self) -> Option<f64> {
        let cores: Vec<f64> = self.traced().filter_map(|w| w.tracer_cpu_cores).collect();
        crate::stats::median(&cores)
    }

    /// Events lost in the traced windows, summed.
    pub fn lost_events(&self) -> u64 {
        self.traced().filter_map(|w| w.tracer_lost_events).sum()
    }
}
