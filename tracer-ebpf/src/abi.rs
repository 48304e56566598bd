//! The event record. Every kernel program writes exactly this struct to the ring buffer
//! `EVENTS`; `kind` says which program wrote it and how to read `sub` and `args`.
//!
//! All timestamps are `bpf_ktime_get_ns()`, i.e. CLOCK_MONOTONIC, so they join with a load
//! generator's `clock_gettime(CLOCK_MONOTONIC)` stamps.

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// When it happened (for syscalls: the exit).
    pub ts_ns: u64,
    /// The thread the event concerns (kernel tid). 0 for softirq socket events.
    pub tid: u32,
    /// One of the `kind::*` constants.
    pub kind: u16,
    /// Kind-specific small value (site id, syscall id, flags).
    pub sub: u16,
    /// Kind-specific arguments; see each `kind::*` constant.
    pub args: [u64; 3],
}

#[cfg(feature = "user")]
// SAFETY: plain old data: repr(C), only integers, no padding (8 + 4 + 2 + 2 + 24 bytes).
unsafe impl aya::Pod for Event {}

pub mod kind {
    /// A probe site was hit. sub = `Site` id; args = the site's arguments.
    pub const SITE: u16 = 1;
    /// A traced syscall returned. sub = `syscall::*`; args = [enter ts, [`super::fd_arg`] (the
    /// fd and the caller's tgid), return value as i64].
    pub const SYSCALL: u16 = 2;
    /// In-context socket I/O told us which fd a `struct sock` is. args = [sk, fd, tgid].
    /// Written only when the pair is new or changed.
    pub const SOCK_FD: u16 = 3;
    /// sock:sk_data_ready on a socket of the target (any context). args = [sk].
    pub const DATA_READY: u16 = 4;
    /// A thread of the target was switched out. sub = 1 if still runnable (preempted).
    /// args = [kernel stack id, user stack id] as i64 (negative: no stack),
    /// [`super::switch::pack`] (the task switched in instead, and the CPU).
    pub const SWITCH_OUT: u16 = 5;
    /// A thread of the target was switched in. args = [CPU].
    pub const SWITCH_IN: u16 = 6;
    /// A thread of the target was woken (became runnable). sub = 1 for wakeup_new.
    pub const WAKEUP: u16 = 7;
    /// A cpu-clock sample on a thread of the target. args = [kernel stack id, user stack id].
    pub const SAMPLE: u16 = 8;
    /// A new connection reached TCP_ESTABLISHED on a listening port of the target.
    /// args = [sk, local port, remote port].
    pub const ESTABLISHED: u16 = 9;
    /// The name of a task outside the target that replaced a target thread at a switch-out,
    /// sent the first time that pid is seen (an LRU set in the kernel). tid = that task's pid
    /// (sched_switch's next_pid); args = [comm bytes 0..8, comm bytes 8..16] (NUL-padded).
    pub const TASK_NAME: u16 = 10;
    /// Kernel-only mode: a data syscall (read, recvfrom, write, writev, sendto) of a target
    /// process moved bytes. Written as a [`super::DataEvent`], whose `event` has sub =
    /// `syscall::*` and args = [enter ts, fd, return value] like `SYSCALL`.
    pub const DATA: u16 = 11;
    /// Kernel-only mode: a target process forked a new process (tid = the child's pid,
    /// args = [parent's tgid, 1 if the child may be a thread]; sub 0), which is now a target
    /// too, or a target process exited (tid = its pid; sub 1). args[1] is 1 only with the
    /// classic sched_process_fork tracepoint, whose record cannot tell a thread from a process
    /// (the raw one reads the child's tgid): such a child is in TGIDS either way, harmlessly
    /// (a thread's tid is no other live process's tgid), and its exit says nothing if a thread.
    pub const PROCESS: u16 = 12;
}

/// Bytes a [`DataEvent`] carries: the start of what the syscall moved. Enough for the
/// request line and headers of ordinary HTTP/1.1 requests; a header block that runs past it
/// cannot be parsed, and its connection is reported, never guessed.
pub const DATA_BYTES: usize = 512;

