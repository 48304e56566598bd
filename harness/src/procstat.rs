//! What /proc says about a process and a CPU, read with `procfs`: CPU time from /proc/PID/stat
//! (in the kernel's own clock ticks, not an assumed USER_HZ), memory from /proc/PID/status, and
//! a CPU's busy share from /proc/stat.

use procfs::process::{Process, Stat};
use procfs::{CpuTime, CurrentSI as _, KernelStats};

/// utime + stime of a process (all its threads, live and exited), seconds, at
/// `ticks_per_second` clock ticks a second.
pub fn stat_cpu_seconds(stat: &Stat, ticks_per_second: u64) -> f64 {
    (stat.utime + stat.stime) as f64 / ticks_per_second as f64
}

fn stat(pid: u32) -> Option<Stat> {
    Process::new(i32::try_from(pid).ok()?).ok()?.stat().ok()
}

pub fn cpu_seconds(pid: u32) -> Option<f64> {
    Some(stat_cpu_seconds(&stat(pid)?, procfs::ticks_per_second()))
}

/// One process's place in the tree and its CPU, in clock ticks: its own (utime + stime, all
/// its threads) and its reaped children's (cutime + cstime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    pub pid: u32,
    pub ppid: u32,
    pub own_ticks: u64,
    pub reaped_children_ticks: u64,
}

impl From<&Stat> for TreeEntry {
    fn from(stat: &Stat) -> TreeEntry {
        TreeEntry {
            pid: stat.pid as u32,
            ppid: stat.ppid as u32,
            own_ticks: stat.utime + stat.stime,
            reaped_children_ticks: (stat.cutime + stat.cstime).max(0) as u64,
        }
    }
}

/// CPU ticks of `root` and of every live descendant, each with what its reaped children used
/// (a child's ticks, its own reaped children's included, move into its parent's cutime +
/// cstime when it is reaped, so the sum runs on across a worker's exit); None when `root` is
/// not among `entries`.
pub fn tree_ticks(root: u32, entries: &[TreeEntry]) -> Option<u64> {
    let top = entries.iter().find(|e| e.pid == root)?;
    let mut total = top.own_ticks + top.reaped_children_ticks;
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for child in entries
            .iter()
            .filter(|e| e.ppid == parent && e.pid != parent)
        {
            total += child.own_ticks + child.reaped_children_ticks;
            frontier.push(child.pid);
        }
    }
    Some(total)
}

/// CPU seconds of a process and all its descendants ([`tree_ticks`] over /proc): the whole of
/// a multi-process server (nginx's master and workers). For a process without children it is
/// [`cpu_seconds`].
pub fn tree_cpu_seconds(pid: u32) -> Option<f64> {
    let entries: Vec<TreeEntry> = procfs::process::all_processes()
        .ok()?
        .filter_map(|process| Some(TreeEntry::from(&process.ok()?.stat().ok()?)))
        .collect();
    Some(tree_ticks(pid, &entries)? as f64 / procfs::ticks_per_second() as f64)
}

/// The command name and parent pid of every process, by pid.
pub fn comm_ppid_all() -> Vec<(u32, u32, String)> {
    let Ok(processes) = procfs::process::all_processes() else {
        return Vec::new();
    };
    processes
        .filter_map(|process| {
            let stat = process.ok()?.stat().ok()?;
            Some((
                u32::try_from(stat.pid).ok()?,
                u32::try_from(stat.ppid).ok()?,
                stat.comm,
            ))
        })
        .collect()
}

/// A `kB` field of /proc/PID/status, in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    session::proc_status_kib(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        field,
    )
}

/// Busy and total clock ticks of one CPU (busy = all but idle and iowait).
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

impl From<&CpuTime> for CpuTimes {
    fn from(time: &CpuTime) -> CpuTimes {
        // user nice system idle iowait irq softirq steal guest guest_nice; guest time is
        // already inside user, so only the first eight count.
        let idle = time.idle + time.iowait.unwrap_or(0);
        let total = time.user
            + time.nice
            + time.system
            + idle
            + time.irq.unwrap_or(0)
            + time.softirq.unwrap_or(0)
            + time.steal.unwrap_or(0);
        CpuTimes {
            busy: total - idle,
            total,
        }
    }
}

pub fn cpu_times(cpu: usize) -> Option<CpuTimes> {
    let stats = KernelStats::current().ok()?;
    stats.cpu_time.get(cpu).map(CpuTimes::from)
}

