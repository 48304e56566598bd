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

impl Machine {
    /// Markdown lines for a report header.
    pub fn markdown(&self) -> String {
        let mut text = format!(
            "- machine: {} × {}, {} GiB\n- kernel: Linux {}\n- commit: `{}`\n- date: {}\n- load average at start (1, 5, 15 min): {}\n",
            self.cpus,
            self.cpu_model,
            self.memory_gib,
            self.kernel,
            self.commit,
            self.date,
            self.load_average
        );
        if !self.uncommitted.is_empty() {
            let paths: Vec<String> = self.uncommitted.iter().map(|p| format!("`{p}`")).collect();
            text += &format!(
                "- uncommitted changes at run time in: {}\n",
                paths.join(", ")
            );
        }
        text
    }
}
