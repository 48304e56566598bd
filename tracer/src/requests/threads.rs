//! Per-thread run-state history, and the thread-state split of an interval.
//!
//! Each thread keeps its recent `SWITCH_OUT` / `WAKEUP` / `SWITCH_IN` events. An in-context
//! event (site, syscall, socket, sample) proves the thread was on CPU; it is only recorded when
//! the history says otherwise (a lost switch-in), as a [`SchedEv::Proof`].
//!
//! States: on CPU; preempted (switched out runnable) until switched in; blocked (switched out
//! not runnable) until woken; then runnable until switched in. A wakeup of a thread that is on
//! CPU or already runnable changes nothing.

use std::collections::{HashMap, VecDeque};

use tracer_ebpf::abi::{Event, kind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SchedEv {
    Out {
        preempted: bool,
        kernel_stack: i64,
        user_stack: i64,
    },
    Wakeup,
    In,
    Proof,
}

impl SchedEv {
    /// The scheduler event a SWITCH_OUT, SWITCH_IN or WAKEUP record says; `None` for others.
    pub(crate) fn of(ev: &Event) -> Option<SchedEv> {
        match ev.kind {
            kind::SWITCH_OUT => Some(SchedEv::Out {
                preempted: ev.sub == 1,
                kernel_stack: ev.args[0] as i64,
                user_stack: ev.args[1] as i64,
            }),
            kind::SWITCH_IN => Some(SchedEv::In),
            kind::WAKEUP => Some(SchedEv::Wakeup),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunState {
    OnCpu,
    Preempted,
    Blocked,
    /// Woken after blocking, waiting in the run queue.
    Runnable,
}

/// One run-state segment of a split; `stacks` are those of the switch-out that began it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seg {
    pub start: u64,
    pub end: u64,
    pub state: RunState,
    pub stacks: Option<(i64, i64)>,
}

#[derive(Default)]
struct History {
    evs: VecDeque<(u64, SchedEv)>,
    on_cpu: bool,
    /// The state after the newest event, and since when; None until a switch is seen.
    now: Option<(RunState, u64)>,
}

#[derive(Default)]
pub(crate) struct Threads {
    map: HashMap<u32, History>,
    /// History before this was dropped, for every thread.
    pruned_upto: u64,
}

fn step(
    state: RunState,
    stacks: Option<(i64, i64)>,
    ev: SchedEv,
) -> (RunState, Option<(i64, i64)>) {
    match ev {
        SchedEv::Out {
            preempted: true,
            kernel_stack,
            user_stack,
        } => (RunState::Preempted, Some((kernel_stack, user_stack))),
        SchedEv::Out {
            preempted: false,
            kernel_stack,
            user_stack,
        } => (RunState::Blocked, Some((kernel_stack, user_stack))),
        SchedEv::Wakeup if state == RunState::Blocked => (RunState::Runnable, stacks),
        SchedEv::Wakeup => (state, stacks),
        SchedEv::In | SchedEv::Proof => (RunState::OnCpu, None),
    }
}

impl Threads {
    /// Records a switch or wakeup. Returns the run-queue delay it ended, if it switched in a
    /// thread that was preempted (`true`) or woken (`false`), for the kernel cross-check.
    pub(crate) fn sched(&mut self, ts: u64, tid: u32, ev: SchedEv) -> Option<(u64, bool)> {
        let h = self.map.entry(tid).or_default();
        h.on_cpu =
            matches!(ev, SchedEv::In | SchedEv::Proof) || (h.on_cpu && ev == SchedEv::Wakeup);
        h.evs.push_back((ts, ev));
        let before = h.now;
        let known = match (before, ev) {
            (Some((state, _)), _) => Some(state),
            (None, SchedEv::Wakeup) => None,
            (None, _) => Some(RunState::OnCpu),
        };
        if let Some(state) = known {
            let (next, _) = step(state, None, ev);
            if before.is_none_or(|(s, _)| s != next) {
                h.now = Some((next, ts));
            }
        }
        match (ev, before) {
            (SchedEv::In, Some((RunState::Preempted, since))) => Some((ts - since, true)),
            (SchedEv::In, Some((RunState::Runnable, since))) => Some((ts - since, false)),
            _ => None,
        }
    }

    /// `tid` ran an in-context event at `ts`.
    pub(crate) fn on_cpu(&mut self, ts: u64, tid: u32) {
        let h = self.map.entry(tid).or_default();
        if !h.on_cpu {
            h.on_cpu = true;
            h.evs.push_back((ts, SchedEv::Proof));
            h.now = Some((RunState::OnCpu, ts));
        }
    }

    /// Split `[a, b)` of `tid` into run-state segments. `a_on_cpu`: an in-context event of `tid`
    /// happened at `a`, so the state there is known; otherwise it is replayed from history.
    pub(crate) fn split(
        &self,
        tid: u32,
        a: u64,
        b: u64,
        a_on_cpu: bool,
    ) -> Result<Vec<Seg>, &'static str> {
        let mut segs = Vec::new();
        if a >= b {
            return Ok(segs);
        }
        if a < self.pruned_upto {
            return Err("thread history pruned");
        }
        let Some(h) = self.map.get(&tid) else {
            // Nothing was ever recorded for the thread: it never left the CPU that we saw.
            if a_on_cpu {
                segs.push(Seg {
                    start: a,
                    end: b,
                    state: RunState::OnCpu,
                    stacks: None,
                });
                return Ok(segs);
            }
            return Err("thread state unknown");
        };
        let first_inside = h.evs.partition_point(|&(t, _)| t <= a);
        let (mut state, mut stacks) = if a_on_cpu {
            (RunState::OnCpu, None)
        } else {
            // Replay the tail of the history up to `a` from its last switch event.
            let last_switch = h
                .evs
                .range(..first_inside)
                .rposition(|(_, e)| *e != SchedEv::Wakeup);
            let Some(from) = last_switch else {
                return Err("thread state unknown");
            };
            h.evs
                .range(from..first_inside)
                .fold((RunState::OnCpu, None), |(s, st), &(_, e)| step(s, st, e))
        };
        let mut start = a;
        for &(t, ev) in h.evs.range(first_inside..) {
            if t >= b {
                break;
            }
            let (next, next_stacks) = step(state, stacks, ev);
            if next != state {
                if t > start {
                    segs.push(Seg {
                        start,
                        end: t,
                        state,
                        stacks,
                    });
                }
                start = t;
            }
            state = next;
            stacks = next_stacks;
        }
        segs.push(Seg {
            start,
            end: b,
            state,
            stacks,
        });
        Ok(segs)
    }

    pub(crate) fn prune(&mut self, horizon: u64) {
        self.pruned_upto = self.pruned_upto.max(horizon);
        self.map.retain(|_, h| {
            while h.evs.front().is_some_and(|&(t, _)| t < horizon) {
                h.evs.pop_front();
            }
            // A thread with no history left and on CPU answers every split like a fresh one.
            !(h.evs.is_empty() && h.on_cpu)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(preempted: bool) -> SchedEv {
        SchedEv::Out {
            preempted,
            kernel_stack: 1,
            user_stack: 2,
        }
    }

    #[test]
    fn preempted_then_blocked_with_run_queue_delay() {
        let mut t = Threads::default();
        t.sched(110, 5, out(true));
        t.sched(130, 5, SchedEv::In);
        t.sched(150, 5, out(false));
        t.sched(170, 5, SchedEv::Wakeup);
        t.sched(180, 5, SchedEv::In);
        let segs = t.split(5, 100, 200, true).unwrap();
        let states: Vec<_> = segs.iter().map(|s| (s.start, s.end, s.state)).collect();
        assert_eq!(
            states,
            vec![
                (100, 110, RunState::OnCpu),
                (110, 130, RunState::Preempted),
                (130, 150, RunState::OnCpu),
                (150, 170, RunState::Blocked),
                (170, 180, RunState::Runnable),
                (180, 200, RunState::OnCpu),
            ]
        );
        assert_eq!(segs[3].stacks, Some((1, 2)));
        assert_eq!(segs[4].stacks, Some((1, 2)));
    }

    #[test]
    fn state_replayed_when_start_is_not_in_context() {
        let mut t = Threads::default();
        t.sched(50, 5, out(false));
        t.sched(60, 5, SchedEv::Wakeup);
        t.sched(90, 5, SchedEv::In);
        let segs = t.split(5, 70, 100, false).unwrap();
        assert_eq!(segs[0].state, RunState::Runnable);
        assert_eq!((segs[1].start, segs[1].state), (90, RunState::OnCpu));
    }

    #[test]
    fn proof_restores_on_cpu_after_a_lost_switch_in() {
        let mut t = Threads::default();
        t.sched(50, 5, out(true));
        t.on_cpu(80, 5);
        let segs = t.split(5, 60, 100, false).unwrap();
        assert_eq!(segs.len(), 2);
        assert_eq!((segs[1].start, segs[1].state), (80, RunState::OnCpu));
    }

    #[test]
    fn run_queue_delays_after_preemption_and_wakeup() {
        let mut t = Threads::default();
        assert_eq!(
            t.sched(10, 5, SchedEv::Wakeup),
            None,
            "state unknown: nothing"
        );
        assert_eq!(t.sched(20, 5, SchedEv::In), None, "state unknown before");
        assert_eq!(t.sched(25, 5, SchedEv::Wakeup), None, "on CPU: nothing");
        assert_eq!(t.sched(30, 5, out(true)), None);
        assert_eq!(t.sched(45, 5, SchedEv::In), Some((15, true)));
        assert_eq!(t.sched(50, 5, out(false)), None);
        assert_eq!(t.sched(60, 5, SchedEv::Wakeup), None);
        assert_eq!(
            t.sched(65, 5, SchedEv::Wakeup),
            None,
            "already runnable: keeps 60"
        );
        assert_eq!(t.sched(90, 5, SchedEv::In), Some((30, false)));
        t.sched(100, 5, out(true));
        t.on_cpu(110, 5); // the switch-in was lost: no delay is invented
        assert_eq!(t.sched(120, 5, SchedEv::In), None);
    }

    #[test]
    fn pruned_history_is_an_error() {
        let mut t = Threads::default();
        t.sched(50, 5, out(true));
        t.prune(60);
        assert_eq!(t.split(5, 55, 100, true), Err("thread history pruned"));
    }
}
