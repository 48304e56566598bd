//! Probe sites: the gateway's only concession to tracing.
//!
//! Each site is a naked `extern "C"` function whose body is the 5-byte NOP
//! `0f 1f 44 00 00` and `ret`. Untraced, a hit costs one call and returns; traced, the tracer's
//! uprobe on the NOP reads the arguments from rdi, rsi, rdx. The gateway never reads a clock
//! for its own measurement: every timestamp comes from the kernel when a site is hit.
//!
//! The names, argument meanings and phase ids are defined once, in
//! [`tracer_ebpf::sites`]; this module provides one function per [`Site`], and the test
//! `probe_sites_start_with_nop5` checks the built binary against that list.
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
    ($name:ident) => {
        #[unsafe(no_mangle)]
        #[unsafe(naked)]
        pub extern "C" fn $name(_a0: u64, _a1: u64, _a2: u64) {
            core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret")
        }
    };
}

probe_site!(gw_probe_request_begin);
probe_site!(gw_probe_request_end);
probe_site!(gw_probe_phase);
probe_site!(gw_probe_poll_enter);
probe_site!(gw_probe_poll_exit);
probe_site!(gw_probe_ledger_enqueue);
probe_site!(gw_probe_sign_begin);
probe_site!(gw_probe_sign_end);
probe_site!(gw_probe_receipt_durable);

/// A fresh probe id: 1, 2, 3, ... (0 means "none" in [`InFlight`]).
pub fn next_probe_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The request enters `phase`; it lasts until the next one begins.
pub fn phase(req_id: u64, phase: Phase) {
    gw_probe_phase(req_id, phase as u64, 0);
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
