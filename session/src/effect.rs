//! probe-effect.json: a profile session's own probe effect, windows of its open loop with and
//! without its tracer (`cargo xtask profile`), and their comparison (`tracer-validate ab`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::breakdown::Hits;
use crate::targets::{Bound, PROBE_EFFECT_RATIO, Verdict};

pub const FILE: &str = "probe-effect.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeEffect {
    /// The `tracer record` flags of the windows and of the session alike.
    pub tracer_flags: Vec<String>,
    pub windows_per_arm: u64,
    pub window_s: f64,
    pub comparison: Comparison,
    pub windows: Vec<Window>,
}

/// `tracer-validate ab`'s output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    pub traced_windows: usize,
    pub untraced_windows: usize,
    pub pairs: usize,
    pub metrics: Metrics,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    pub p50_us: Metric,
    pub p99_us: Metric,
    pub p999_us: Metric,
    pub gateway_cpu_us_per_request: Metric,
    pub cpu0_busy: Metric,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    pub traced: Spread,
    pub untraced: Spread,
    pub ratio_of_medians: Option<f64>,
    /// traced/untraced of neighbouring windows, over the pairs.
    pub paired_ratio: Spread,
}

/// Median, min and max; null where an arm had no finite value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// One window, as `ab::windows` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    pub index: usize,
    pub arm: Arm,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub achieved_rate: f64,
    pub gateway_cpu_s: Option<f64>,
    pub gateway_cpu_us_per_request: Option<f64>,
    pub gateway_cpu_share: Option<f64>,
    pub cpu0_busy: Option<f64>,
    /// Traced windows only.
    pub tracer_cpu_cores: Option<f64>,
    pub tracer_lost_events: Option<u64>,
    pub tracer_requests: Option<u64>,
    pub tracer_hits_per_request: Option<Hits>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    Traced,
    Untraced,
}

impl Arm {
    pub fn word(self) -> &'static str {
        match self {
            Arm::Traced => "traced",
            Arm::Untraced => "untraced",
        }
    }
}

/// One budgeted ratio, by name.
pub struct Ratio<'a> {
    pub name: &'static str,
    pub metric: &'a Metric,
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
                name: "gateway CPU per request",
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

    pub fn traced(&self) -> impl Iterator<Item = &Window> {
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
