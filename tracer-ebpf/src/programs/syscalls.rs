//! Traced syscalls, one enter/exit pair each (raw_syscalls would run on every syscall of the
//! machine), in three variants of which user space attaches one (`attach/detect.rs`): the
//! `syscalls:sys_enter_*` / `sys_exit_*` tracepoints, fentry/fexit on the `__x64_sys_*`
//! wrappers, or kprobe/kretprobe on them. Enter stores (ts, fd) per tid; exit emits one
//! `SYSCALL` event with [enter ts, fd, ret].
//!
//! Kernel-only mode (`Config::KERNEL_ONLY`): the data syscalls (read, readv, recvfrom, write,
//! writev, sendto) also keep their user buffer at enter, and an exit that moved a socket's
//! bytes writes a `DATA` record (`abi::DataEvent`) with the first `DATA_BYTES` of them instead
//! of the `SYSCALL` event; the others write nothing. All three variants do: the tracepoints
//! read the buffer from the record (checked against tracefs), fentry and kprobe from the user
//! registers (`rsi`).

use core::mem::offset_of;

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_probe_read_kernel, generated},
    macros::{fentry, fexit, kprobe, kretprobe, map, tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
};
use tracer_ebpf::{
    abi::{Config, DATA_BYTES, Drops, Event, fd_arg, kind, syscall},
    tracepoints::{SYS_ENTER_BUF, SYS_ENTER_FD, SYS_EXIT_RET},
};

use super::maps::{
    config, count_drop, current, current_target, emit, emit_data, field, is_target_tgid, now,
};

/// A syscall in progress on one thread. `id == 0`: none.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct InFlight {
    pub enter_ts_ns: u64,
    pub fd: u64,
    /// Kernel-only mode: the user buffer (readv, writev: the `struct iovec *`) of a data
    /// syscall. 0 otherwise, and always in exact mode, which does not read it.
    pub buf: u64,
    pub id: u16,
    /// Kernel-only mode: a socket moved this call's bytes (set by `sockets::sock_io`). A data
    /// syscall on a file, pipe or eventfd (nginx's access log, Go's netpoll wakes) writes no
    /// DATA record: only sockets carry HTTP, and a 512-byte copy a call is most of its cost.
    pub socket: u16,
}

/// Iovecs a readv/writev's walk may read: Linux's UIO_MAXIOV, the most a call can pass (more
/// is EINVAL). The walk stops once DATA_BYTES are gathered or the return value is covered, so
/// it always gathers `min(ret, DATA_BYTES)` bytes unless a read fails (Apache's mod_proxy
/// writes an upstream request as an iovec per header line at least: 13 for a small POST).
const MAX_IOVECS: u32 = 1024;

/// Iovecs read from user memory at once: one helper call for eight (a call is most of a
/// step's cost). Reading past the array's end is harmless (the walk stops before it uses an
/// entry past the return value), unless it runs into an unmapped page: then one is read.
const IOV_BATCH: u32 = 8;

/// A readv/writev's walk of its iovecs, in this CPU's slot of [`IOV_WALK`] between
/// `bpf_loop`'s steps. Its scalars live in map memory, whose values the verifier does not
/// track, so [`iov_step`] is verified as one step whatever the iteration (a bounded loop of
/// 1024 would be walked by the verifier 1024 times over). Syscall programs do not nest in
/// each other on a CPU.
#[repr(C)]
struct IovWalk {
    /// The user `struct iovec *`.
    vec: u64,
    /// Bytes of the call's return value not yet covered.
    left: u64,
    /// Bytes gathered in `bytes`.
    filled: u32,
    /// `batch` holds iovecs `batch_from..batch_from + batch_len` {base, len}.
    batch_from: u32,
    batch_len: u32,
    _pad: u32,
    batch: [[u64; 2]; IOV_BATCH as usize],
    /// Twice DATA_BYTES, so that the verifier can bound "at `filled` (< DATA_BYTES), up to
    /// DATA_BYTES bytes" inside it; the record gets the first DATA_BYTES.
    bytes: [u8; 2 * DATA_BYTES],
}

