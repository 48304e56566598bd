//! Probe sites: `extern "C"` functions in the gateway whose first instruction is a 5-byte NOP
//! (`0f 1f 44 00 00`) followed by `ret`. Untraced they cost one call; traced, the kernel
//! replaces the NOP with a breakpoint-free uprobe (~0.3 µs a hit). Arguments arrive in
//! rdi, rsi, rdx (up to three `u64`).
//!
//! The gateway defines one function per [`Site`], named [`Site::symbol`], and describes it in a
//! USDT note (`.note.stapsdt`) of provider [`USDT_PROVIDER`] named [`Site::probe_name`]. The
//! tracer finds each site by its note (by its symbol when the binary has no notes), attaches
//! one uprobe to each and writes an [`crate::abi::Event`] with `kind = SITE`, `sub = site id`.

/// The first bytes of every probe site.
pub const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// The provider of the gateway's USDT notes: `usdt:PATH:gateway:request_begin` etc.
pub const USDT_PROVIDER: &str = "gateway";

/// The argument spec of every site's USDT note: three `u64` in rdi, rsi, rdx.
pub const USDT_ARGS: &str = "8@%rdi 8@%rsi 8@%rdx";

/// Every probe site, in id order. `Site as u16` is the event's `sub`.
///
/// A request's polls are the polls of the task that serves it (its connection's: hyper's work
/// for the request happens there too). The first one starts at `RequestBegin` and the last one
/// ends at `RequestEnd`, so `PollEnter` / `PollExit` mark only the polls in between: each hit
/// is a trap, ~1 µs in place.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Site {
    /// (req_id, client socket fd, client's x-request-id): the request's handler future is
    /// created, on the thread that goes on to poll it for the first time: the first poll starts
    /// here. `req_id` in every site is the gateway's probe id (unique, never 0); the client's
    /// id may repeat and is only reported.
    RequestBegin = 0,
    /// (req_id, HTTP status): the handler produced its response; its last poll ends here.
    RequestEnd = 1,
    /// (req_id, phase id): the request enters a phase. Phases do not nest: one lasts until
    /// the next begins. Attached only with `--phases`.
    Phase = 2,
    /// (req_id): a later poll of the task serving the request starts, on the calling thread.
    PollEnter = 3,
    /// (req_id): that poll returned with the request unfinished.
    PollExit = 4,
    /// (req_id): the receipt was handed to the ledger writer.
    LedgerEnqueue = 5,
    /// (batch_id, record count): on the writer thread, sealing (hash + sign) of a batch starts.
    SignBegin = 6,
    /// (batch_id): the batch is sealed; the insert and commit follow.
    SignEnd = 7,
    /// (req_id, seq): the writer completed this request's waiter; its receipt is durable.
    ReceiptDurable = 8,
}

impl Site {
    pub const ALL: [Site; 9] = [
        Site::RequestBegin,
        Site::RequestEnd,
        Site::Phase,
        Site::PollEnter,
        Site::PollExit,
        Site::LedgerEnqueue,
        Site::SignBegin,
        Site::SignEnd,
        Site::ReceiptDurable,
    ];

    /// The gateway's exported symbol for this site.
    pub const fn symbol(self) -> &'static str {
        match self {
            Site::RequestBegin => "gw_probe_request_begin",
            Site::RequestEnd => "gw_probe_request_end",
            Site::Phase => "gw_probe_phase",
            Site::PollEnter => "gw_probe_poll_enter",
            Site::PollExit => "gw_probe_poll_exit",
            Site::LedgerEnqueue => "gw_probe_ledger_enqueue",
            Site::SignBegin => "gw_probe_sign_begin",
            Site::SignEnd => "gw_probe_sign_end",
            Site::ReceiptDurable => "gw_probe_receipt_durable",
        }
    }

    /// The site's USDT probe name: its symbol without `gw_probe_`.
    pub fn probe_name(self) -> &'static str {
        let symbol = self.symbol();
        symbol.strip_prefix("gw_probe_").unwrap_or(symbol)
    }

    /// Whether the split needs this site. The others (per-phase on-CPU time) are options.
    pub const fn needed(self) -> bool {
        !matches!(self, Site::Phase)
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

    /// The gateway's phase frame: a never-inlined function that the phase's work runs inside,
    /// so that a stack sample names its phase with no probe hit (the sampled per-phase split).
    pub const fn frame(self) -> &'static str {
        match self {
            Phase::Parse => "gw_phase_parse",
            Phase::Auth => "gw_phase_auth",
            Phase::Scope => "gw_phase_scope",
            Phase::RateLimit => "gw_phase_ratelimit",
            Phase::Registry => "gw_phase_registry",
            Phase::Vault => "gw_phase_vault",
            Phase::Upstream => "gw_phase_upstream",
            Phase::ReceiptWait => "gw_phase_receipt",
            Phase::Respond => "gw_phase_respond",
        }
    }

    /// The phase whose frame is named `name`.
    pub fn from_frame(name: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.frame() == name)
    }
}
