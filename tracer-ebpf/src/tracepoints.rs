//! Field offsets of the classic tracepoints the kernel programs read, shared with user space,
//! which checks every one against `/sys/kernel/tracing/events/<category>/<name>/format` before
//! attaching (a kernel with another layout fails with a clear error instead of reading junk).

/// One field the kernel programs read: where, and how wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

/// The fields one tracepoint's program reads.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub category: &'static str,
    pub name: &'static str,
    pub fields: &'static [Field],
}

const fn field(name: &'static str, offset: usize, size: usize) -> Field {
    Field { name, offset, size }
}

/// `fd` (arg 0) of every traced `syscalls:sys_enter_*`.
pub const SYS_ENTER_FD: Field = field("fd", 16, 8);
/// Kernel-only mode: the user buffer (arg 1) of the data syscalls' `syscalls:sys_enter_*`, at
/// the same offset in each but under each syscall's own name (see [`DATA_SYSCALL_BUFS`]).
pub const SYS_ENTER_BUF: Field = field("buf", 24, 8);

/// The data syscalls whose bytes kernel-only mode copies, with the name their enter record
/// gives [`SYS_ENTER_BUF`] (read `buf`, recvfrom `ubuf`, sendto `buff`; readv and writev pass
/// a `struct iovec *` `vec`, walked by the programs). User space checks each at attach time.
pub const DATA_SYSCALL_BUFS: [(&str, Field); 6] = [
    ("read", SYS_ENTER_BUF),
    ("readv", field("vec", 24, 8)),
    ("recvfrom", field("ubuf", 24, 8)),
    ("write", SYS_ENTER_BUF),
    ("writev", field("vec", 24, 8)),
    ("sendto", field("buff", 24, 8)),
];

/// `ret` of every traced `syscalls:sys_exit_*`.
pub const SYS_EXIT_RET: Field = field("ret", 16, 8);

/// `sock:sock_recv_length` and `sock:sock_send_length`.
pub const LENGTH_SK: Field = field("sk", 8, 8);
/// `sock:sk_data_ready`.
pub const DATA_READY_SKADDR: Field = field("skaddr", 8, 8);
/// `sock:inet_sock_set_state`.
pub const SET_STATE_SKADDR: Field = field("skaddr", 8, 8);
pub const SET_STATE_NEWSTATE: Field = field("newstate", 20, 4);
pub const SET_STATE_SPORT: Field = field("sport", 24, 2);
pub const SET_STATE_DPORT: Field = field("dport", 26, 2);
pub const SET_STATE_PROTOCOL: Field = field("protocol", 30, 2);

/// `sched:sched_switch`.
pub const SWITCH_PREV_STATE: Field = field("prev_state", 32, 8);
pub const SWITCH_NEXT_PID: Field = field("next_pid", 56, 4);
pub const SWITCH_NEXT_COMM: Field = field("next_comm", 40, 16);
/// `sched:sched_wakeup` and `sched:sched_wakeup_new`.
pub const WAKEUP_PID: Field = field("pid", 24, 4);
/// `sched:sched_process_fork` where the comms are `__data_loc` strings (6.18 here).
pub const FORK_CHILD_PID: Field = field("child_pid", 20, 4);
/// `sched:sched_process_fork` where the comms are inline `char[16]` (Debian's 6.1).
pub const FORK_CHILD_PID_FIXED_COMM: Field = field("child_pid", 44, 4);

/// The fork layouts: (program, the field it reads). User space attaches the one whose offset
/// the kernel's format file has.
pub const FORK_VARIANTS: [(&str, Field); 2] = [
    ("sched_process_fork", FORK_CHILD_PID),
    ("sched_process_fork_fixed_comm", FORK_CHILD_PID_FIXED_COMM),
];

/// `prev_state` of sched_switch: bits below TASK_REPORT_MAX are the sleep state; a task
/// switched out while runnable reports 0 ("R", e.g. sched_yield) or TASK_REPORT_MAX ("R+",
/// preempted). User space derives TASK_REPORT_MAX from the print fmt and checks it is this.
pub const TASK_REPORT_MAX: i64 = 0x100;

/// `prev_state` bits of a task switched out for the last time ("X" EXIT_DEAD, "Z"
/// EXIT_ZOMBIE: `__trace_sched_switch_state` reports its exit_state; TASK_DEAD itself is
/// outside TASK_REPORT). The same on 6.1 and 6.18; user space checks them in the print fmt.
pub const EXIT_DEAD: i64 = 0x10;
pub const EXIT_ZOMBIE: i64 = 0x20;

/// The send, receive and data-ready tracepoints (Linux 6.3+); kernels without them use fentry
/// or kprobes on the functions they sit in (see `programs/sockets.rs`).
pub const SOCK_IO_LAYOUTS: [Layout; 3] = [
    Layout {
        category: "sock",
        name: "sock_send_length",
        fields: &[LENGTH_SK],
    },
    Layout {
        category: "sock",
        name: "sk_data_ready",
        fields: &[DATA_READY_SKADDR],
    },
    Layout {
        category: "sock",
        name: "sock_recv_length",
        fields: &[LENGTH_SK],
    },
];

/// TCP state changes: always this tracepoint, whatever carries send and receive.
pub const SET_STATE_LAYOUT: Layout = Layout {
    category: "sock",
    name: "inet_sock_set_state",
    fields: &[
        SET_STATE_SKADDR,
        SET_STATE_NEWSTATE,
        SET_STATE_SPORT,
        SET_STATE_DPORT,
        SET_STATE_PROTOCOL,
    ],
};

/// The kernel functions the fentry and kprobe variants of [`SOCK_IO_LAYOUTS`] hook, in the
/// same order, each taking the `struct sock *` first. Programs: `fentry_<function>`, `kprobe_<function>`.
pub const SOCK_IO_FUNCTIONS: [&str; 3] = ["tcp_sendmsg", "sock_def_readable", "tcp_recvmsg"];

/// The scheduler tracepoints but `sched_process_fork` (see [`FORK_VARIANTS`]).
pub const SCHED_LAYOUTS: [Layout; 4] = [
    Layout {
        category: "sched",
        name: "sched_switch",
        fields: &[SWITCH_PREV_STATE, SWITCH_NEXT_PID, SWITCH_NEXT_COMM],
    },
    Layout {
        category: "sched",
        name: "sched_wakeup",
        fields: &[WAKEUP_PID],
    },
    Layout {
        category: "sched",
        name: "sched_wakeup_new",
        fields: &[WAKEUP_PID],
    },
    Layout {
        category: "sched",
        name: "sched_process_exit",
        fields: &[],
    },
];

/// The traced syscalls: (name as in `sys_enter_<name>`, `abi::syscall` id). Their programs
/// are `sys_enter_<name>` / `sys_exit_<name>` (tracepoints), `fentry_sys_<name>` /
/// `fexit_sys_<name>` and `kprobe_sys_<name>` / `kretprobe_sys_<name>`, the latter four on the
/// kernel's `__x64_sys_<name>` (x86-64 only, as are the NOP5 probe sites).
pub const SYSCALLS: [(&str, u16); 11] = {
    use crate::abi::syscall::*;
    [
        ("accept", ACCEPT),
        ("accept4", ACCEPT),
        ("read", READ),
        ("readv", READV),
        ("recvfrom", RECVFROM),
        ("write", WRITE),
        ("writev", WRITEV),
        ("sendto", SENDTO),
        ("connect", CONNECT),
        ("fsync", FSYNC),
        ("fdatasync", FDATASYNC),
    ]
};
