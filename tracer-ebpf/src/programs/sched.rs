//! Scheduler tracepoints (classic, field offsets checked against tracefs at attach time):
//! switch-out/in and wakeups of the target's threads, and forks and exits that keep `TIDS`.

use aya_ebpf::{bindings::BPF_F_USER_STACK, macros::tracepoint, programs::TracePointContext};
use tracer_ebpf::{
    abi::kind,
    tracepoints::{
        FORK_CHILD_PID, FORK_CHILD_PID_FIXED_COMM, Field, SWITCH_NEXT_PID, SWITCH_PREV_STATE,
        TASK_REPORT_MAX, WAKEUP_PID,
    },
};

use super::{
    maps::{
        TIDS, add_target_tid, config, current, current_target_tid, emit, field, is_target_tid, now,
        stack_id,
    },
    syscalls::IN_FLIGHT,
};

/// A task switched out with none of the sleep-state bits (below TASK_REPORT_MAX) set was still
/// runnable: preempted ("R+") or yielded ("R").
const TASK_STATE_MASK: i64 = TASK_REPORT_MAX - 1;

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    let ts = now();
    // The tracepoint runs in prev's context, so `current` is prev.
    let (tgid, prev_tid) = current();
    if tgid == config.tgid {
        let prev_state: i64 = field(&ctx, SWITCH_PREV_STATE);
        let runnable = u16::from(prev_state & TASK_STATE_MASK == 0);
        let (kernel_stack, user_stack) = if config.offcpu_stacks == 1 {
            (
                stack_id(&ctx, 0),
                stack_id(&ctx, u64::from(BPF_F_USER_STACK)),
            )
        } else {
            (-1i64 as u64, -1i64 as u64)
        };
        if !is_target_tid(prev_tid) {
            add_target_tid(prev_tid);
        }
        emit(
            ts,
            prev_tid,
            kind::SWITCH_OUT,
            runnable,
            [kernel_stack, user_stack, 0],
        );
    }
    let next_tid = field::<i32>(&ctx, SWITCH_NEXT_PID) as u32;
    if next_tid != 0 && is_target_tid(next_tid) {
        emit(ts, next_tid, kind::SWITCH_IN, 0, [0; 3]);
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
    let _ = TIDS.remove(tid);
    let _ = IN_FLIGHT.remove(tid);
    0
}
