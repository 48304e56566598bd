//! Scheduler hooks: switch-out/in and wakeups of the target's threads, and forks and exits
//! that keep `TIDS`. Two variants of each, of which user space attaches one
//! (`attach/detect.rs`):
//!
//! - raw tracepoints (`raw_*`), which get the tracepoint's arguments (`task_struct`
//!   pointers, read at offsets from the kernel's BTF in `Config::offsets`). Each program has its
//!   own recursion guard, so a wakeup from an interrupt that lands while another of our
//!   programs runs on the CPU is still seen;
//! - classic tracepoints (field offsets checked against tracefs at attach time), where there
//!   is no BTF to take offsets from. They share the per-CPU `bpf_prog_active` with the syscall,
//!   socket and sample programs: the kernel skips such a wakeup and only counts it in the
//!   program's `recursion_misses`.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_F_USER_STACK,
    helpers::bpf_get_smp_processor_id,
    macros::{map, raw_tracepoint, tracepoint},
    maps::LruHashMap,
    programs::{RawTracePointContext, TracePointContext},
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
        STACK_SLOT_SWITCH, TGIDS, TIDS, add_target_tgid, add_target_tid, config, current, emit,
        field, is_target_tgid, is_target_tid, now, read_kernel, stack_id, tgids_changed,
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

/// What the common switch code asks of a variant. Prev's state and next's name are asked only
/// at the target's switch-outs, so the raw variant reads them from memory only then.
trait Switch {
    type Ctx: EbpfContext;
    fn ctx(&self) -> &Self::Ctx;
    /// The task switched in (`next_pid`); 0 is the idle task.
    fn next_tid(&self) -> u32;
    /// Prev was still runnable: preempted ("R+") or yielded ("R").
    fn runnable(&self) -> bool;
    /// Prev switched out for the last time ("X" EXIT_DEAD, "Z" EXIT_ZOMBIE).
    fn exiting(&self) -> bool;
    /// Next's comm, as two u64s.
    fn next_comm(&self) -> [u64; 2];
}

/// A task switched out with none of the sleep-state bits (below TASK_REPORT_MAX) set was still
/// runnable: preempted ("R+") or yielded ("R").
const TASK_STATE_MASK: i64 = TASK_REPORT_MAX - 1;

/// The classic record: `prev_state` is already the reported state (`__trace_sched_switch_state`).
impl Switch for TracePointContext {
    type Ctx = TracePointContext;
    #[inline(always)]
    fn ctx(&self) -> &TracePointContext {
        self
    }
    #[inline(always)]
    fn next_tid(&self) -> u32 {
        field::<i32>(self, SWITCH_NEXT_PID) as u32
    }
    #[inline(always)]
    fn runnable(&self) -> bool {
        field::<i64>(self, SWITCH_PREV_STATE) & TASK_STATE_MASK == 0
    }
    #[inline(always)]
    fn exiting(&self) -> bool {
        field::<i64>(self, SWITCH_PREV_STATE) & (EXIT_DEAD | EXIT_ZOMBIE) != 0
    }
    #[inline(always)]
    fn next_comm(&self) -> [u64; 2] {
        let high = Field {
            offset: SWITCH_NEXT_COMM.offset + 8,
            ..SWITCH_NEXT_COMM
        };
        [field(self, SWITCH_NEXT_COMM), field(self, high)]
    }
}

/// The raw arguments `(bool preempt, task_struct *prev, task_struct *next, unsigned int
/// prev_state)`, `prev_state` being prev's `__state` as `__schedule` read it. The classic
/// record's state is derived from the same three things, the same way: preempted, or else
/// `__state | exit_state` (nothing set: runnable; EXIT_DEAD or EXIT_ZOMBIE: exiting).
struct RawSwitch<'a> {
    ctx: RawTracePointContext,
    config: &'a Config,
}