/// A [`kind::DATA`] record: the syscall's event, then the first bytes it moved.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataEvent {
    pub event: Event,
    /// The process whose fd this is (fds are per process; nginx's workers each have their own).
    pub tgid: u32,
    /// How many of `bytes` hold data: at most `min(return value, DATA_BYTES)`; writev's come
    /// from its first iovecs in order.
    pub captured: u32,
    pub bytes: [u8; DATA_BYTES],
}

#[cfg(feature = "user")]
// SAFETY: repr(C): a 40-byte Event, two u32s, a byte array (560 bytes, a multiple of 8), no
// padding.
unsafe impl aya::Pod for DataEvent {}

/// SYSCALL's and DATA's second argument: the fd the call was given (its low 32 bits) and the
/// tgid of the process it belongs to (the high 32; fds are per process, and an accept or a
/// connect has no other way to say whose it is).
pub const fn fd_arg(fd: u32, tgid: u32) -> u64 {
    (fd as u64) | ((tgid as u64) << 32)
}

/// (fd, tgid) of [`fd_arg`]; tgid 0 in records from before it carried one.
pub const fn fd_of(arg: u64) -> (u32, u32) {
    (arg as u32, (arg >> 32) as u32)
}

/// SWITCH_OUT's third argument: the task that took the CPU (`next_pid`; 0 = idle) and the CPU.
pub mod switch {
    pub const fn pack(next_pid: u32, cpu: u32) -> u64 {
        (next_pid as u64) | ((cpu as u64) << 32)
    }

    /// (next_pid, cpu).
    pub const fn unpack(arg: u64) -> (u32, u32) {
        (arg as u32, (arg >> 32) as u32)
    }
}

pub mod syscall {
    pub const ACCEPT: u16 = 1;
    pub const READ: u16 = 2;
    pub const READV: u16 = 3;
    pub const RECVFROM: u16 = 4;
    pub const WRITE: u16 = 5;
    pub const WRITEV: u16 = 6;
    pub const SENDTO: u16 = 7;
    pub const CONNECT: u16 = 8;
    pub const FSYNC: u16 = 9;
    pub const FDATASYNC: u16 = 10;

    pub const fn name(id: u16) -> &'static str {
        match id {
            ACCEPT => "accept",
            READ => "read",
            READV => "readv",
            RECVFROM => "recvfrom",
            WRITE => "write",
            WRITEV => "writev",
            SENDTO => "sendto",
            CONNECT => "connect",
            FSYNC => "fsync",
            FDATASYNC => "fdatasync",
            _ => "unknown",
        }
    }

    pub const fn is_receive(id: u16) -> bool {
        matches!(id, READ | READV | RECVFROM)
    }

    pub const fn is_send(id: u16) -> bool {
        matches!(id, WRITE | WRITEV | SENDTO)
    }

    pub const fn is_sync(id: u16) -> bool {
        matches!(id, FSYNC | FDATASYNC)
    }
}

/// Index of the per-CPU loss record in the `LOSS` array map.
pub const LOSS_SLOT: u32 = 0;

/// Per-CPU count of events that could not be reserved in the ring buffer, with the time of
/// the most recent one. User space turns a rise in `count` into a loss span.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loss {
    pub count: u64,
    pub last_ts_ns: u64,
}

#[cfg(feature = "user")]
// SAFETY: repr(C), two u64s.
unsafe impl aya::Pod for Loss {}

/// Per-CPU counters of what the kernel programs could not do, so that nothing is dropped
/// silently (and of forced reader wakeups).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drops {
    /// A new thread of the target could not be added to TIDS (map full).
    pub tids_full: u64,
    /// A syscall's enter could not be stored in IN_FLIGHT (map full): its exit emits nothing.
    pub in_flight_full: u64,
    /// A stack could not be taken (not walkable, or STACKS full): the event went out with
    /// stack id -1. A sample in user mode takes no kernel stack and counts nothing here.
    pub stack_failed: u64,
    /// Submits that woke the reader because the ring was fuller than `Config::wakeup_bytes`.
    pub forced_wakeups: u64,
    /// Sockets added to TARGET_SOCKS (new keys only) and removed from it at TCP_CLOSE. The
    /// map is LRU (ESTABLISHED matches the target's ports in its network namespace, or in any
    /// where `Config::netns` is 0); the kernel does not say when it evicts, but at least
    /// `added - removed - TARGET_SOCKS_ENTRIES` entries were (see `events/drops.rs`).
    pub socks_added: u64,
    pub socks_removed: u64,
}

