//! breakdown.json: a session's figures, written by `tracer record` at its end (schema:
//! README, section `breakdown.json`).
//!
//! The file's key order is the order of the fields here. The sections after
//! `hits_per_request` were first written from `serde_json::Value`s, whose keys come out
//! sorted: their fields are declared in that order, so the layout of every recorded session
//! is kept. Fields that older sessions lack are `Option`s, with the sessions noted.

use std::collections::BTreeMap;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

pub const FILE: &str = "breakdown.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Breakdown {
    pub pid: u32,
    /// The `tracer` command line as run (sessions from 2026-12-02 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_args: Option<Vec<String>>,
    pub duration_s: f64,
    /// Complete requests.
    pub requests: u64,
    pub incomplete: u64,
    pub incomplete_reasons: BTreeMap<String, u64>,
    pub lost_events: u64,
    /// Hook group → how it attached; also `mode` (the tracer's flags in words) and the
    /// kernel features detected.
    pub attach_modes: BTreeMap<String, String>,
    /// Per part (and `total`, `overhead`), in the tracer's order.
    pub parts: IndexMap<String, PartStats>,
    pub tail: TailBand,
    pub median: MedianBand,
    pub hits_per_request: Hits,
    /// Sessions from 2026-12-01 evening on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drops: Option<Drops>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracer: Option<TracerCounters>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<Kernel>,
    /// Spans of lost events, `[from_ns, to_ns]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_spans: Option<Vec<[u64; 2]>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// Absent when calibration was skipped (`--no-calibrate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// A kernel-only session's joining of the proxied exchanges (sessions from 2026-12-03 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_only: Option<KernelOnly>,
}

/// What a kernel-only session found in the data syscalls' bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelOnly {
    /// Client request header blocks parsed; each ended as a request or an incomplete one.
    pub client_requests: u64,
    pub upstream_requests: u64,
    pub exchanges: u64,
    pub incomplete: u64,
    /// Connections found unsupported (pipelined, HTTP/2, TLS, a header block past the bytes
    /// captured...), by kind: counted, never guessed.
    pub unsupported: BTreeMap<String, u64>,
    pub idle_connections_dropped: u64,
    /// Arrivals (or upstream replies) taken from a receive's enter for want of the socket's
    /// data-ready.
    pub arrival_from_syscall: u64,
    /// Processes started by a target after attach and followed (nginx's workers).
    pub processes_followed: Vec<u32>,
    pub processes_exited: Vec<u32>,
    /// How upstream requests were joined to client requests (sessions from 2026-12-04 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joins: Option<Joins>,
    /// Connections restarted because an accept or a connect said their fd was a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_reopened: Option<u64>,
    /// Incomplete requests by reason, as incomplete.csv words them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub incomplete_by_reason: BTreeMap<String, u64>,
}

/// How a kernel-only session joined upstream requests to client requests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Joins {
    /// By `x-request-id`.
    pub by_id: u64,
    /// The only pending client request with the upstream request's line.
    pub only_candidate: u64,
    /// Among identical pending ones, by the order of the answers.
    pub by_time: u64,
    /// Among identical pending ones, by threads, in a process that keeps a request on one
    /// thread.
    pub by_thread: u64,
}

/// A part's distribution over complete requests, µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartStats {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

/// The requests at or above the p99 of overhead.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailBand {
    pub threshold_us: f64,
    pub requests: u64,
    pub mean_overhead_us: f64,
    pub parts: BandParts,
}

/// The requests around the median of overhead.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MedianBand {
    pub low_us: f64,
    pub high_us: f64,
    pub requests: u64,
    pub mean_overhead_us: f64,
    pub parts: BandParts,
}

/// A band's parts, in the tracer's order.
pub type BandParts = IndexMap<String, BandPart>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandPart {
    pub mean_us: f64,
    /// Share of the band's overhead; null for a part outside overhead (`upstream`).
    pub share: Option<f64>,
}

/// Probe hits per complete request, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hits {
    pub sites: f64,
    pub syscalls: f64,
    pub sock: f64,
    pub sched: f64,
    pub samples: f64,
}

/// What the kernel side dropped or could not do.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drops {
    pub established_unclaimed: u64,
    pub forced_wakeups: u64,
    pub in_flight_full: u64,
    /// Null where the kernel does not say, with `kretprobe_missed_note` (sessions from
    /// 2026-12-02 on).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json::present"
    )]
    pub kretprobe_missed: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kretprobe_missed_by_program: Option<BTreeMap<String, u64>>,
    /// Why `kretprobe_missed` is null, where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kretprobe_missed_note: Option<String>,
    /// Null when they could not be read (sessions from 2026-12-02 on).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json::present"
    )]
    pub recursion_misses: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recursion_misses_by_program: Option<BTreeMap<String, u64>>,
    pub stack_failed: u64,
    /// Sessions from 2026-12-02 on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_socks_evicted_at_least: Option<u64>,
    pub tids_full: u64,
}