impl RawSwitch<'_> {
    #[inline(always)]
    fn preempt(&self) -> bool {
        self.ctx.arg::<u64>(0) & 0xff != 0
    }
    #[inline(always)]
    fn exit_state(&self) -> i64 {
        let prev: u64 = self.ctx.arg(1);
        i64::from(read_kernel::<i32>(
            prev,
            self.config.offsets.task_exit_state,
        ))
    }
}

impl Switch for RawSwitch<'_> {
    type Ctx = RawTracePointContext;
    #[inline(always)]
    fn ctx(&self) -> &RawTracePointContext {
        &self.ctx
    }
    #[inline(always)]
    fn next_tid(&self) -> u32 {
        read_kernel::<i32>(self.ctx.arg(2), self.config.offsets.task_pid) as u32
    }
    #[inline(always)]
    fn runnable(&self) -> bool {
        self.preempt() || (self.ctx.arg::<u64>(3) as u32 == 0 && self.exit_state() == 0)
    }
    #[inline(always)]
    fn exiting(&self) -> bool {
        !self.preempt() && self.exit_state() & (EXIT_DEAD | EXIT_ZOMBIE) != 0
    }
    #[inline(always)]
    fn next_comm(&self) -> [u64; 2] {
        read_kernel(self.ctx.arg(2), self.config.offsets.task_comm)
    }
}

/// Sends the name of `pid`, a task outside the target, the first time it takes a target
/// thread's CPU.
#[inline(always)]
fn name_once(args: &impl Switch, ts: u64, pid: u32) {
    // SAFETY: the value is a plain u8 and is only read, not kept.
    if unsafe { NAMED.get(pid) }.is_some() {
        return;
    }
    let _ = NAMED.insert(pid, 1, 0);
    let [low, high] = args.next_comm();
    emit(ts, pid, kind::TASK_NAME, 0, [low, high, 0]);
}

#[inline(always)]
fn switch(config: &Config, args: &impl Switch) -> u32 {
    // Most switches on the machine are not the target's: the clock is read only for ours.
    let mut ts = 0;
    // The tracepoint runs in prev's context, so `current` is prev.
    let (tgid, prev_tid) = current();
    let next_tid = args.next_tid();
    let next_is_target = next_tid != 0 && is_target_tid(next_tid);
    if is_target_tgid(config, tgid) {
        ts = now();
        let runnable = u16::from(args.runnable());
        let (kernel_stack, user_stack) = if config.flags & Config::OFFCPU_STACKS != 0 {
            (
                stack_id(args.ctx(), STACK_SLOT_SWITCH, 0),
                stack_id(args.ctx(), STACK_SLOT_SWITCH, u64::from(BPF_F_USER_STACK)),
            )
        } else {
            (-1i64 as u64, -1i64 as u64)
        };
        // A dying thread switches out after sched_process_exit removed it: for the last time
        // (prev_state X or Z), or preempted on its way there. Adding it back would leak its
        // TIDS entry, and a reused tid would then pass as the target's.
        if !is_target_tid(prev_tid)
            && !args.exiting()
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
            name_once(args, ts, next_tid);
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

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    match config() {
        Some(config) => switch(config, &ctx),
        None => 0,
    }
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn raw_sched_switch(ctx: RawTracePointContext) -> u32 {
    match config() {
        Some(config) => switch(config, &RawSwitch { ctx, config }),
        None => 0,
    }
}

#[inline(always)]
fn wakeup(tid: u32, new: u16) -> u32 {
    if is_target_tid(tid) {
        emit(now(), tid, kind::WAKEUP, new, [0; 3]);
    }
    0
}

/// The tid of the `task_struct *` that is raw argument `n`.
#[inline(always)]
fn task_arg_tid(ctx: &RawTracePointContext, config: &Config, n: usize) -> u32 {
    read_kernel::<i32>(ctx.arg(n), config.offsets.task_pid) as u32
}

#[tracepoint]
pub fn sched_wakeup(ctx: TracePointContext) -> u32 {
    if config().is_none() {
        return 0;
    }
    wakeup(field::<i32>(&ctx, WAKEUP_PID) as u32, 0)
}

#[tracepoint]
pub fn sched_wakeup_new(ctx: TracePointContext) -> u32 {
    if config().is_none() {
        return 0;
    }
    wakeup(field::<i32>(&ctx, WAKEUP_PID) as u32, 1)
}

/// `(struct task_struct *p)`.
#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn raw_sched_wakeup(ctx: RawTracePointContext) -> u32 {
    match config() {
        Some(config) => wakeup(task_arg_tid(&ctx, config, 0), 0),
        None => 0,
    }
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn raw_sched_wakeup_new(ctx: RawTracePointContext) -> u32 {
    match config() {
        Some(config) => wakeup(task_arg_tid(&ctx, config, 0), 1),
        None => 0,
    }
}

/// Runs in the parent's context; `child` is asked only for the target's forks, and gives the
/// child's pid and, where the variant can read it, its tgid.
#[inline(always)]
fn fork(child: impl FnOnce(&Config) -> (u32, Option<u32>)) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    let parent = current().0;
    if !is_target_tgid(config, parent) {
        return 0;
    }
    let (child, child_tgid) = child(config);
    let _ = EXITED.remove(child);
    add_target_tid(child);
    if config.flags & Config::KERNEL_ONLY != 0 {
        // A new process (not a thread) of a target process is a target too.
        let maybe_thread = match child_tgid {
            Some(tgid) if tgid != child => return 0, // a thread: TIDS is enough
            Some(_) => 0,
            None => 1,
        };
        add_target_tgid(child);
        emit(
            now(),
            child,
            kind::PROCESS,
            0,
            [u64::from(parent), maybe_thread, 0],
        );
    }
    0
}

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    fork(|_| (field::<i32>(&ctx, FORK_CHILD_PID) as u32, None))
}

