//! Traced syscalls, one enter/exit pair each (raw_syscalls would run on every syscall of the
//! machine), in three variants of which user space attaches one (`attach/detect.rs`): the
//! `syscalls:sys_enter_*` / `sys_exit_*` tracepoints, fentry/fexit on the `__x64_sys_*`
//! wrappers, or kprobe/kretprobe on them. Enter stores (ts, fd) per tid; exit emits one
//! `SYSCALL` event with [enter ts, fd, ret].

use core::mem::offset_of;

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{fentry, fexit, kprobe, kretprobe, map, tracepoint},
    maps::HashMap,
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
};
use tracer_ebpf::{
    abi::{Drops, kind, syscall},
    tracepoints::{SYS_ENTER_FD, SYS_EXIT_RET},
};

use super::maps::{count_drop, current_target_tid, emit, field, now};

/// A syscall in progress on one thread. `id == 0`: none.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct InFlight {
    pub enter_ts_ns: u64,
    pub fd: u64,
    pub id: u16,
}

/// Pruned with TIDS when a thread of the target exits.
#[map]
pub static IN_FLIGHT: HashMap<u32, InFlight> = HashMap::with_max_entries(4096, 0);

/// The syscall `tid` is inside, if it is a traced one.
#[inline(always)]
pub fn in_flight(tid: u32) -> Option<InFlight> {
    // SAFETY: copied out at once.
    let call = unsafe { IN_FLIGHT.get(tid) }.copied()?;
    (call.id != 0).then_some(call)
}

/// Offset of `di` (the first syscall argument) in x86-64's `struct pt_regs`: the
/// `__x64_sys_*` wrappers take the user registers, not the arguments.
const PT_REGS_DI: usize = 112;

/// The fd argument of a syscall, from the user registers a `__x64_sys_*` wrapper was given.
#[inline(always)]
fn fd_from_regs(regs: *const u8) -> Option<u64> {
    // SAFETY: a probe read; a bad pointer fails the read instead of faulting.
    unsafe { bpf_probe_read_kernel(regs.wrapping_add(PT_REGS_DI).cast::<u64>()) }.ok()
}

#[inline(always)]
fn enter(fd: u64, id: u16) -> u32 {
    let Some(tid) = current_target_tid() else {
        return 0;
    };
    let call = InFlight {
        enter_ts_ns: now(),
        fd: u64::from(fd as u32),
        id,
    };
    match IN_FLIGHT.get_ptr_mut(tid) {
        // SAFETY: this thread's own slot; only this thread writes it.
        Some(slot) => unsafe { *slot = call },
        None => {
            if IN_FLIGHT.insert(tid, call, 0).is_err() {
                count_drop(offset_of!(Drops, in_flight_full));
            }
        }
    }
    0
}

#[inline(always)]
fn exit(ret: i64, id: u16) -> u32 {
    let Some(tid) = current_target_tid() else {
        return 0;
    };
    let Some(slot) = IN_FLIGHT.get_ptr_mut(tid) else {
        return 0;
    };
    // SAFETY: this thread's own slot.
    let call = unsafe { *slot };
    if call.id != id {
        // Entered before we attached, or a stale slot: no honest enter ts.
        return 0;
    }
    // SAFETY: as above. Cheaper than deleting the entry.
    unsafe { (*slot).id = 0 };
    emit(
        now(),
        tid,
        kind::SYSCALL,
        id,
        [call.enter_ts_ns, call.fd, ret as u64],
    );
    0
}

