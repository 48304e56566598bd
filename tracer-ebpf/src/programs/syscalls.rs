//! Traced syscalls, one `syscalls:sys_enter_*` / `sys_exit_*` pair each (raw_syscalls would
//! run on every syscall of the machine). Enter stores (ts, fd) per tid; exit emits one
//! `SYSCALL` event with [enter ts, fd, ret].

use core::mem::offset_of;

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
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

#[inline(always)]
fn enter(ctx: &TracePointContext, id: u16) -> u32 {
    let Some(tid) = current_target_tid() else {
        return 0;
    };
    let call = InFlight {
        enter_ts_ns: now(),
        fd: u64::from(field::<u64>(ctx, SYS_ENTER_FD) as u32),
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
fn exit(ctx: &TracePointContext, id: u16) -> u32 {
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
    let ret: i64 = field(ctx, SYS_EXIT_RET);
    emit(
        now(),
        tid,
        kind::SYSCALL,
        id,
        [call.enter_ts_ns, call.fd, ret as u64],
    );
    0
}

macro_rules! traced_syscall {
    ($enter:ident, $exit:ident, $id:expr) => {
        #[tracepoint]
        pub fn $enter(ctx: TracePointContext) -> u32 {
            enter(&ctx, $id)
        }

        #[tracepoint]
        pub fn $exit(ctx: TracePointContext) -> u32 {
            exit(&ctx, $id)
        }
    };
}

traced_syscall!(sys_enter_accept, sys_exit_accept, syscall::ACCEPT);
traced_syscall!(sys_enter_accept4, sys_exit_accept4, syscall::ACCEPT);
traced_syscall!(sys_enter_read, sys_exit_read, syscall::READ);
traced_syscall!(sys_enter_readv, sys_exit_readv, syscall::READV);
traced_syscall!(sys_enter_recvfrom, sys_exit_recvfrom, syscall::RECVFROM);
traced_syscall!(sys_enter_write, sys_exit_write, syscall::WRITE);
traced_syscall!(sys_enter_writev, sys_exit_writev, syscall::WRITEV);
traced_syscall!(sys_enter_sendto, sys_exit_sendto, syscall::SENDTO);
traced_syscall!(sys_enter_connect, sys_exit_connect, syscall::CONNECT);
traced_syscall!(sys_enter_fsync, sys_exit_fsync, syscall::FSYNC);
traced_syscall!(sys_enter_fdatasync, sys_exit_fdatasync, syscall::FDATASYNC);