#[map]
static IOV_WALK: PerCpuArray<IovWalk> = PerCpuArray::with_max_entries(1, 0);

/// Pruned with TIDS when a thread of the target exits.
#[map]
pub static IN_FLIGHT: HashMap<u32, InFlight> = HashMap::with_max_entries(4096, 0);

/// The current thread's (tgid, tid) and its IN_FLIGHT slot, if it is a target's thread that
/// has one. The target test comes first (a compare, or in kernel-only mode this CPU's cached
/// TGIDS answer), so other processes' calls never reach the hash lookup.
#[inline(always)]
pub fn current_slot(config: &Config) -> Option<(u32, u32, *mut InFlight)> {
    let (tgid, tid) = current();
    if !is_target_tgid(config, tgid) {
        return None;
    }
    Some((tgid, tid, IN_FLIGHT.get_ptr_mut(tid)?))
}

/// Offset of `di` (the first syscall argument) in x86-64's `struct pt_regs`: the
/// `__x64_sys_*` wrappers take the user registers, not the arguments.
const PT_REGS_DI: usize = 112;

/// Offset of `si` (the second syscall argument: the data syscalls' buffer).
const PT_REGS_SI: usize = 104;

/// The fd argument of a syscall, from the user registers a `__x64_sys_*` wrapper was given.
#[inline(always)]
fn fd_from_regs(regs: *const u8) -> Option<u64> {
    // SAFETY: a probe read; a bad pointer fails the read instead of faulting.
    unsafe { bpf_probe_read_kernel(regs.wrapping_add(PT_REGS_DI).cast::<u64>()) }.ok()
}

/// The buffer argument of a data syscall from the same registers (0 if unreadable, or when
/// `data` is false: the other syscalls have none).
#[inline(always)]
fn buf_from_regs(regs: *const u8, data: bool) -> u64 {
    if !data {
        return 0;
    }
    // SAFETY: as in `fd_from_regs`.
    unsafe { bpf_probe_read_kernel(regs.wrapping_add(PT_REGS_SI).cast::<u64>()) }.unwrap_or(0)
}

/// Copies the first `min(ret, DATA_BYTES)` bytes at user address `src` into `dst`; returns
/// how many were copied: all of them, or 0 if the read failed (the helper zeroes `dst` then).
#[inline(always)]
fn copy_flat(dst: *mut [u8; DATA_BYTES], src: u64, ret: u64) -> u32 {
    let n = if ret >= DATA_BYTES as u64 {
        DATA_BYTES as u32
    } else {
        ret as u32 & (DATA_BYTES as u32 - 1)
    };
    // SAFETY: `dst` has DATA_BYTES writable bytes and n <= DATA_BYTES; a bad user address fails
    // the read instead of faulting.
    let r = unsafe { generated::bpf_probe_read_user(dst.cast(), n, src as *const c_void) };
    if r == 0 { n } else { 0 }
}

