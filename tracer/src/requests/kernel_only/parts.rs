//! The kernel-only split: a proxied exchange's syscalls and its threads' run states → parts
//! (`docs/model.md`, "Kernel-only mode").
//!
//! An exchange is `[arrive, done)`: `arrive` the kernel's data-ready for its first request
//! byte, `done` the enter of the send that completes its response. `[S, A)` is `upstream`: S
//! the enter of its last upstream send, A the data-ready of the upstream response. The two
//! intervals left, `[arrive, S)` and `[A, done)`, are walked from one of the exchange's own
//! syscalls to the next; each gap before a syscall is charged by the state of the thread that
//! makes that syscall:
//! - on CPU: `cpu`, except up to the exit of the last syscall the thread made in the gap for
//!   another exchange, which is `queued` (an event loop serving others first);
//! - preempted or woken and waiting to run: `scheduling`;
//! - blocked: `scheduling` in a lead-in (the data is there and the thread is not yet running),
//!   else `blocked.fsync` while a thread of the target was in fsync or fdatasync, else
//!   `blocked_other` when the same thread made the previous syscall, else `unattributed`: the
//!   work moved between threads (Go's goroutines, a thread pool) and what it waited for there
//!   is invisible to the kernel.
//!
//! The syscalls themselves: on CPU is `cpu`, off CPU as a gap's. A thread whose state is
//! unknown gives `unattributed`, never a guess.

use crate::requests::cover::{Built, Cover, Piece};
use crate::requests::outcome::Part;
use crate::requests::threads::{RunState, Threads};

/// One syscall of an exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Io {
    pub enter: u64,
    pub exit: u64,
    pub tid: u32,
}

/// What the split needs of an exchange.
#[derive(Clone, Debug, Default)]
pub(crate) struct Milestones {
    pub arrive: u64,
    /// S: the enter of the upstream send that completes the request (its last).
    pub upstream_send: u64,
    /// A: the upstream response's arrival.
    pub upstream_reply: u64,
    pub done: u64,
    /// Every syscall of the exchange (client reads, upstream sends and reads, client sends),
    /// in any order.
    pub ios: Vec<Io>,
}

/// What else the split reads: the run states, what each thread did for other exchanges, and
/// when a thread of the target was in fsync.
pub(crate) trait Context {
    fn threads(&self) -> &Threads;
    /// The latest exit in `(from, to]` of a syscall `tid` made for another exchange.
    fn foreign_until(&self, tid: u32, from: u64, to: u64) -> Option<u64>;
    /// The parts of `[from, to)` during which a thread of the target was in fsync.
    fn fsync_spans(&self, from: u64, to: u64) -> Vec<(u64, u64)>;
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Gap {
    /// From an arrival to the first syscall that reads it.
    LeadIn,
    /// After a syscall on `prev` (a thread).
    After { prev: u32 },
}

pub(crate) fn split(m: &Milestones, ctx: &impl Context) -> Result<Built, &'static str> {
    if !(m.arrive <= m.upstream_send
        && m.upstream_send <= m.upstream_reply
        && m.upstream_reply <= m.done)
    {
        return Err("exchange out of order");
    }
    let mut ios = m.ios.clone();
    ios.sort_by_key(|io| (io.enter, io.exit));
    let mut cover = Cover::default();
    interval(&mut cover, ctx, &ios, m.arrive, m.upstream_send)?;
    cover.push(Piece::new(
        m.upstream_send,
        m.upstream_reply,
        Part::Upstream,
        0,
    ));
    interval(&mut cover, ctx, &ios, m.upstream_reply, m.done)?;
    cover.build(m.arrive, m.done)
}

/// `[from, to)`, which ends at the enter of one of the exchange's syscalls. `ios` are sorted by
/// enter; one pass over them, each visited once, so a syscall whose exit reads before its
/// enter (clamped to the arrival) cannot stall the walk.
fn interval(
    cover: &mut Cover,
    ctx: &impl Context,
    ios: &[Io],
    from: u64,
    to: u64,
) -> Result<(), &'static str> {
    if from >= to {
        return Ok(());
    }
    let mut at = from;
    let mut gap = Gap::LeadIn;
    // A syscall in progress at `from` (a blocking read entered before the data came).
    if let Some(io) = ios.iter().find(|io| io.enter < from && io.exit > from) {
        own(cover, ctx, io, from, io.exit.min(to))?;
        at = io.exit.min(to);
        gap = Gap::After { prev: io.tid };
    }
    let mut next = ios.partition_point(|io| io.enter < at);
    while at < to {
        let Some(io) = ios.get(next).filter(|io| io.enter <= to) else {
            return Err("exchange syscalls missing");
        };
        next += 1;
        waiting(cover, ctx, io.tid, at, io.enter.min(to), gap)?;
        if io.enter >= to {
            break;
        }
        own(cover, ctx, io, io.enter, io.exit.min(to))?;
        at = at.max(io.enter).max(io.exit.min(to));
        gap = Gap::After { prev: io.tid };
        // Syscalls that began inside the one just walked are inside it.
        while ios.get(next).is_some_and(|io| io.enter < at) {
            next += 1;
        }
    }
    Ok(())
}

