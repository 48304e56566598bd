//! Who ran on each CPU, from the switches of the target's threads: a target thread from its
//! switch-in until its switch-out, then the task that replaced it (`next_pid`, or idle) until
//! a target thread is switched in again on that CPU. A task that came and went in between
//! without touching a target thread is not seen: the span goes to the first one.
//!
//! Also where each target thread was switched in or out (its CPU over time), and the names of
//! tasks outside the target (`TASK_NAME`).

use std::collections::{HashMap, VecDeque};

/// What held a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Runner {
    /// A thread of the target.
    Target(u32),
    /// A task outside the target (a pid as sched_switch names it: a thread id).
    Other(u32),
    Idle,
}

#[derive(Default)]
pub(crate) struct CpuLog {
    /// Per CPU, `(since, runner)` in time order.
    cpus: HashMap<u32, VecDeque<(u64, Runner)>>,
    /// Per target thread, `(ts, cpu)` of its switches.
    threads: HashMap<u32, VecDeque<(u64, u32)>>,
    names: HashMap<u32, String>,
}

impl CpuLog {
    pub(crate) fn switch_out(&mut self, ts: u64, tid: u32, next_pid: u32, cpu: u32) {
        let runner = if next_pid == 0 {
            Runner::Idle
        } else {
            Runner::Other(next_pid)
        };
        self.cpus.entry(cpu).or_default().push_back((ts, runner));
        self.threads.entry(tid).or_default().push_back((ts, cpu));
    }

    /// A target thread switched in: it replaces whatever the switch-out at the same ts said.
    pub(crate) fn switch_in(&mut self, ts: u64, tid: u32, cpu: u32) {
        self.cpus
            .entry(cpu)
            .or_default()
            .push_back((ts, Runner::Target(tid)));
        self.threads.entry(tid).or_default().push_back((ts, cpu));
    }

    pub(crate) fn task_name(&mut self, pid: u32, comm: [u64; 2]) {
        let bytes: Vec<u8> = comm
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .take_while(|&b| b != 0)
            .collect();
        self.names
            .insert(pid, String::from_utf8_lossy(&bytes).into_owned());
    }

    pub(crate) fn names(&self) -> &HashMap<u32, String> {
        &self.names
    }

    /// The CPU `tid` waited for or ran on around `[a, b)`: that of its first switch inside,
    /// else its last one before.
    pub(crate) fn cpu_of(&self, tid: u32, a: u64, b: u64) -> Option<u32> {
        let log = self.threads.get(&tid)?;
        let i = log.partition_point(|&(t, _)| t < a);
        match log.get(i) {
            Some(&(t, cpu)) if t < b => Some(cpu),
            _ => i
                .checked_sub(1)
                .map(|j| log[j].1)
                .or_else(|| log.get(i).map(|e| e.1)),
        }
    }

    /// `[a, b)` on `cpu` cut by runner; `None` where nothing is known yet.
    pub(crate) fn runners(&self, cpu: u32, a: u64, b: u64) -> Vec<(u64, u64, Option<Runner>)> {
        let mut out = Vec::new();
        if a >= b {
            return out;
        }
        let Some(log) = self.cpus.get(&cpu) else {
            out.push((a, b, None));
            return out;
        };
        let first_inside = log.partition_point(|&(t, _)| t <= a);
        let mut current = first_inside.checked_sub(1).map(|i| log[i].1);
        let mut start = a;
        for &(t, runner) in log.range(first_inside..) {
            if t >= b {
                break;
            }
            if Some(runner) != current {
                if t > start {
                    out.push((start, t, current));
                }
                start = t;
                current = Some(runner);
            }
        }
        out.push((start, b, current));
        out
    }

    pub(crate) fn prune(&mut self, horizon: u64) {
        self.cpus
            .values_mut()
            .for_each(|log| keep_last_before(log, horizon));
        self.threads
            .values_mut()
            .for_each(|log| keep_last_before(log, horizon));
    }
}

/// Drops entries before `horizon` but the last one, which says what held from then on.
pub(crate) fn keep_last_before<T>(log: &mut VecDeque<(u64, T)>, horizon: u64) {
    while log.len() > 1 && log[1].0 < horizon {
        log.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runners_follow_switches_and_the_target_wins_a_tie() {
        let mut log = CpuLog::default();
        log.switch_in(10, 5, 0);
        log.switch_out(20, 5, 900, 0);
        log.switch_out(40, 6, 7, 0); // 6 was not seen switching in: still counts from 40
        log.switch_in(40, 7, 0);
        log.switch_out(50, 7, 0, 0);
        let got = log.runners(0, 15, 60);
        assert_eq!(
            got,
            vec![
                (15, 20, Some(Runner::Target(5))),
                (20, 40, Some(Runner::Other(900))),
                (40, 50, Some(Runner::Target(7))),
                (50, 60, Some(Runner::Idle)),
            ]
        );
        assert_eq!(log.runners(1, 15, 60), vec![(15, 60, None)]);
        assert_eq!(log.runners(0, 0, 12)[0], (0, 10, None));
    }

    #[test]
    fn a_thread_cpu_is_its_next_switch_inside_else_its_last() {
        let mut log = CpuLog::default();
        log.switch_in(10, 5, 1);
        log.switch_out(20, 5, 0, 1);
        log.switch_in(30, 5, 0);
        assert_eq!(log.cpu_of(5, 25, 35), Some(0));
        assert_eq!(log.cpu_of(5, 12, 18), Some(1));
        assert_eq!(
            log.cpu_of(5, 0, 5),
            Some(1),
            "nothing before: the first after"
        );
        assert_eq!(log.cpu_of(9, 0, 50), None);
    }

    #[test]
    fn names_are_nul_trimmed() {
        let mut log = CpuLog::default();
        let mut comm = [0u8; 16];
        comm[..3].copy_from_slice(b"hog");
        let words = [
            u64::from_le_bytes(comm[..8].try_into().unwrap()),
            u64::from_le_bytes(comm[8..].try_into().unwrap()),
        ];
        log.task_name(42, words);
        assert_eq!(log.names()[&42], "hog");
    }
}
