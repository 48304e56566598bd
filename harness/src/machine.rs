//! Facts about where and from what a measurement ran, for the header of every report.

use std::path::Path;
use std::process::Command;

pub use session::machine::Machine;
use time::OffsetDateTime;
use time::format_description::FormatItem;
use time::macros::format_description;

/// This machine, now: for the header of a run that is about to measure.
pub fn collect() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or_else(
            || "unknown".to_owned(),
            |(_, model)| model.trim().to_owned(),
        );
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: f64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0.0);
    let root = crate::workspace::root();
    let uncommitted = git(
        &root,
        &[
            "status",
            "--porcelain",
            "--",
            "gateway",
            "loadgen",
            "xtask",
            "Cargo.lock",
        ],
    )
    .lines()
    .map(|line| line.get(3..).unwrap_or(line).to_owned())
    .collect();
    Machine {
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib: (memory_kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
            |_| "unknown".to_owned(),
            |release| release.trim().to_owned(),
        ),
        commit: git(&root, &["rev-parse", "HEAD"]).trim().to_owned(),
        uncommitted,
        date: utc_now().iso8601(),
        load_average: load_average(),
        commit_note: None,
    }
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn git(root: &Path, args: &[&str]) -> String {
    Command::new("git")
        .current_dir(root)
        .args(args)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The filesystem holding `path`, as `findmnt` names it, e.g. `/dev/vda ext4 /`.
pub fn filesystem_of(path: &Path) -> String {
    Command::new("findmnt")
        .args(["-n", "-o", "SOURCE,FSTYPE,TARGET", "-T"])
        .arg(path)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| {
            String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A UTC time, to the second, as the reports write it.
#[derive(Clone, Copy, Debug)]
pub struct UtcTime(OffsetDateTime);

/// `2026-12-01T09:30:00Z`.
const ISO8601: &[FormatItem<'_>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
/// `20261201T093000Z`: sorts by time and needs no quoting in a path.
const COMPACT: &[FormatItem<'_>] =
    format_description!("[year][month][day]T[hour][minute][second]Z");

impl UtcTime {
    pub fn iso8601(&self) -> String {
        self.format(ISO8601)
    }

    /// `20261201T093000Z`.
    pub fn compact(&self) -> String {
        self.format(COMPACT)
    }

    fn format(&self, description: &[FormatItem<'_>]) -> String {
        // Years 0..=9999 and a description without fallible parts: formatting cannot fail.
        self.0.format(description).expect("a UTC time formats")
    }
}

pub fn utc_now() -> UtcTime {
    UtcTime(OffsetDateTime::now_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc_from_unix(secs: i64) -> UtcTime {
        UtcTime(OffsetDateTime::from_unix_timestamp(secs).unwrap())
    }

    #[test]
    fn unix_times_become_utc_dates() {
        assert_eq!(utc_from_unix(0).iso8601(), "1970-01-01T00:00:00Z");
        assert_eq!(utc_from_unix(951_782_400).iso8601(), "2000-02-29T00:00:00Z");
        assert_eq!(
            utc_from_unix(1_709_251_199).iso8601(),
            "2024-02-29T23:59:59Z"
        );
        assert_eq!(
            utc_from_unix(1_735_689_600).iso8601(),
            "2025-01-01T00:00:00Z"
        );
        assert_eq!(
            utc_from_unix(4_102_444_800).iso8601(),
            "2100-01-01T00:00:00Z"
        );
        assert_eq!(utc_from_unix(1_764_581_400).compact(), "20251201T093000Z");
        assert_eq!(utc_from_unix(5).compact(), "19700101T000005Z");
    }
}