/// The tracer process's own counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracerCounters {
    pub cpu_system_s: f64,
    pub cpu_user_s: f64,
    pub events: u64,
    pub late_events: u64,
    pub loss_spans: u64,
    /// Seconds the reader ran at normal priority because a drain found it behind (0: it kept
    /// up as SCHED_IDLE throughout; absent from sessions before 2026-12-03 noon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader_behind_s: Option<f64>,
    pub stop_reason: String,
}

/// The kernel-side cross-check distributions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kernel {
    pub fsync: KernelHist,
    pub runqueue: KernelHist,
    pub runqueue_after_preemption: KernelHist,
    pub runqueue_after_wakeup: KernelHist,
}

/// One distribution of the `kernel` section, µs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelHist {
    pub count: u64,
    pub max_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p999_us: f64,
    pub p99_us: f64,
}

/// What the session cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// Null unless `--bpf-stats`.
    pub bpf: Option<BpfCost>,
    /// "enabled", or why not.
    pub bpf_stats: String,
    pub loss_spans_total: u64,
    pub raw_events_written: Option<u64>,
    pub session_s: f64,
    pub tracer: TracerCost,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BpfCost {
    /// Kernel CPU the programs took, as a share of one CPU over the session.
    pub cpu_share: Option<f64>,
    pub programs: Vec<BpfProgram>,
    pub total_run_count: u64,
    pub total_run_time_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BpfProgram {
    pub id: u32,
    pub mean_ns: Option<f64>,
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracerCost {
    /// From attach to the end.
    pub cpu_session_s: f64,
    /// From the process's start.
    pub cpu_system_s: f64,
    pub cpu_user_s: f64,
    pub peak_rss_kib: Option<u64>,
    pub rss_kib: Option<u64>,
}

/// The probe cost calibrated before attaching.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    pub cpu: u32,
    pub elapsed_s: f64,
    pub method: String,
    pub noisy: Vec<String>,
    pub not_included: String,
    pub note: String,
    /// By kind; null for a kind calibration could not measure.
    pub ns_per_hit: BTreeMap<String, Option<f64>>,
    /// The rounds' spread; null where a kind had no finite figure (the tracer writes these
    /// from floats, and a non-finite one is written as null: reading it must not fail).
    pub ns_per_hit_min_max: BTreeMap<String, [Option<f64>; 2]>,
    pub probe_ns_per_request: f64,
    pub probe_ns_per_request_by_kind: BTreeMap<String, Option<f64>>,
    /// Sessions from 2026-12-02 (hardened) on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_ns_per_request_leaves_out: Option<Vec<String>>,
    pub rounds: BTreeMap<String, u64>,
    /// Sessions from 2026-12-02 (hardened) on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmeasured: Option<Vec<String>>,
    pub untraced_ns_per_loop: BTreeMap<String, Option<f64>>,
}

impl Calibration {
    /// The per-request probe time of a per-hit kind (`site` → `sites`).
    pub fn per_request(&self, kind: &str) -> Option<f64> {
        let key = match kind {
            "site" => "sites",
            "syscall" => "syscalls",
            other => other,
        };
        self.probe_ns_per_request_by_kind
            .get(key)
            .copied()
            .flatten()
    }
}

impl Cost {
    /// BPF run time, all programs, ns; None without stats.
    pub fn bpf_run_time_ns(&self) -> Option<f64> {
        self.bpf.as_ref().map(|b| b.total_run_time_ns as f64)
    }
}

impl Breakdown {
    /// The file's text: the layout every session has had (see [`crate::json`]).
    pub fn to_json(&self) -> String {
        crate::json::to_string_3dp(self).expect("a breakdown serializes")
    }

    pub fn from_json(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }

    /// The tracer's mode in words (`attach_modes.mode`; sessions before 2026-12-01 evening
    /// lack it).
    pub fn mode(&self) -> Option<&str> {
        self.attach_modes.get("mode").map(String::as_str)
    }

    /// A part's share of the band's overhead, largest first (ties by name).
    pub fn by_share(parts: &BandParts) -> Vec<(&str, &BandPart)> {
        let mut rows: Vec<(&str, &BandPart)> = parts
            .iter()
            .filter(|(_, p)| p.share.is_some())
            .map(|(name, p)| (name.as_str(), p))
            .collect();
        rows.sort_by(|a, b| {
            let share = |p: &BandPart| p.share.unwrap_or(0.0);
            share(b.1).total_cmp(&share(a.1)).then_with(|| a.0.cmp(b.0))
        });
        rows
    }
}