#[cfg(test)]
mod tests {
    use procfs::{ExplicitSystemInfo, FromRead as _, FromReadSI as _};

    use super::*;

    /// A /proc/PID/stat line of a 6.x kernel: utime 250, stime 75.
    const STAT: &str = "4242 (tokio (worker)) S 17 4242 4242 0 -1 4194560 500 0 0 0 250 75 0 0 \
                        20 0 3 0 100 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 \
                        0 0 0 0 0 0 0 0 0 0 0";

    #[test]
    fn process_cpu_from_stat_with_a_spaced_name() {
        let stat = Stat::from_read(STAT.as_bytes()).unwrap();
        assert_eq!(stat_cpu_seconds(&stat, 100), 3.25);
        assert_eq!(stat_cpu_seconds(&stat, 1000), 0.325);
        assert_eq!(stat.comm, "tokio (worker)");
        assert_eq!(stat.ppid, 17);
        assert!(Stat::from_read("garbage".as_bytes()).is_err());
        assert!(cpu_seconds(std::process::id()).is_some());
    }

    #[test]
    fn a_tree_counts_every_descendant_and_the_reaped_children() {
        let entry = |pid, ppid, own_ticks, reaped_children_ticks| TreeEntry {
            pid,
            ppid,
            own_ticks,
            reaped_children_ticks,
        };
        // A master (10) with two workers, one of them with a helper; a stranger (40) whose
        // parent is the master's parent.
        let entries = [
            entry(1, 0, 1000, 0),
            entry(10, 1, 5, 7),
            entry(11, 10, 100, 3),
            entry(12, 10, 200, 0),
            entry(13, 12, 30, 0),
            entry(40, 1, 999, 0),
        ];
        assert_eq!(tree_ticks(10, &entries), Some(5 + 7 + 100 + 3 + 200 + 30));
        assert_eq!(tree_ticks(12, &entries), Some(230));
        assert_eq!(tree_ticks(99, &entries), None);
    }

    #[test]
    fn a_live_tree_counts_its_busy_children() {
        // A shell whose two subshells spin (no forks: shell arithmetic): the tree's CPU is
        // theirs, the shell's own next to nothing. Its own process group, ended as one.
        use std::os::unix::process::CommandExt as _;
        let mut shell = std::process::Command::new("sh")
            .args([
                "-c",
                "spin() { i=0; while :; do i=$((i + 1)); done; }; spin & spin & sleep 30",
            ])
            .process_group(0)
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let (own, tree) = (cpu_seconds(shell.id()), tree_cpu_seconds(shell.id()));
        let group = rustix::process::Pid::from_raw(shell.id() as i32).unwrap();
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = shell.wait();
        let (own, tree) = (own.unwrap(), tree.unwrap());
        assert!(own < 0.2, "the shell itself only waits: {own} s");
        assert!(
            tree >= own + 0.3,
            "its spinning children count: {tree} s (own {own} s)"
        );
    }

    #[test]
    fn name_and_parent_of_every_process() {
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let me = (
            std::process::id(),
            std::os::unix::process::parent_id(),
            comm.trim().to_owned(),
        );
        assert!(comm_ppid_all().contains(&me));
    }

    fn kernel_stats(cpus: &str) -> KernelStats {
        let text = format!("cpu  1 2 3 4 5 6 7 8 9 10\n{cpus}ctxt 1\nbtime 1\nprocesses 1\n");
        let system = ExplicitSystemInfo {
            boot_time_secs: 0,
            ticks_per_second: 100,
            page_size: 4096,
            is_little_endian: true,
        };
        KernelStats::from_read(text.as_bytes(), &system).unwrap()
    }

    #[test]
    fn cpu_busy_share() {
        let before = kernel_stats("cpu0 100 0 50 800 50 0 0 0 0 0\ncpu1 1 1 1 1\n");
        let after = kernel_stats("cpu0 200 0 100 1000 50 0 0 0 0 0\n");
        let (a, b) = (
            CpuTimes::from(&before.cpu_time[0]),
            CpuTimes::from(&after.cpu_time[0]),
        );
        assert_eq!(
            a,
            CpuTimes {
                busy: 150,
                total: 1000
            }
        );
        assert!((a.busy_share_until(&b) - 150.0 / 350.0).abs() < 1e-12);
        assert_eq!(
            CpuTimes::from(&before.cpu_time[1]),
            CpuTimes { busy: 3, total: 4 }
        );
        assert_eq!(before.cpu_time.get(2).map(CpuTimes::from), None);
        assert!(cpu_times(0).is_some());
    }
}