/// `[a, b)` inside one of the exchange's own syscalls.
fn own(cover: &mut Cover, ctx: &impl Context, io: &Io, a: u64, b: u64) -> Result<(), &'static str> {
    if a >= b {
        return Ok(());
    }
    states(cover, ctx, io.tid, a, b, true, |state, s, e| match state {
        RunState::OnCpu => vec![(s, e, Part::OnCpu)],
        RunState::Preempted | RunState::Runnable => vec![(s, e, Part::Scheduling)],
        RunState::Blocked => vec![(s, e, Part::BlockedOther)],
    })
}

/// `[a, b)` before a syscall of `tid`'s for the exchange.
fn waiting(
    cover: &mut Cover,
    ctx: &impl Context,
    tid: u32,
    a: u64,
    b: u64,
    gap: Gap,
) -> Result<(), &'static str> {
    if a >= b {
        return Ok(());
    }
    let queued_until = ctx.foreign_until(tid, a, b).unwrap_or(a);
    let on_cpu_at_a = matches!(gap, Gap::After { prev } if prev == tid);
    states(
        cover,
        ctx,
        tid,
        a,
        b,
        on_cpu_at_a,
        |state, s, e| match state {
            RunState::OnCpu => {
                let cut = queued_until.clamp(s, e);
                vec![(s, cut, Part::Queued), (cut, e, Part::OnCpu)]
            }
            RunState::Preempted | RunState::Runnable => vec![(s, e, Part::Scheduling)],
            RunState::Blocked => match gap {
                Gap::LeadIn => vec![(s, e, Part::Scheduling)],
                Gap::After { prev } => {
                    let rest = if prev == tid {
                        Part::BlockedOther
                    } else {
                        Part::Unattributed
                    };
                    let mut pieces = Vec::new();
                    let mut at = s;
                    for (fs, fe) in ctx.fsync_spans(s, e) {
                        pieces.push((at, fs, rest));
                        pieces.push((fs, fe, Part::BlockedFsync));
                        at = fe;
                    }
                    pieces.push((at, e, rest));
                    pieces
                }
            },
        },
    )
}

