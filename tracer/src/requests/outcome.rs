//! What the rebuild produces: one record per request, its time split into [`Part`]s.

use tracer_ebpf::sites::Phase;

/// Where a nanosecond of a request went. Every ns of `[t_arrive, t_done]` belongs to exactly
/// one part, so the parts of a request always sum to its total.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// Upstream send → kernel arrival of the upstream response. Excluded from overhead.
    Upstream,
    /// Ready but not running: waiting for a poll, run-queue delay, involuntary preemption.
    Scheduling,
    /// The ledger writer was in fsync/fdatasync while this request waited for its receipt.
    LedgerFsync,
    /// The writer was between sign begin and sign end while this request waited.
    Signing,
    /// The rest of the receipt wait: batching, SQLite insert, writer run-queue delay.
    LedgerOther,
    /// On-CPU time of the request's own work, by phase (phases traced, `--phases`).
    Cpu(Phase),
    /// On-CPU time of the request's own work, phases not traced (the lean default).
    OnCpu,
    /// Kernel-only mode: the thread serving the request was on CPU for other requests (an
    /// event loop's head-of-line wait).
    Queued,
    /// Kernel-only mode: no thread was working on the request, and a thread of the process was
    /// in fsync or fdatasync (a gateway whose answer waits for a durable write).
    BlockedFsync,
    /// Off-CPU (blocked) for a reason none of the above explains.
    BlockedOther,
    /// An interval with no event to explain it. Reported, never folded into another part.
    Unattributed,
}

/// Number of parts; `Part::index` is dense in `0..PARTS`.
pub const PARTS: usize = 10 + Phase::ALL.len();

impl Part {
    pub const ALL: [Part; PARTS] = [
        Part::Upstream,
        Part::Scheduling,
        Part::LedgerFsync,
        Part::Signing,
        Part::LedgerOther,
        Part::OnCpu,
        Part::Cpu(Phase::Parse),
        Part::Cpu(Phase::Auth),
        Part::Cpu(Phase::Scope),
        Part::Cpu(Phase::RateLimit),
        Part::Cpu(Phase::Registry),
        Part::Cpu(Phase::Vault),
        Part::Cpu(Phase::Upstream),
        Part::Cpu(Phase::ReceiptWait),
        Part::Cpu(Phase::Respond),
        Part::Queued,
        Part::BlockedFsync,
        Part::BlockedOther,
        Part::Unattributed,
    ];

    pub fn index(self) -> usize {
        Part::ALL
            .iter()
            .position(|p| *p == self)
            .expect("every part is listed in ALL")
    }

    /// Stable name used in tables, JSON keys and CSV headers.
    pub fn name(self) -> &'static str {
        match self {
            Part::Upstream => "upstream",
            Part::Scheduling => "scheduling",
            Part::LedgerFsync => "ledger_fsync",
            Part::Signing => "signing",
            Part::LedgerOther => "ledger_other",
            Part::OnCpu => "cpu",
            Part::Cpu(Phase::Parse) => "cpu.parse",
            Part::Cpu(Phase::Auth) => "cpu.auth",
            Part::Cpu(Phase::Scope) => "cpu.scope",
            Part::Cpu(Phase::RateLimit) => "cpu.ratelimit",
            Part::Cpu(Phase::Registry) => "cpu.registry",
            Part::Cpu(Phase::Vault) => "cpu.vault",
            Part::Cpu(Phase::Upstream) => "cpu.upstream",
            Part::Cpu(Phase::ReceiptWait) => "cpu.receipt",
            Part::Cpu(Phase::Respond) => "cpu.respond",
            Part::Queued => "queued",
            Part::BlockedFsync => "blocked.fsync",
            Part::BlockedOther => "blocked_other",
            Part::Unattributed => "unattributed",
        }
    }
}

/// A contiguous interval of one request assigned to one part, on one thread when the part is
/// on-CPU or preemption (tid 0 when the request was not on any thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub start_ns: u64,
    pub end_ns: u64,
    pub part: Part,
    pub tid: u32,
}

/// A cpu-clock sample taken while a thread was polling this request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackSample {
    pub ts_ns: u64,
    pub tid: u32,
    pub kernel_stack: i64,
    pub user_stack: i64,
    pub phase: Option<Phase>,
}

/// Off-CPU time charged to this request: a switch-out of the thread serving it, or of the
/// ledger writer while this request waited for its receipt, weighted by the ns charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpu {
    pub tid: u32,
    pub ns: u64,
    pub kernel_stack: i64,
    pub user_stack: i64,
    pub part: Part,
}

/// One complete request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    pub req_id: u64,
    pub status: u16,
    /// Kernel arrival of the request's first byte on the client socket.
    pub t_arrive_ns: u64,
    /// Entry of the write that sent the last byte of the response.
    pub t_done_ns: u64,
    /// The client connection's remote port, where the kernel said it (connections accepted
    /// while traced).
    pub client_port: Option<u16>,
    /// Where its `upstream` part begins (the upstream request's send); `None` without one.
    pub upstream_start_ns: Option<u64>,
    /// ns per part, indexed by [`Part::index`]; sums to `t_done_ns - t_arrive_ns`.
    pub parts: [u64; PARTS],
    /// The request's timeline, in time order, covering `[t_arrive, t_done]` without gaps.
    pub slices: Vec<Slice>,
    pub samples: Vec<StackSample>,
    pub offcpu: Vec<OffCpu>,
    /// What held the CPU (or the writer) while it waited: its `scheduling` and receipt parts
    /// charged to holders (see `wait`); `None` where they were not charged (no `--wait-for`,
    /// or neither a tail candidate nor in the uniform sample).
    pub waits: Option<Vec<super::WaitCharge>>,
    /// Probe-site, syscall, socket, sched and sample events that belonged to this request.
    pub hits: Hits,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hits {
    pub sites: u32,
    pub syscalls: u32,
    pub sock: u32,
    pub sched: u32,
    pub samples: u32,
}

impl RequestRecord {
    pub fn total_ns(&self) -> u64 {
        self.t_done_ns - self.t_arrive_ns
    }

    pub fn part_ns(&self, part: Part) -> u64 {
        self.parts[part.index()]
    }

    pub fn overhead_ns(&self) -> u64 {
        self.total_ns() - self.part_ns(Part::Upstream)
    }
}

/// Why a request could not be attributed. Such a request is counted and listed, never guessed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incomplete {
    pub req_id: u64,
    pub reason: String,
}

/// What the rebuild emits as each request ends.
#[derive(Clone, Debug, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "nearly every outcome is Complete; boxing would add an allocation per request"
)]
pub enum Outcome {
    Complete(RequestRecord),
    Incomplete(Incomplete),
}
