//! Probe sites: `extern "C"` functions in the gateway whose first instruction is a 5-byte NOP
//! (`0f 1f 44 00 00`) followed by `ret`. Untraced they cost one call; traced, the kernel
//! replaces the NOP with a breakpoint-free uprobe (~0.3 µs a hit). Arguments arrive in
//! rdi, rsi, rdx (up to three `u64`).
//!
//! The gateway defines one function per [`Site`], named [`Site::symbol`]; the tracer attaches
//! one uprobe to each and writes an [`crate::abi::Event`] with `kind = SITE`, `sub = site id`.

/// The first bytes of every probe site.
pub const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// Every probe site, in id order. `Site as u16` is the event's `sub`.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Site {
    /// (req_id, client socket fd): the request's handler future is created.
    RequestBegin = 0,
    /// (req_id, HTTP status): the handler produced its response.
    RequestEnd = 1,
    /// (req_id, phase id, aux): a phase starts. For `Phase::Upstream`, aux is the upstream
    /// connection's socket fd; otherwise 0.
    PhaseBegin = 2,
    /// (req_id, phase id): a phase ends.
    PhaseEnd = 3,
    /// (req_id): the request's future is about to be polled, on the calling thread.
    PollEnter = 4,
    /// (req_id, ready: 1 if the poll completed the future): the poll returned.
    PollExit = 5,
    /// (req_id): the receipt was handed to the ledger writer.
    LedgerEnqueue = 6,
    /// (batch_id, record count): on the writer thread, a batch starts.
    BatchBegin = 7,
    /// (batch_id, seq): on the writer thread, signing of one record starts.
    SignBegin = 8,
    /// (batch_id, seq): signing of one record ends.
    SignEnd = 9,
    /// (batch_id): the batch's transaction commit (insert + fdatasync) starts.
    CommitBegin = 10,
    /// (batch_id): the commit returned; every record of the batch is durable.
    CommitEnd = 11,
    /// (req_id, seq): the writer completed this request's waiter.
    ReceiptDurable = 12,
}

impl Site {
    pub const ALL: [Site; 13] = [
        Site::RequestBegin,
        Site::RequestEnd,
        Site::PhaseBegin,
        Site::PhaseEnd,
        Site::PollEnter,
        Site::PollExit,
        Site::LedgerEnqueue,
        Site::BatchBegin,
        Site::SignBegin,
        Site::SignEnd,
        Site::CommitBegin,
        Site::CommitEnd,
        Site::ReceiptDurable,
    ];

    /// The gateway's exported symbol for this site.
    pub const fn symbol(self) -> &'static str {
        match self {
            Site::RequestBegin => "gw_probe_request_begin",
            Site::RequestEnd => "gw_probe_request_end",
            Site::PhaseBegin => "gw_probe_phase_begin",
            Site::PhaseEnd => "gw_probe_phase_end",
            Site::PollEnter => "gw_probe_poll_enter",
            Site::PollExit => "gw_probe_poll_exit",
            Site::LedgerEnqueue => "gw_probe_ledger_enqueue",
            Site::BatchBegin => "gw_probe_batch_begin",
            Site::SignBegin => "gw_probe_sign_begin",
            Site::SignEnd => "gw_probe_sign_end",
            Site::CommitBegin => "gw_probe_commit_begin",
            Site::CommitEnd => "gw_probe_commit_end",
            Site::ReceiptDurable => "gw_probe_receipt_durable",
        }
    }

    pub fn from_id(id: u16) -> Option<Site> {
        Site::ALL.get(usize::from(id)).copied()
    }
}

/// Phases of a `/v1/act` request, in request order. `Phase as u64` is the phase id argument.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Parse = 1,
    Auth = 2,
    Scope = 3,
    RateLimit = 4,
    Registry = 5,
    Vault = 6,
    Upstream = 7,
    ReceiptWait = 8,
    Respond = 9,
}

impl Phase {
    pub const ALL: [Phase; 9] = [
        Phase::Parse,
        Phase::Auth,
        Phase::Scope,
        Phase::RateLimit,
        Phase::Registry,
        Phase::Vault,
        Phase::Upstream,
        Phase::ReceiptWait,
        Phase::Respond,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Phase::Parse => "parse",
            Phase::Auth => "auth",
            Phase::Scope => "scope",
            Phase::RateLimit => "ratelimit",
            Phase::Registry => "registry",
            Phase::Vault => "vault",
            Phase::Upstream => "upstream",
            Phase::ReceiptWait => "receipt",
            Phase::Respond => "respond",
        }
    }

    pub fn from_id(id: u64) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| *p as u64 == id)
    }
}