/// One step of the iovec walk (a `bpf_loop` callback): takes iovec `i` {base, len} from the
/// batch (reading the next [`IOV_BATCH`] when it is not there) and gathers `min(len, left)` of
/// its bytes, at most up to DATA_BYTES. `ctx` points to a `*mut IovWalk` on [`copy_iov`]'s
/// stack. Returns 1 (stop) once DATA_BYTES are gathered or the return value covered, or when
/// a read fails; 0 to go on.
#[inline(never)]
extern "C" fn iov_step(i: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is `copy_iov`'s pointer to this CPU's IOV_WALK slot, which outlives the loop.
    let walk = unsafe { *ctx.cast::<*mut IovWalk>() };
    // SAFETY: a live map value; only this program touches it on this CPU meanwhile.
    let (vec, left, filled) = unsafe { ((*walk).vec, (*walk).left, (*walk).filled) };
    if filled >= DATA_BYTES as u32 || left == 0 {
        return 1;
    }
    // SAFETY: as above.
    let (from, cached) = unsafe { ((*walk).batch_from, (*walk).batch_len) };
    let mut k = i.wrapping_sub(from);
    if k >= cached {
        // The next IOV_BATCH iovecs, or this one alone where they run into unreadable memory.
        let addr = (vec + u64::from(i) * 16) as *const c_void;
        // SAFETY: probe reads of user memory into the map value.
        let got = unsafe {
            let batch = (&raw mut (*walk).batch).cast::<c_void>();
            if generated::bpf_probe_read_user(batch, 16 * IOV_BATCH, addr) == 0 {
                IOV_BATCH
            } else if generated::bpf_probe_read_user(batch, 16, addr) == 0 {
                1
            } else {
                return 1;
            }
        };
        // SAFETY: as above.
        unsafe {
            (*walk).batch_from = i;
            (*walk).batch_len = got;
        }
        k = 0;
    }
    // SAFETY: as above; the index is masked into the array.
    let [base, len] = unsafe { (*walk).batch[(k & (IOV_BATCH - 1)) as usize] };
    let take = if len < left { len } else { left };
    let room = u64::from(DATA_BYTES as u32 - filled);
    let n = if take >= room { room } else { take };
    let n = if n >= DATA_BYTES as u64 {
        DATA_BYTES as u32
    } else {
        n as u32 & (DATA_BYTES as u32 - 1)
    };
    // Bounds the offset for the verifier even where `filled` is read again (LLVM drops the
    // mask when it still holds the compare above, which bounds it as well).
    let at = filled & (DATA_BYTES as u32 - 1);
    // SAFETY: at < DATA_BYTES and n <= DATA_BYTES, inside the 2 * DATA_BYTES of `bytes`.
    let r = unsafe {
        generated::bpf_probe_read_user(
            (&raw mut (*walk).bytes)
                .cast::<u8>()
                .add(at as usize)
                .cast(),
            n,
            base as *const c_void,
        )
    };
    if r != 0 {
        return 1;
    }
    let (filled, left) = (filled + n, left - take);
    // SAFETY: as above.
    unsafe {
        (*walk).filled = filled;
        (*walk).left = left;
    }
    i64::from(filled >= DATA_BYTES as u32 || left == 0)
}

/// readv/writev: walks the `struct iovec` {base, len} at user address `vec` in order with
/// `bpf_loop` (at most [`MAX_IOVECS`]), gathering bytes until `ret` (what the call moved) or
/// DATA_BYTES are covered, then copies them into `dst`. Returns the bytes gathered before the
/// first failed read.
#[inline(always)]
fn copy_iov(dst: *mut [u8; DATA_BYTES], vec: u64, ret: u64) -> u32 {
    let Some(walk) = IOV_WALK.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot (see IovWalk).
    unsafe {
        (*walk).vec = vec;
        (*walk).left = ret;
        (*walk).filled = 0;
        (*walk).batch_len = 0;
    }
    let mut ctx = walk;
    // SAFETY: `iov_step` is a static BPF function of this program taking (index, ctx); `ctx`
    // lives until the helper returns.
    unsafe {
        generated::bpf_loop(
            MAX_IOVECS,
            iov_step as *mut c_void,
            (&raw mut ctx).cast(),
            0,
        )
    };
    // SAFETY: as above.
    let filled = unsafe { (*walk).filled };
    if filled == 0 {
        return 0;
    }
    // SAFETY: both sides have DATA_BYTES bytes; a kernel-to-kernel copy of map memory.
    let r = unsafe {
        generated::bpf_probe_read_kernel(
            dst.cast(),
            DATA_BYTES as u32,
            (&raw const (*walk).bytes).cast(),
        )
    };
    if r == 0 {
        filled.min(DATA_BYTES as u32)
    } else {
        0
    }
}