/// The same on kernels whose fork record has inline comms (the field is further on).
#[tracepoint]
pub fn sched_process_fork_fixed_comm(ctx: TracePointContext) -> u32 {
    fork(|_| (field::<i32>(&ctx, FORK_CHILD_PID_FIXED_COMM) as u32, None))
}

/// `(struct task_struct *parent, struct task_struct *child)`. The child's tgid is read only in
/// kernel-only mode (exact mode keeps its one read).
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn raw_sched_process_fork(ctx: RawTracePointContext) -> u32 {
    fork(|config| {
        let pid = task_arg_tid(&ctx, config, 1);
        let tgid = if config.flags & Config::KERNEL_ONLY != 0 {
            Some(read_kernel::<i32>(ctx.arg(1), config.offsets.task_tgid) as u32)
        } else {
            None
        };
        (pid, tgid)
    })
}

/// A thread of the target exits: forget it, so TIDS and IN_FLIGHT hold live threads only. In
/// kernel-only mode, a target process's main thread (tid == tgid) takes the process out of
/// TGIDS, said with PROCESS sub 1; its other threads, should they exit after it (exit_group
/// kills them in no set order), are still known by TIDS and forgotten too. (A process whose
/// main thread exits long before the others, `pthread_exit` from main, stops being traced
/// then; the proxies do not do that.)
#[inline(always)]
fn exit() -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    let (tgid, tid) = current();
    let kernel_only = config.flags & Config::KERNEL_ONLY != 0;
    if !is_target_tgid(config, tgid) && !(kernel_only && is_target_tid(tid)) {
        return 0;
    }
    let _ = EXITED.insert(tid, 1, 0);
    let _ = TIDS.remove(tid);
    let _ = IN_FLIGHT.remove(tid);
    if kernel_only {
        if tid == tgid {
            if TGIDS.remove(tgid).is_ok() {
                tgids_changed();
                emit(now(), tid, kind::PROCESS, 1, [0; 3]);
            }
        } else if TGIDS.remove(tid).is_ok() {
            // A thread the classic fork program put in TGIDS not knowing it was one.
            tgids_changed();
        }
    }
    0
}

#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    exit()
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn raw_sched_process_exit(_ctx: RawTracePointContext) -> u32 {
    exit()
}