/// Frames kept of a stack: the kernel's PERF_MAX_STACK_DEPTH.
pub const STACK_FRAMES: usize = 127;

/// STACKS's default capacity (`--stack-entries`).
pub const STACK_ENTRIES: u32 = 16384;

/// One stack in STACKS: instruction pointers, innermost first, then zeroes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stack {
    pub ips: [u64; STACK_FRAMES],
}

#[cfg(feature = "user")]
// SAFETY: repr(C), an array of u64s.
unsafe impl aya::Pod for Stack {}

/// TARGET_SOCKS's capacity.
pub const TARGET_SOCKS_ENTRIES: u32 = 65536;

#[cfg(feature = "user")]
// SAFETY: repr(C), six u64s.
unsafe impl aya::Pod for Drops {}

/// Filter configuration, written by user space into the `CONFIG` array before attaching.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// The target's tgid (its pid).
    pub tgid: u32,
    /// [`Config::OFFCPU_STACKS`], [`Config::EMPTY_PROGRAMS`].
    pub flags: u32,
    /// Events are submitted without waking the reader, which drains on a timer; once the ring
    /// holds more than this many bytes, a submit wakes it so that a burst is not lost.
    pub wakeup_bytes: u64,
    /// The target's network namespace (the inode number of /proc/PID/ns/net): a connection
    /// reaching ESTABLISHED on a listening port is the target's only in this namespace. 0: not
    /// checked (the kernel's BTF did not give [`Offsets::sock_net`] and [`Offsets::net_inum`]).
    pub netns: u32,
    pub offsets: Offsets,
}

/// Byte offsets of kernel struct members the programs read with `bpf_probe_read_kernel`, from
/// the kernel's BTF (user space, `attach/btf.rs`): the raw sched tracepoints get `task_struct`
/// pointers, and the netns check follows a `struct sock`. 0 where unused (classic tracepoints).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offsets {
    /// `task_struct.pid` (the tid, an int).
    pub task_pid: u32,
    /// `task_struct.comm` (char[16]).
    pub task_comm: u32,
    /// `task_struct.exit_state` (an int: EXIT_ZOMBIE, EXIT_DEAD once past exit_notify).
    pub task_exit_state: u32,
    /// `sock.__sk_common.skc_net.net` (a `struct net *`).
    pub sock_net: u32,
    /// `net.ns.inum` (an unsigned int).
    pub net_inum: u32,
    /// `task_struct.tgid` (an int): kernel-only mode's raw fork program tells a new process
    /// (tgid == pid) from a new thread.
    pub task_tgid: u32,
    /// Keeps the struct a multiple of 8 bytes (no implicit padding for `Pod`).
    pub _pad: u32,
}

impl Config {
    /// Take a stack id at every switch-out of a target thread.
    pub const OFFCPU_STACKS: u32 = 1;
    /// Every program returns at once, as if no target were set: the hooks stay attached, so a
    /// session measures what the traps and the dispatch cost on their own, and records nothing.
    pub const EMPTY_PROGRAMS: u32 = 2;
    /// Kernel-only mode: the target is the processes in TGIDS (`tgid` is the first of them),
    /// followed across fork; data syscalls write [`DataEvent`]s.
    pub const KERNEL_ONLY: u32 = 4;
}

#[cfg(feature = "user")]
// SAFETY: repr(C), u32 + u32 + u64 + u32 + seven u32s (48 bytes, a multiple of its 8-byte
// alignment), no padding.
unsafe impl aya::Pod for Config {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_has_no_padding() {
        assert_eq!(core::mem::size_of::<Event>(), 40);
        assert_eq!(core::mem::align_of::<Event>(), 8);
        assert_eq!(core::mem::size_of::<DataEvent>(), 40 + 8 + DATA_BYTES);
    }

    #[test]
    fn config_has_no_padding() {
        assert_eq!(core::mem::size_of::<Config>(), 4 + 4 + 8 + 4 + 7 * 4);
    }
}