/// `buf` is asked only in kernel-only mode (exact mode pays no read for it).
#[inline(always)]
fn enter(fd: u64, buf: impl FnOnce() -> u64, id: u16) -> u32 {
    let Some((config, _, tid)) = current_target() else {
        return 0;
    };
    let call = InFlight {
        enter_ts_ns: now(),
        fd: u64::from(fd as u32),
        buf: if config.flags & Config::KERNEL_ONLY != 0 {
            buf()
        } else {
            0
        },
        id,
        socket: 0,
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

/// `data`: a data syscall (its InFlight has the buffer); `iov`: readv/writev.
#[inline(always)]
fn exit(ret: i64, id: u16, data: bool, iov: bool) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    let Some((tgid, tid, slot)) = current_slot(config) else {
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
    let args = [call.enter_ts_ns, fd_arg(call.fd as u32, tgid), ret as u64];
    if data && config.flags & Config::KERNEL_ONLY != 0 {
        // The rebuild reads a data syscall only for the bytes a socket moved: one that moved
        // none (EAGAIN, EOF) or moved a file's says nothing it needs.
        if ret <= 0 || call.socket == 0 {
            return 0;
        }
        let event = Event {
            ts_ns: now(),
            tid,
            kind: kind::DATA,
            sub: id,
            args,
        };
        emit_data(event, tgid, |bytes| {
            if iov {
                copy_iov(bytes, call.buf, ret as u64)
            } else {
                copy_flat(bytes, call.buf, ret as u64)
            }
        });
    } else {
        emit(now(), tid, kind::SYSCALL, id, args);
    }
    0
}

/// The six programs of one syscall; user space finds them by the names in
/// `tracer_ebpf::tracepoints::SyscallPrograms`.
/// `data`: a data syscall, whose buffer (arg 1) is kept for kernel-only mode; `iov`: that
/// buffer is a `struct iovec *`.
macro_rules! traced_syscall {
    ($wrapper:literal, $id:expr,
     $tp_enter:ident, $tp_exit:ident, $fentry:ident, $fexit:ident, $kprobe:ident, $kretprobe:ident) => {
        traced_syscall!(
            $wrapper, $id, false, false, $tp_enter, $tp_exit, $fentry, $fexit, $kprobe, $kretprobe
        );
    };
    ($wrapper:literal, $id:expr, $data:expr, $iov:expr,
     $tp_enter:ident, $tp_exit:ident, $fentry:ident, $fexit:ident, $kprobe:ident, $kretprobe:ident) => {
        #[tracepoint]
        pub fn $tp_enter(ctx: TracePointContext) -> u32 {
            // Only data syscalls have arg 1 at SYS_ENTER_BUF (fsync's record ends before it).
            let buf = || {
                if $data {
                    field::<u64>(&ctx, SYS_ENTER_BUF)
                } else {
                    0
                }
            };
            enter(field::<u64>(&ctx, SYS_ENTER_FD), buf, $id)
        }

        #[tracepoint]
        pub fn $tp_exit(ctx: TracePointContext) -> u32 {
            exit(field(&ctx, SYS_EXIT_RET), $id, $data, $iov)
        }

        #[fentry(function = $wrapper)]
        pub fn $fentry(ctx: FEntryContext) -> u32 {
            let regs: *const u8 = ctx.arg(0);
            match fd_from_regs(regs) {
                Some(fd) => enter(fd, || buf_from_regs(regs, $data), $id),
                None => 0,
            }
        }

        /// fexit's context is the arguments, then the return value.
        #[fexit(function = $wrapper)]
        pub fn $fexit(ctx: FExitContext) -> u32 {
            exit(ctx.arg(1), $id, $data, $iov)
        }

        #[kprobe]
        pub fn $kprobe(ctx: ProbeContext) -> u32 {
            let Some(regs) = ctx.arg::<*const u8>(0) else {
                return 0;
            };
            match fd_from_regs(regs) {
                Some(fd) => enter(fd, || buf_from_regs(regs, $data), $id),
                None => 0,
            }
        }

        #[kretprobe]
        pub fn $kretprobe(ctx: RetProbeContext) -> u32 {
            exit(ctx.ret(), $id, $data, $iov)
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
    true,
    false,
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
    true,
    true,
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
    true,
    false,
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
    true,
    false,
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
    true,
    true,
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
    true,
    false,
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
