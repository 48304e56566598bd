//! loadgen.json (`loadgen --out` of a run at a rate or concurrency) and find-max.json
//! (`loadgen --find-max --out`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const LOADGEN_JSON: &str = "loadgen.json";
pub const FIND_MAX_JSON: &str = "find-max.json";

/// HDR percentiles, µs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Percentiles {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

/// One run of the load generator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// `open` or `closed`.
    pub mode: String,
    pub url: String,
    pub direct: bool,
    /// Open loop only.
    pub requested_rate: Option<f64>,
    /// Closed loop only.
    pub concurrency: Option<usize>,
    pub connections: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub first_request_id: Option<u64>,
    pub last_request_id: Option<u64>,
    /// Requests sent, warm-up included (the rows of `--requests-out`).
    pub sent: u64,
    /// Requests of the measured window (after warm-up), unsent ones included.
    pub measured: u64,
    /// 2xx responses in the measured window.
    pub ok: u64,
    /// `ok` per second, from the window's start to its last 2xx response.
    pub achieved_rate: f64,
    /// Non-2xx outcomes of the measured window by HTTP status, `transport`, `timeout` or
    /// `unsent` (open loop: still queued when the drain ended).
    pub errors: BTreeMap<String, u64>,
    /// `scheduled` (open loop: no coordinated omission) or `sent` (closed loop).
    pub latency_from: String,
    /// 2xx responses of the measured window, in µs.
    pub latency_us: Percentiles,
    /// Open loop: how late each request of the window was sent after its scheduled time, in
    /// µs: loadgen's own dispatch delay, plus any wait for a free connection while every
    /// connection was in flight at the server. Already inside `latency_us`.
    pub send_lag_us: Option<Percentiles>,
    /// p50 of the window's first and last thirds, in µs: a drift check.
    pub p50_first_third_us: Option<f64>,
    pub p50_last_third_us: Option<f64>,
}

impl Summary {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Requests still queued when the drain ended.
    pub fn unsent(&self) -> u64 {
        self.errors.get("unsent").copied().unwrap_or(0)
    }
}

/// One concurrency step of `--find-max`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub concurrency: usize,
    pub achieved_rate: f64,
    pub ok: u64,
    pub errors: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FindMax {
    /// `find-max`.
    pub mode: String,
    pub url: String,
    pub direct: bool,
    /// The highest achieved rate of a step with at most 1% errors, in req/s.
    pub max_rate: f64,
    pub best_concurrency: usize,
    pub step_duration_s: f64,
    pub steps: Vec<Step>,
}
