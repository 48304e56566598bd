//! Probe sites: the gateway's only concession to tracing.
//!
//! Each site is a naked `extern "C"` function whose body is the 5-byte NOP
//! `0f 1f 44 00 00` and `ret`. Untraced, a hit costs one call and returns; traced, the tracer's
//! uprobe on the NOP reads the arguments from rdi, rsi, rdx. The gateway never reads a clock
//! for its own measurement: every timestamp comes from the kernel when a site is hit.
//!
//! Each site is also a USDT probe: a `.note.stapsdt` note (provider `gateway`, the name
//! without `gw_probe_`, arguments `8@%rdi 8@%rsi 8@%rdx`) that `readelf -n`, `bpftrace -l` and
//! the tracer read, and that `strip` keeps. See docs/probe-sites.md.
//!
//! The names, argument meanings and phase ids are defined once, in
//! [`tracer_ebpf::sites`]; this module provides one function per [`Site`], and the tests in
//! `gateway/tests/probe_sites.rs` check the built binary against that list.
//!
//! | site | args | where it fires |
//! |---|---|---|
//! | `gw_probe_request_begin` | req_id, client fd, client's x-request-id | handler future created; its first poll follows at once |
//! | `gw_probe_request_end` | req_id, status | handler produced its response, inside its last poll |
//! | `gw_probe_phase` | req_id, phase | the request enters a phase (phases do not nest) |
//! | `gw_probe_poll_enter` | req_id | before each later poll of the task serving the request |
//! | `gw_probe_poll_exit` | req_id | after each poll of that task that leaves the request unfinished |
//! | `gw_probe_ledger_enqueue` | req_id | receipt handed to the writer |
//! | `gw_probe_sign_begin` / `_end` | batch_id, count | writer thread: a batch is sealed (hashed and signed) |
//! | `gw_probe_receipt_durable` | req_id, seq | writer completed this request's waiter |
//!
//! Each phase also runs inside a named phase frame (`gw_phase_<phase>`, see [`in_phase`]): not
//! a probe, an ordinary call that stack samples can see.
//!
//! `req_id` is the probe id: the gateway's own, from [`next_probe_id`], unique in the process
//! and never 0. The client's `x-request-id` may repeat or be 0; it goes only to the receipt,
//! the response header and `request_begin`'s third argument, for the tracer to report.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

pub use tracer_ebpf::sites::{Phase, Site};

macro_rules! probe_site {
    ($name:ident, $probe:literal) => {
        #[unsafe(no_mangle)]
        #[unsafe(naked)]
        pub extern "C" fn $name(_a0: u64, _a1: u64, _a2: u64) {
            // The NOP5 stays the first instruction: the note's pc points at it, and a uprobe at
            // function entry cannot clobber the caller's red zone. The note follows sys/sdt.h
            // (SDT v3): pc, `.stapsdt.base` (to detect prelink), semaphore 0, then provider,
            // name and argument spec. It is not loaded, so untraced it costs nothing.
            core::arch::naked_asm!(
                "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
                "ret",
                ".pushsection .note.stapsdt, \"?\", \"note\"",
                ".balign 4",
                ".4byte 992f - 991f, 994f - 993f, 3",
                "991: .asciz \"stapsdt\"",
                "992: .balign 4",
                "993: .8byte 990b",
                ".8byte _.stapsdt.base",
                ".8byte 0",
                ".asciz \"gateway\"",
                concat!(".asciz \"", $probe, "\""),
                ".asciz \"8@%rdi 8@%rsi 8@%rdx\"",
                "994: .balign 4",
                ".popsection",
                // One base per object; the comdat group keeps one per binary.
                ".ifndef _.stapsdt.base",
                ".pushsection .stapsdt.base, \"aGR\", \"progbits\", .stapsdt.base, comdat",
                ".weak _.stapsdt.base",
                ".hidden _.stapsdt.base",
                "_.stapsdt.base: .space 1",
                ".size _.stapsdt.base, 1",
                ".popsection",
                ".endif",
            )
        }
    };
}

probe_site!(gw_probe_request_begin, "request_begin");
probe_site!(gw_probe_request_end, "request_end");
probe_site!(gw_probe_phase, "phase");
probe_site!(gw_probe_poll_enter, "poll_enter");
probe_site!(gw_probe_poll_exit, "poll_exit");
probe_site!(gw_probe_ledger_enqueue, "ledger_enqueue");
probe_site!(gw_probe_sign_begin, "sign_begin");
probe_site!(gw_probe_sign_end, "sign_end");
probe_site!(gw_probe_receipt_durable, "receipt_durable");

/// Phase frames: a never-inlined function per [`Phase`] (named [`Phase::frame`]) that the
/// phase's work runs inside. A stack sample that holds one fell in that phase, which gives a
/// per-phase split of on-CPU time from samples alone, with no probe hit.
macro_rules! phase_frame {
    ($name:ident, $phase:expr) => {
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "Rust" fn $name(body: &mut dyn FnMut()) {
            body();
            // After the call, so it is no tail jump (which would pop this frame before `body`
            // runs), and different in every frame, so the linker cannot fold them into one.
            std::hint::black_box($phase as u16);
        }
    };
}

phase_frame!(gw_phase_parse, Phase::Parse);
phase_frame!(gw_phase_auth, Phase::Auth);
phase_frame!(gw_phase_scope, Phase::Scope);
phase_frame!(gw_phase_ratelimit, Phase::RateLimit);
phase_frame!(gw_phase_registry, Phase::Registry);
phase_frame!(gw_phase_vault, Phase::Vault);
phase_frame!(gw_phase_upstream, Phase::Upstream);
phase_frame!(gw_phase_receipt, Phase::ReceiptWait);
phase_frame!(gw_phase_respond, Phase::Respond);

