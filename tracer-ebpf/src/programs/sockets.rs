//! Socket hooks: learn which `struct sock` is which fd of the target (in its context), then
//! report data arrival on those sockets from any context. Send, receive and data-ready come in
//! three variants of which user space attaches one (`attach/detect.rs`): the sock:*
//! tracepoints (Linux 6.3+), or fentry or kprobe on the kernel functions that take the
//! `struct sock *` as their first argument (`tcp_sendmsg`, `tcp_recvmsg`, `sock_def_readable`,
//! where the tracepoints sit one call up or inside). TCP state changes are always the
//! `sock:inet_sock_set_state` tracepoint (Linux 4.16+), whose record has the ports.

use core::mem::offset_of;

use aya_ebpf::{
    macros::{fentry, kprobe, tracepoint},
    programs::{FEntryContext, ProbeContext, TracePointContext},
};
use tracer_ebpf::{
    abi::{Drops, Offsets, kind, syscall},
    tracepoints::{
        DATA_READY_SKADDR, LENGTH_SK, SET_STATE_DPORT, SET_STATE_NEWSTATE, SET_STATE_PROTOCOL,
        SET_STATE_SKADDR, SET_STATE_SPORT,
    },
};

use super::{
    maps::{LISTEN_PORTS, TARGET_SOCKS, config, count_drop, emit, field, now, read_kernel},
    syscalls::current_slot,
};

const TCP_ESTABLISHED: i32 = 1;
const TCP_CLOSE: i32 = 7;
const IPPROTO_TCP: u16 = 6;
/// The fd of a socket seen only from softirq (a new connection not yet read).
const FD_UNKNOWN: u64 = u64::MAX;

#[inline(always)]
fn sock_io(sk: u64, receive: bool) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    let Some((tgid, tid, slot)) = current_slot(config) else {
        return 0;
    };
    // SAFETY: this thread's own slot, copied out at once.
    let call = unsafe { *slot };
    if call.id == 0 {
        return 0;
    }
    // BPF has no indirect calls, so the family is a flag rather than a predicate.
    let in_family = if receive {
        syscall::is_receive(call.id)
    } else {
        syscall::is_send(call.id)
    };
    if !in_family {
        return 0;
    }
    // SAFETY: this thread's own slot.
    unsafe { (*slot).socket = 1 };
    // SAFETY: copied out at once.
    let known = unsafe { TARGET_SOCKS.get(sk) }.copied();
    if known == Some(call.fd) {
        return 0;
    }
    if known.is_none() {
        count_drop(offset_of!(Drops, socks_added));
    }
    let _ = TARGET_SOCKS.insert(sk, call.fd, 0);
    // The process too: fds are per process, and in kernel-only mode there are several.
    emit(now(), tid, kind::SOCK_FD, 0, [sk, call.fd, u64::from(tgid)]);
    0
}

#[inline(always)]
fn data_ready(sk: u64) -> u32 {
    if config().is_none() {
        return 0;
    }
    // SAFETY: only tested for presence.
    if unsafe { TARGET_SOCKS.get(sk) }.is_some() {
        emit(now(), 0, kind::DATA_READY, 0, [sk, 0, 0]);
    }
    0
}

#[tracepoint]
pub fn sock_recv_length(ctx: TracePointContext) -> u32 {
    sock_io(field(&ctx, LENGTH_SK), true)
}

#[tracepoint]
pub fn sock_send_length(ctx: TracePointContext) -> u32 {
    sock_io(field(&ctx, LENGTH_SK), false)
}

#[tracepoint]
pub fn sk_data_ready(ctx: TracePointContext) -> u32 {
    data_ready(field(&ctx, DATA_READY_SKADDR))
}

#[fentry(function = "tcp_recvmsg")]
pub fn fentry_tcp_recvmsg(ctx: FEntryContext) -> u32 {
    sock_io(ctx.arg(0), true)
}

#[fentry(function = "tcp_sendmsg")]
pub fn fentry_tcp_sendmsg(ctx: FEntryContext) -> u32 {
    sock_io(ctx.arg(0), false)
}

#[fentry(function = "sock_def_readable")]
pub fn fentry_sock_def_readable(ctx: FEntryContext) -> u32 {
    data_ready(ctx.arg(0))
}

#[kprobe]
pub fn kprobe_tcp_recvmsg(ctx: ProbeContext) -> u32 {
    ctx.arg(0).map_or(0, |sk| sock_io(sk, true))
}

#[kprobe]
pub fn kprobe_tcp_sendmsg(ctx: ProbeContext) -> u32 {
    ctx.arg(0).map_or(0, |sk| sock_io(sk, false))
}

#[kprobe]
pub fn kprobe_sock_def_readable(ctx: ProbeContext) -> u32 {
    ctx.arg(0).map_or(0, data_ready)
}

/// The inode number of `sk`'s network namespace (`sk->__sk_common.skc_net.net->ns.inum`),
/// 0 if it cannot be read.
#[inline(always)]
fn netns(sk: u64, offsets: &Offsets) -> u32 {
    let net: u64 = read_kernel(sk, offsets.sock_net);
    if net == 0 {
        return 0;
    }
    read_kernel(net, offsets.net_inum)
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    let newstate: i32 = field(&ctx, SET_STATE_NEWSTATE);
    let protocol: u16 = field(&ctx, SET_STATE_PROTOCOL);
    if protocol != IPPROTO_TCP {
        return 0;
    }
    if newstate == TCP_CLOSE {
        // The sk may be reused for another connection; it is no longer the target's.
        if TARGET_SOCKS
            .remove(field::<u64>(&ctx, SET_STATE_SKADDR))
            .is_ok()
        {
            count_drop(offset_of!(Drops, socks_removed));
        }
        return 0;
    }
    if newstate != TCP_ESTABLISHED {
        return 0;
    }
    let sport: u16 = field(&ctx, SET_STATE_SPORT);
    // SAFETY: only tested for presence.
    if unsafe { LISTEN_PORTS.get(sport) }.is_none() {
        return 0;
    }
    let sk: u64 = field(&ctx, SET_STATE_SKADDR);
    // The same port in another network namespace (a container's, a test's) is not the
    // target's. Read only for ports the target listens on.
    if config.netns != 0 && netns(sk, &config.offsets) != config.netns {
        return 0;
    }
    // SAFETY: only tested for presence.
    if unsafe { TARGET_SOCKS.get(sk) }.is_none() {
        count_drop(offset_of!(Drops, socks_added));
    }
    let _ = TARGET_SOCKS.insert(sk, FD_UNKNOWN, 0);
    let dport: u16 = field(&ctx, SET_STATE_DPORT);
    emit(
        now(),
        0,
        kind::ESTABLISHED,
        0,
        [sk, u64::from(sport), u64::from(dport)],
    );
    0
}
