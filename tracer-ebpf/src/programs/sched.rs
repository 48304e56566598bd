//! Scheduler tracepoints (classic, field offsets checked against tracefs at attach time):
//! switch-out/in and wakeups of the target's threads, and forks and exits that keep `TIDS`.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK, helpers::bpf_get_smp_processor_id, macros::map, macros::tracepoint,
    maps::LruHashMap, programs::TracePointContext,
};
use tracer_ebpf::{
    abi::{Config, kind, switch},
    tracepoints::{
        EXIT_DEAD, EXIT_ZOMBIE, FORK_CHILD_PID, FORK_CHILD_PID_FIXED_COMM, Field, SWITCH_NEXT_COMM,
        SWITCH_NEXT_PID, SWITCH_PREV_STATE, TASK_REPORT_MAX, WAKEUP_PID,
    },
};

use super::{
    maps::{
        TIDS, add_target_tid, config, current, current_target_tid, emit, field, is_target_tid, now,
        stack_id,
    },
    syscalls::IN_FLIGHT,
};

/// Pids outside the target whose name was already sent (TASK_NAME), so that a task taking the
/// target's CPU over and over costs one lookup per switch, not one event.
#[map]
static NAMED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(1024, 0);

/// Threads of the target that passed sched_process_exit: a switch-out does not re-add them.
/// A fork that reuses the tid takes it out again. LRU: a thread is gone moments after.
#[map]
static EXITED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(1024, 0);

#[inline(always)]
fn cpu() -> u32 {
    // SAFETY: no preconditions.
    unsafe { bpf_get_smp_processor_id() }
}

/// Sends the name of `pid`, a task outside the target, the first time it takes a target
/// thread's CPU.
#[inline(always)]
fn name_once(ctx: &TracePointContext, ts: u64, pid: u32) {
    // SAFETY: the value is a plain u8 and is only read, not kept.
    if unsafe { NAMED.get(pid) }.is_some() {
        return;
    }
    let _ = NAMED.insert(pid, 1, 0);
    let low: u64 = field(ctx, SWITCH_NEXT_COMM);
    let high: u64 = field(
        ctx,
        Field {
            offset: SWITCH_NEXT_COMM.offset + 8,
            ..SWITCH_NEXT_COMM
        },
    );
    emit(ts, pid, kind::TASK_NAME, 0, [low, high, 0]);
}

/// A task switched out with none of the sleep-state bits (below TASK_REPORT_MAX) set was still
/// runnable: preempted ("R+") or yielded ("R").
const TASK_STATE_MASK: i64 = TASK_REPORT_MAX - 1;

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    // Most switches on the machine are not the target's: the clock is read only for ours.
    let mut ts = 0;
    // The tracepoint runs in prev's context, so `current` is prev.
    let (tgid, prev_tid) = current();
    let next_tid = field::<i32>(&ctx, SWITCH_NEXT_PID) as u32;
    let next_is_target = next_tid != 0 && is_target_tid(next_tid);
    if tgid == config.tgid {
        ts = now();
        let prev_state: i64 = field(&ctx, SWITCH_PREV_STATE);
        let runnable = u16::from(prev_state & TASK_STATE_MASK == 0);
        let (kernel_stack, user_stack) = if config.flags & Config::OFFCPU_STACKS != 0 {
            (
                stack_id(&ctx, 0),
                stack_id(&ctx, u64::from(BPF_F_USER_STACK)),
            )
        } else {
            (-1i64 as u64, -1i64 as u64)
        };
        // A dying thread switches out after sched_process_exit removed it: for the last time
        // (prev_state X or Z), or preempted on its way there. Adding it back would leak its
        // TIDS entry, and a reused tid would then pass as the target's.
        if !is_target_tid(prev_tid)
            && prev_state & (EXIT_DEAD | EXIT_ZOMBIE) == 0
            // SAFETY: only tested for presence.
            && unsafe { EXITED.get(prev_tid) }.is_none()
        {
            add_target_tid(prev_tid);
        }
        // Who took the CPU: the wait-for view charges a waiting request's time to it.
        emit(
            ts,
            prev_tid,
            kind::SWITCH_OUT,
            runnable,
            [kernel_stack, user_stack, switch::pack(next_tid, cpu())],
        );
        if next_tid != 0 && !next_is_target {
            name_once(&ctx, ts, next_tid);
        }
    }
    if next_is_target {
        if ts == 0 {
            ts = now();
        }
        emit(ts, next_tid, kind::SWITCH_IN, 0, [u64::from(cpu()), 0, 0]);
    }
    0
}

#[inline(always)]
fn wakeup(ctx: &TracePointContext, new: u16) -> u32 {
    if config().is_none() {
        return 0;
    }
    let tid = field::<i32>(ctx, WAKEUP_PID) as u32;
    if is_target_tid(tid) {
        emit(now(), tid, kind::WAKEUP, new, [0; 3]);
    }
    0
}

#[tracepoint]
pub fn sched_wakeup(ctx: TracePointContext) -> u32 {
    wakeup(&ctx, 0)
}

#[tracepoint]
pub fn sched_wakeup_new(ctx: TracePointContext) -> u32 {
    wakeup(&ctx, 1)
}

#[inline(always)]
fn fork(ctx: &TracePointContext, child_pid: Field) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    // Runs in the parent's context.
    if current().0 == config.tgid {
        let child = field::<i32>(ctx, child_pid) as u32;
        let _ = EXITED.remove(child);
        add_target_tid(child);
    }
    0
}

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    fork(&ctx, FORK_CHILD_PID)
}

/// The same on kernels whose fork record has inline comms (the field is further on).
#[tracepoint]
pub fn sched_process_fork_fixed_comm(ctx: TracePointContext) -> u32 {
    fork(&ctx, FORK_CHILD_PID_FIXED_COMM)
}

/// A thread of the target exits: forget it, so TIDS and IN_FLIGHT hold live threads only.
#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    let Some(tid) = current_target_tid() else {
        return 0;
    };
    let _ = EXITED.insert(tid, 1, 0);
    let _ = TIDS.remove(tid);
    let _ = IN_FLIGHT.remove(tid);
    0
}