/// The six programs of one syscall; user space finds them by the names in
/// `tracer_ebpf::tracepoints::SyscallPrograms`.
macro_rules! traced_syscall {
    ($wrapper:literal, $id:expr,
     $tp_enter:ident, $tp_exit:ident, $fentry:ident, $fexit:ident, $kprobe:ident, $kretprobe:ident) => {
        #[tracepoint]
        pub fn $tp_enter(ctx: TracePointContext) -> u32 {
            enter(field::<u64>(&ctx, SYS_ENTER_FD), $id)
        }

        #[tracepoint]
        pub fn $tp_exit(ctx: TracePointContext) -> u32 {
            exit(field(&ctx, SYS_EXIT_RET), $id)
        }

        #[fentry(function = $wrapper)]
        pub fn $fentry(ctx: FEntryContext) -> u32 {
            match fd_from_regs(ctx.arg(0)) {
                Some(fd) => enter(fd, $id),
                None => 0,
            }
        }

        /// fexit's context is the arguments, then the return value.
        #[fexit(function = $wrapper)]
        pub fn $fexit(ctx: FExitContext) -> u32 {
            exit(ctx.arg(1), $id)
        }

        #[kprobe]
        pub fn $kprobe(ctx: ProbeContext) -> u32 {
            match ctx.arg(0).and_then(fd_from_regs) {
                Some(fd) => enter(fd, $id),
                None => 0,
            }
        }

        #[kretprobe]
        pub fn $kretprobe(ctx: RetProbeContext) -> u32 {
            exit(ctx.ret(), $id)
        }
    };
}

traced_syscall!(
    "__x64_sys_accept",
    syscall::ACCEPT,
    sys_enter_accept,
    sys_exit_accept,
    fentry_sys_accept,
    fexit_sys_accept,
    kprobe_sys_accept,
    kretprobe_sys_accept
);
traced_syscall!(
    "__x64_sys_accept4",
    syscall::ACCEPT,
    sys_enter_accept4,
    sys_exit_accept4,
    fentry_sys_accept4,
    fexit_sys_accept4,
    kprobe_sys_accept4,
    kretprobe_sys_accept4
);
traced_syscall!(
    "__x64_sys_read",
    syscall::READ,
    sys_enter_read,
    sys_exit_read,
    fentry_sys_read,
    fexit_sys_read,
    kprobe_sys_read,
    kretprobe_sys_read
);
traced_syscall!(
    "__x64_sys_readv",
    syscall::READV,
    sys_enter_readv,
    sys_exit_readv,
    fentry_sys_readv,
    fexit_sys_readv,
    kprobe_sys_readv,
    kretprobe_sys_readv
);
traced_syscall!(
    "__x64_sys_recvfrom",
    syscall::RECVFROM,
    sys_enter_recvfrom,
    sys_exit_recvfrom,
    fentry_sys_recvfrom,
    fexit_sys_recvfrom,
    kprobe_sys_recvfrom,
    kretprobe_sys_recvfrom
);
traced_syscall!(
    "__x64_sys_write",
    syscall::WRITE,
    sys_enter_write,
    sys_exit_write,
    fentry_sys_write,
    fexit_sys_write,
    kprobe_sys_write,
    kretprobe_sys_write
);
traced_syscall!(
    "__x64_sys_writev",
    syscall::WRITEV,
    sys_enter_writev,
    sys_exit_writev,
    fentry_sys_writev,
    fexit_sys_writev,
    kprobe_sys_writev,
    kretprobe_sys_writev
);
traced_syscall!(
    "__x64_sys_sendto",
    syscall::SENDTO,
    sys_enter_sendto,
    sys_exit_sendto,
    fentry_sys_sendto,
    fexit_sys_sendto,
    kprobe_sys_sendto,
    kretprobe_sys_sendto
);
traced_syscall!(
    "__x64_sys_connect",
    syscall::CONNECT,
    sys_enter_connect,
    sys_exit_connect,
    fentry_sys_connect,
    fexit_sys_connect,
    kprobe_sys_connect,
    kretprobe_sys_connect
);
traced_syscall!(
    "__x64_sys_fsync",
    syscall::FSYNC,
    sys_enter_fsync,
    sys_exit_fsync,
    fentry_sys_fsync,
    fexit_sys_fsync,
    kprobe_sys_fsync,
    kretprobe_sys_fsync
);
traced_syscall!(
    "__x64_sys_fdatasync",
    syscall::FDATASYNC,
    sys_enter_fdatasync,
    sys_exit_fdatasync,
    fentry_sys_fdatasync,
    fexit_sys_fdatasync,
    kprobe_sys_fdatasync,
    kretprobe_sys_fdatasync
);
