//! What /proc says about a process and a CPU: CPU time from /proc/PID/stat, memory from
//! /proc/PID/status, and a CPU's busy share from /proc/stat.

/// USER_HZ: the unit of utime/stime in /proc/PID/stat (100 on every Linux architecture we run).
const TICKS_PER_S: f64 = 100.0;

/// utime + stime of a process (all its threads, live and exited), seconds.
pub fn parse_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name is in parentheses and may hold spaces: split after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_S)
}

/// The command name and parent pid from /proc/PID/stat.
pub fn parse_comm_ppid(stat: &str) -> Option<(&str, u32)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, comm) = head.split_once('(')?;
    // rest starts at field 3 (state); ppid is field 4.
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((comm, ppid))
}

pub fn cpu_seconds(pid: u32) -> Option<f64> {
    parse_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// A `kB` field of /proc/PID/status, in KiB.
pub fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    parse_status_kib(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        field,
    )
}

/// Busy and total jiffies of one CPU (busy = all but idle and iowait).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub busy: u64,
    pub total: u64,
}

impl CpuTimes {
    /// Busy share between `self` (earlier) and `later`, 0..=1.
    pub fn busy_share_until(&self, later: &CpuTimes) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        later.busy.saturating_sub(self.busy) as f64 / total as f64
    }
}

pub fn parse_cpu_times(proc_stat: &str, cpu: usize) -> Option<CpuTimes> {
    let name = format!("cpu{cpu}");
    let line = proc_stat
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name.as_str()))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is already
    // inside user, so only the first eight count.
    let counted = &values[..values.len().min(8)];
    let total: u64 = counted.iter().sum();
    let idle = counted.get(3).copied().unwrap_or(0) + counted.get(4).copied().unwrap_or(0);
    Some(CpuTimes {
        busy: total - idle,
        total,
    })
}

pub fn cpu_times(cpu: usize) -> Option<CpuTimes> {
    parse_cpu_times(&std::fs::read_to_string("/proc/stat").ok()?, cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cpu_from_stat_with_a_spaced_name() {
        let stat = "4242 (tokio worker) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    250 75 0 0 20 0 3 0 100 0 0";
        assert_eq!(parse_cpu_seconds(stat), Some(3.25));
        assert_eq!(parse_cpu_seconds("garbage"), None);
        assert!(cpu_seconds(std::process::id()).is_some());
    }

    #[test]
    fn name_and_parent_from_stat() {
        let stat = "4242 (tokio (worker)) S 17 4242 4242 0 -1 4194560 500 0 0 0 250 75";
        assert_eq!(parse_comm_ppid(stat), Some(("tokio (worker)", 17)));
        assert_eq!(parse_comm_ppid("4242 (x"), None);
    }

    #[test]
    fn status_fields() {
        let status = "Name:\tx\nVmHWM:\t  1234 kB\nVmRSS:\t 99 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(1234));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(99));
        assert_eq!(parse_status_kib(status, "Vm"), None);
    }

    #[test]
    fn cpu_busy_share() {
        let before = "cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 100 0 50 800 50 0 0 0 0 0\ncpu1 1 1 1 1\n";
        let after = "cpu0 200 0 100 1000 50 0 0 0 0 0\n";
        let (a, b) = (
            parse_cpu_times(before, 0).unwrap(),
            parse_cpu_times(after, 0).unwrap(),
        );
        assert_eq!(
            a,
            CpuTimes {
                busy: 150,
                total: 1000
            }
        );
        assert!((a.busy_share_until(&b) - 150.0 / 350.0).abs() < 1e-12);
        assert_eq!(parse_cpu_times(before, 2), None);
        assert!(cpu_times(0).is_some());
    }
}
