//! The tracer's own cost, recorded by every `tracer record` session (`cost.json`): per BPF
//! program, run count and mean run time under `BPF_ENABLE_STATS` (as bpftop reads them); and
//! the tracer process's CPU time and peak RSS.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value, json};

pub const COST_JSON: &str = "cost.json";

/// A program's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgramCounters {
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// Counters of the loaded programs among `ids`, by id.
fn read_counters(ids: &[u32]) -> BTreeMap<u32, ProgramCounters> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|info| ids.contains(&info.id()))
        .map(|info| {
            let counters = ProgramCounters {
                name: info.name_as_str().unwrap_or("?").to_owned(),
                run_count: info.run_count(),
                run_time_ns: info.run_time().as_nanos() as u64,
            };
            (info.id(), counters)
        })
        .collect()
}

/// Per-program deltas between two snapshots, as JSON rows with the mean ns per run.
pub fn program_deltas(
    before: &BTreeMap<u32, ProgramCounters>,
    after: &BTreeMap<u32, ProgramCounters>,
    seconds: f64,
) -> Value {
    let mut rows = Vec::new();
    let (mut runs, mut ns) = (0u64, 0u64);
    for (id, end) in after {
        let start = before.get(id).cloned().unwrap_or_default();
        let run_count = end.run_count.saturating_sub(start.run_count);
        let run_time_ns = end.run_time_ns.saturating_sub(start.run_time_ns);
        runs += run_count;
        ns += run_time_ns;
        rows.push(json!({
            "id": id,
            "name": end.name,
            "run_count": run_count,
            "run_time_ns": run_time_ns,
            "mean_ns": (run_count > 0).then(|| run_time_ns as f64 / run_count as f64),
        }));
    }
    json!({
        "programs": rows,
        "total_run_count": runs,
        "total_run_time_ns": ns,
        // Kernel CPU the programs took, as a share of one CPU over the session.
        "cpu_share": if seconds > 0.0 { json!(ns as f64 / 1e9 / seconds) } else { Value::Null },
    })
}

/// `getrusage(RUSAGE_SELF)`: user and system CPU seconds of this process.
pub fn own_cpu_seconds() -> (f64, f64) {
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; RUSAGE_SELF always exists.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime), secs(usage.ru_stime))
}

/// Measures the session from attach to the end. With `bpf_stats`, BPF run-time stats stay
/// enabled while this lives (`BPF_ENABLE_STATS` is global and lasts as long as its fd). They
/// add two clock reads to every program run, so they are off unless asked for.
pub struct CostMeter {
    ids: Vec<u32>,
    stats_fd: Option<OwnedFd>,
    stats_error: Option<String>,
    before: BTreeMap<u32, ProgramCounters>,
    after: Option<(BTreeMap<u32, ProgramCounters>, f64)>,
    started: Instant,
    cpu_before: (f64, f64),
}

impl CostMeter {
    /// Call once every program is attached, with their ids.
    pub fn start(program_ids: Vec<u32>, bpf_stats: bool) -> CostMeter {
        let (stats_fd, stats_error) = if !bpf_stats {
            (None, Some("off (tracer record --bpf-stats)".to_owned()))
        } else {
            match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
                Ok(fd) => (Some(fd), None),
                Err(e) => (None, Some(e.to_string())),
            }
        };
        CostMeter {
            before: read_counters(&program_ids),
            ids: program_ids,
            stats_fd,
            stats_error,
            after: None,
            started: Instant::now(),
            cpu_before: own_cpu_seconds(),
        }
    }

    /// Reads the programs' counters and turns stats off: call while they are still loaded.
    pub fn programs_done(&mut self) {
        if self.after.is_none() {
            let after = read_counters(&self.ids);
            self.after = Some((after, self.started.elapsed().as_secs_f64()));
            self.stats_fd.take();
        }
    }

    /// The figures: BPF programs up to [`CostMeter::programs_done`], the tracer's CPU and
    /// memory up to now (so its end-of-session work counts), plus the fields of `extra`.
    pub fn finish(&mut self, extra: Value) -> Value {
        self.programs_done();
        let (after, seconds) = self.after.clone().expect("programs_done sets it");
        let (user, sys) = own_cpu_seconds();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let mut v = json!({
            "session_s": seconds,
            "bpf_stats": if self.stats_error.is_none() { json!("enabled") } else { json!(self.stats_error) },
            "bpf": if self.stats_error.is_none() {
                program_deltas(&self.before, &after, seconds)
            } else {
                Value::Null
            },
            "tracer": {
                // From start of the process: attach, calibration and the final report included.
                "cpu_user_s": user,
                "cpu_system_s": sys,
                // From attach to now: the steady reading cost.
                "cpu_session_s": (user - self.cpu_before.0) + (sys - self.cpu_before.1),
                "peak_rss_kib": session::proc_status_kib(&status, "VmHWM"),
                "rss_kib": session::proc_status_kib(&status, "VmRSS"),
            },
        });
        if let (Value::Object(map), Value::Object(more)) = (&mut v, extra) {
            map.extend(more);
        }
        v
    }
}

/// Writes `cost.json` in the session directory.
pub fn write(dir: &Path, cost: &Value) -> Result<()> {
    let path = dir.join(COST_JSON);
    std::fs::write(&path, serde_json::to_string_pretty(cost)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(name: &str, run_count: u64, run_time_ns: u64) -> ProgramCounters {
        ProgramCounters {
            name: name.to_owned(),
            run_count,
            run_time_ns,
        }
    }

    #[test]
    fn deltas_and_means() {
        let before = BTreeMap::from([(7, counters("sys_exit", 10, 1_000))]);
        let after = BTreeMap::from([
            (7, counters("sys_exit", 110, 6_000)),
            (9, counters("switch", 0, 0)),
        ]);
        let v = program_deltas(&before, &after, 2.0);
        assert_eq!(v["programs"][0]["mean_ns"], 50.0);
        assert_eq!(v["programs"][1]["mean_ns"], Value::Null);
        assert_eq!(v["total_run_count"], 100);
        assert_eq!(v["cpu_share"], 5_000.0 / 1e9 / 2.0);
    }

    #[test]
    fn own_cpu_seconds_are_not_negative() {
        let (user, sys) = own_cpu_seconds();
        assert!(user >= 0.0 && sys >= 0.0);
    }
}