/// Splits `[a, b)` of `tid` by run state, and pushes the pieces `part_of` makes of each
/// segment; a thread whose state is unknown there gives one `unattributed` piece.
fn states(
    cover: &mut Cover,
    ctx: &impl Context,
    tid: u32,
    a: u64,
    b: u64,
    a_in_context: bool,
    part_of: impl Fn(RunState, u64, u64) -> Vec<(u64, u64, Part)>,
) -> Result<(), &'static str> {
    let segs = match ctx.threads().split(tid, a, b, a_in_context) {
        Ok(segs) => segs,
        Err("thread history pruned") => return Err("thread history pruned"),
        Err(_) => {
            cover.push(Piece::new(a, b, Part::Unattributed, tid));
            return Ok(());
        }
    };
    for seg in segs {
        let off = match seg.state {
            RunState::OnCpu => None,
            _ => seg.stacks.map(|(k, u)| (tid, k, u)),
        };
        for (s, e, part) in part_of(seg.state, seg.start, seg.end) {
            cover.push(Piece {
                off,
                ..Piece::new(s, e, part, tid)
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::threads::SchedEv;

    #[derive(Default)]
    struct Ctx {
        threads: Threads,
        foreign: Vec<(u32, u64, u64)>,
        fsyncs: Vec<(u64, u64)>,
    }

    impl Context for Ctx {
        fn threads(&self) -> &Threads {
            &self.threads
        }

        fn foreign_until(&self, tid: u32, from: u64, to: u64) -> Option<u64> {
            self.foreign
                .iter()
                .filter(|&&(t, _, exit)| t == tid && exit > from && exit <= to)
                .map(|&(_, _, exit)| exit)
                .max()
        }

        fn fsync_spans(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
            self.fsyncs
                .iter()
                .filter(|&&(s, e)| s < to && e > from)
                .map(|&(s, e)| (s.max(from), e.min(to)))
                .collect()
        }
    }

    fn out(preempted: bool) -> SchedEv {
        SchedEv::Out {
            preempted,
            kernel_stack: -1,
            user_stack: -1,
        }
    }

    fn io(enter: u64, exit: u64, tid: u32) -> Io {
        Io { enter, exit, tid }
    }

    /// The exchange's parts above 0, by name; they sum to its time from arrival to done.
    fn parts(m: &Milestones, ctx: &Ctx) -> Vec<(&'static str, u64)> {
        let built = split(m, ctx).unwrap();
        assert_eq!(built.parts.iter().sum::<u64>(), m.done - m.arrive);
        Part::ALL
            .iter()
            .filter(|p| built.parts[p.index()] > 0)
            .map(|p| (p.name(), built.parts[p.index()]))
            .collect()
    }

    /// nginx-like: one thread reads, sends upstream, reads the reply and answers.
    fn event_loop() -> Milestones {
        Milestones {
            arrive: 100,
            upstream_send: 300,
            upstream_reply: 5_300,
            done: 5_500,
            ios: vec![
                io(150, 180, 1),
                io(300, 320, 1),
                io(5_350, 5_370, 1),
                io(5_500, 5_520, 1),
            ],
        }
    }

    #[test]
    fn an_event_loop_on_cpu_throughout_is_cpu_and_scheduling_before_it_woke() {
        let mut ctx = Ctx::default();
        // Asleep in epoll until 130, on CPU since; again between the send and the reply.
        ctx.threads.sched(50, 1, out(false));
        ctx.threads.sched(110, 1, SchedEv::Wakeup);
        ctx.threads.sched(130, 1, SchedEv::In);
        ctx.threads.sched(330, 1, out(false));
        ctx.threads.sched(5_310, 1, SchedEv::Wakeup);
        ctx.threads.sched(5_320, 1, SchedEv::In);
        assert_eq!(
            parts(&event_loop(), &ctx),
            [("upstream", 5_000), ("scheduling", 50), ("cpu", 350)]
        );
    }

    #[test]
    fn other_requests_work_before_ours_is_queued() {
        let mut ctx = Ctx::default();
        ctx.threads.sched(90, 1, SchedEv::In);
        // Between the reply (5300) and our read (5350), the loop answered another request.
        ctx.foreign.push((1, 5_305, 5_330));
        assert_eq!(
            parts(&event_loop(), &ctx),
            [("upstream", 5_000), ("cpu", 370), ("queued", 30)]
        );
    }

    #[test]
    fn a_receipt_wait_while_another_thread_fsyncs_is_blocked_fsync() {
        let mut ctx = Ctx::default();
        ctx.threads.sched(90, 1, SchedEv::In);
        // After reading the reply (5370) the thread sleeps until 5480; the writer fsyncs
        // 5400..5450.
        ctx.threads.sched(5_380, 1, out(false));
        ctx.threads.sched(5_480, 1, SchedEv::Wakeup);
        ctx.threads.sched(5_490, 1, SchedEv::In);
        ctx.fsyncs.push((5_400, 5_450));
        assert_eq!(
            parts(&event_loop(), &ctx),
            [
                ("upstream", 5_000),
                ("scheduling", 10),
                ("cpu", 290),
                ("blocked.fsync", 50),
                ("blocked_other", 50),
            ]
        );
    }

    #[test]
    fn a_handoff_to_a_sleeping_thread_is_unattributed() {
        let mut ctx = Ctx::default();
        ctx.threads.sched(90, 1, SchedEv::In);
        // Go-like: read on thread 1, the upstream send on thread 2, which slept until 250.
        ctx.threads.sched(10, 2, out(false));
        ctx.threads.sched(250, 2, SchedEv::Wakeup);
        ctx.threads.sched(260, 2, SchedEv::In);
        let mut m = event_loop();
        m.ios[1].tid = 2;
        m.ios[2].tid = 2;
        m.ios[3].tid = 2;
        assert_eq!(
            parts(&m, &ctx),
            [
                ("upstream", 5_000),
                ("scheduling", 10),
                ("cpu", 320),
                ("unattributed", 70),
            ]
        );
    }

    #[test]
    fn a_thread_never_seen_off_cpu_is_on_cpu_and_an_unknown_one_unattributed() {
        let ctx = Ctx::default();
        // No sched event at all: the syscalls prove thread 1 on CPU at each of its
        // gaps after a syscall, but the lead-in is unknown.
        assert_eq!(
            parts(&event_loop(), &ctx),
            [("upstream", 5_000), ("cpu", 300), ("unattributed", 100)]
        );
    }

    /// Issue 31, finding 1: a syscall that exited before the arrival reads, clamped, as
    /// exiting before it entered; the walk never moved past it and the root tracer spun
    /// forever, its session lost.
    #[test]
    fn issue31_finding1_a_clamped_syscall_cannot_hang_the_split() {
        let mut ctx = Ctx::default();
        ctx.threads.sched(90, 1, SchedEv::In);
        let mut m = event_loop();
        m.ios.push(io(5_320, 5_310, 1));
        let built = split(&m, &ctx).unwrap();
        assert_eq!(built.parts.iter().sum::<u64>(), m.done - m.arrive);
    }

    #[test]
    fn out_of_order_milestones_are_refused() {
        let mut m = event_loop();
        m.upstream_reply = 200;
        assert!(split(&m, &Ctx::default()).is_err());
    }
}
