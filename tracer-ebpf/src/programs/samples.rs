//! perf_event cpu-clock samples (attached per CPU, all processes) filtered to the target.

use aya_ebpf::{bindings::BPF_F_USER_STACK, macros::perf_event, programs::PerfEventContext};
use tracer_ebpf::abi::kind;

use super::maps::{current_target_tid, emit, now, stack_id};

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    let Some(tid) = current_target_tid() else {
        return 0;
    };
    let kernel_stack = stack_id(&ctx, 0);
    let user_stack = stack_id(&ctx, u64::from(BPF_F_USER_STACK));
    emit(now(), tid, kind::SAMPLE, 0, [kernel_stack, user_stack, 0]);
    0
}
