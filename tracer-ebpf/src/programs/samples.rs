//! perf_event cpu-clock samples (attached per CPU, all processes) filtered to the target.

use aya_ebpf::{bindings::BPF_F_USER_STACK, macros::perf_event, programs::PerfEventContext};
use tracer_ebpf::abi::kind;

use super::maps::{STACK_SLOT_SAMPLE, current_target_tid, emit, now, stack_id};

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    let Some(tid) = current_target_tid() else {
        return 0;
    };
    // A sample in user mode has no kernel frames: the walk would only fail (-EFAULT on an
    // empty stack) and count as a failed stack, at the cost of a walk.
    let kernel_stack = if in_user_mode(&ctx) {
        -1i64 as u64
    } else {
        stack_id(&ctx, STACK_SLOT_SAMPLE, 0)
    };
    let user_stack = stack_id(&ctx, STACK_SLOT_SAMPLE, u64::from(BPF_F_USER_STACK));
    emit(now(), tid, kind::SAMPLE, 0, [kernel_stack, user_stack, 0]);
    0
}

/// Whether the interrupted context was user mode (the low two bits of `cs`: the privilege level).
#[inline(always)]
fn in_user_mode(ctx: &PerfEventContext) -> bool {
    // SAFETY: a perf_event program's context is a live `bpf_perf_event_data`, readable in place.
    let cs = unsafe { (*ctx.ctx).regs.cs };
    cs & 3 == 3
}
