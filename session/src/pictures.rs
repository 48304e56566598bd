//! pictures.json: what a session's pictures (flame graphs, trace.json, the wait-for view)
//! show, written by `tracer record` beside them. Keys are sorted (the file is written from a
//! map), so the fields are declared in that order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const FILE: &str = "pictures.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pictures {
    /// On-CPU samples over every complete request.
    pub all_samples: u64,
    /// Whether kernel frames were named (kallsyms readable).
    pub kernel_symbols: bool,
    pub median_band: MedianBand,
    /// The sampled per-phase split of each band's on-CPU samples (sessions from 2026-12-02 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_samples: Option<BandPhases>,
    pub requests: u64,
    pub tail: Tail,
    pub trace: Trace,
    /// The tail's wait-for view, null without `--wait-for` (absent before 2026-12-01 evening).
    #[serde(default)]
    pub wait: Option<Wait>,
    /// The same over every complete request or over a uniform sample.
    #[serde(default)]
    pub wait_all: Option<Wait>,
    /// What `wait_all` covers (sessions from 2026-12-02, hardened, on).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json::present"
    )]
    pub wait_all_of: Option<Option<String>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MedianBand {
    /// `[low, high]`.
    pub overhead_ns: [u64; 2],
    pub requests: u64,
    pub samples: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tail {
    pub above_overhead_ns: u64,
    pub offcpu_ns: u64,
    pub requests: u64,
    pub samples: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    pub complete_events: u64,
    pub median_req_ids: Vec<u64>,
    pub slowest_req_ids: Vec<u64>,
    pub thread_tracks: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandPhases {
    pub all: PhaseCounts,
    pub median: PhaseCounts,
    /// Null with sampling off.
    pub sample_hz: Option<u64>,
    pub tail: PhaseCounts,
}

/// A band's on-CPU samples by the phase they fell in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseCounts {
    /// Samples in a request's poll but outside every phase.
    pub outside: u64,
    pub phases: BTreeMap<String, u64>,
    pub samples: u64,
    /// Samples whose stack could not be placed.
    pub unresolved: u64,
}

/// What held the CPU while requests were ready but not running, and what the ledger writer
/// did while they waited for their receipt.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wait {
    pub charged_ns: u64,
    /// Largest first.
    pub holders: Vec<Holder>,
    pub receipt: Vec<ReceiptHolder>,
    pub receipt_ns: u64,
    /// Sessions from 2026-12-02 on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    pub scheduling_ns: u64,
    /// Sessions from 2026-12-02 on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncharged_requests: Option<u64>,
    pub unknown_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    pub holder: String,
    pub ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptHolder {
    pub holder: String,
    pub ns: u64,
    pub part: String,
}
