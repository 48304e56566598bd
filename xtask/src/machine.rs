//! Facts about where and from what a measurement ran, for the header of every report.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

pub use session::machine::Machine;

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

/// A UTC calendar time, without a date crate.
#[derive(Clone, Copy, Debug)]
pub struct UtcTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl UtcTime {
    pub fn date(&self) -> String {
        format!("{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }

    pub fn iso8601(&self) -> String {
        format!(
            "{}T{:02}:{:02}:{:02}Z",
            self.date(),
            self.hour,
            self.minute,
            self.second
        )
    }
}

pub fn utc_now() -> UtcTime {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    utc_from_unix(secs)
}

/// Days since 1970-01-01 to a proleptic Gregorian date, counting in 400-year eras that start
/// on March 1st so the leap day is the last day of an era's year.
fn utc_from_unix(secs: i64) -> UtcTime {
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400) as u32;
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    UtcTime {
        year,
        month,
        day,
        hour: of_day / 3_600,
        minute: of_day / 60 % 60,
        second: of_day % 60,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