fn frame(phase: Phase) -> fn(&mut dyn FnMut()) {
    match phase {
        Phase::Parse => gw_phase_parse,
        Phase::Auth => gw_phase_auth,
        Phase::Scope => gw_phase_scope,
        Phase::RateLimit => gw_phase_ratelimit,
        Phase::Registry => gw_phase_registry,
        Phase::Vault => gw_phase_vault,
        Phase::Upstream => gw_phase_upstream,
        Phase::ReceiptWait => gw_phase_receipt,
        Phase::Respond => gw_phase_respond,
    }
}

/// A fresh probe id: 1, 2, 3, ... (0 means "none" in [`InFlight`]).
pub fn next_probe_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The request enters `phase`; it lasts until the next one begins.
fn phase(req_id: u64, phase: Phase) {
    gw_probe_phase(req_id, phase as u64, 0);
}

/// Runs `body` as `phase` of `req_id`: the phase site first (the exact split, `--phases`),
/// then `body` inside the phase's frame (the sampled split).
pub fn in_phase<R>(req_id: u64, phase: Phase, body: impl FnOnce() -> R) -> R {
    self::phase(req_id, phase);
    let mut body = Some(body);
    let mut out = None;
    frame(phase)(&mut || out = body.take().map(|body| body()));
    out.expect("a phase frame runs its body once")
}

/// [`in_phase`] for a phase that awaits: the site at its first poll, every poll inside the
/// phase's frame.
pub fn in_phase_async<F: Future>(req_id: u64, phase: Phase, inner: F) -> InPhase<F> {
    InPhase {
        req_id,
        phase,
        entered: false,
        inner,
    }
}

pub struct InPhase<F> {
    req_id: u64,
    phase: Phase,
    entered: bool,
    inner: F,
}

impl<F: Future> Future for InPhase<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned; it is never moved out of `self`.
        let this = unsafe { self.get_unchecked_mut() };
        if !this.entered {
            this.entered = true;
            phase(this.req_id, this.phase);
        }
        // SAFETY: see above.
        let mut inner = unsafe { Pin::new_unchecked(&mut this.inner) };
        let mut out = Poll::Pending;
        frame(this.phase)(&mut || out = inner.as_mut().poll(cx));
        out
    }
}

/// The request a connection is serving (0: none), shared by the connection's task and the
/// request's handler. HTTP/1.1 without pipelining serves one request at a time.
#[derive(Clone, Default)]
pub struct InFlight(Arc<AtomicU64>);

impl InFlight {
    /// The handler future of `req_id` (a probe id) is created; its first poll follows at once.
    pub fn begin(&self, req_id: u64, client_fd: u64, client_id: u64) {
        gw_probe_request_begin(req_id, client_fd, client_id);
        self.0.store(req_id, Ordering::Relaxed);
    }

    /// The handler's last act: its response is ready and hyper writes it next.
    pub fn end(&self, req_id: u64, status: u64) {
        self.0.store(0, Ordering::Relaxed);
        gw_probe_request_end(req_id, status, 0);
    }

    /// Whether a request's handler exists (between `begin` and `end`).
    pub fn has_request(&self) -> bool {
        self.current() != 0
    }

    fn current(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Wraps a connection's task so the tracer knows which thread served which request, and when.
/// A poll of the task is a poll of the request in flight on it: hyper's work for the request
/// happens there too. The first such poll starts at `request_begin` and the last one ends at
/// `request_end`, so only the polls between them are bracketed here, and a re-poll of the
/// handler inside one task poll (hyper feeding it the body) costs nothing: every site hit is
/// a trap when traced.
pub struct ConnectionTask<F> {
    in_flight: InFlight,
    inner: F,
}

impl<F> ConnectionTask<F> {
    pub fn new(in_flight: InFlight, inner: F) -> Self {
        ConnectionTask { in_flight, inner }
    }
}

impl<F: Future> Future for ConnectionTask<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned; it is never moved out of `self`.
        let this = unsafe { self.get_unchecked_mut() };
        let before = this.in_flight.current();
        if before != 0 {
            gw_probe_poll_enter(before, 0, 0);
        }
        // SAFETY: see above.
        let out = unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx);
        let after = this.in_flight.current();
        if after != 0 && out.is_pending() {
            gw_probe_poll_exit(after, 0, 0);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_phase_runs_its_body_once_and_returns_its_value() {
        let mut runs = 0;
        let out = in_phase(1, Phase::Auth, || {
            runs += 1;
            "answer"
        });
        assert_eq!((out, runs), ("answer", 1));
    }

    #[test]
    fn in_phase_async_polls_through_to_the_inner_output() {
        let mut polls = 0;
        let inner = std::future::poll_fn(|cx| {
            polls += 1;
            if polls < 3 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(polls)
            }
        });
        let mut phased = std::pin::pin!(in_phase_async(1, Phase::Upstream, inner));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(phased.as_mut().poll(&mut cx).is_pending());
        assert!(phased.as_mut().poll(&mut cx).is_pending());
        assert_eq!(phased.as_mut().poll(&mut cx), Poll::Ready(3));
    }

    #[test]
    fn item_6_probe_ids_are_distinct_and_never_none() {
        let (a, b) = (next_probe_id(), next_probe_id());
        assert_ne!(a, b);
        assert!(a != 0 && b != 0);
        // A client id of 0 (or one already seen) does not hide the request in flight.
        let in_flight = InFlight::default();
        in_flight.begin(a, 3, 0);
        assert_eq!(in_flight.current(), a);
        in_flight.end(a, 200);
        assert_eq!(in_flight.current(), 0);
    }
}
