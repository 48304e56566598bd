//! Facts about where and from what a measurement ran, as the header of every run's file holds
//! them (validation.json, results.json, a profile session's files).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    /// `git rev-parse HEAD`.
    pub commit: String,
    /// A note added by hand to a recorded run about its commit; no run writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_note: Option<String>,
    /// Paths under gateway/, loadgen/, xtask/ and the lock file with uncommitted changes: the
    /// code measured may differ from `commit` there.
    pub uncommitted: Vec<String>,
    /// UTC, ISO 8601.
    pub date: String,
    /// `/proc/loadavg` when collected: other work on the machine shows here.
    pub load_average: String,
}
