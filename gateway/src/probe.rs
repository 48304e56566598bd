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
//! | `gw_probe_request_begin` | req_id, client fd | handler future created; its first poll follows at once |
//! | `gw_probe_request_end` | req_id, status | handler produced its response, inside its last poll |
//! | `gw_probe_phase` | req_id, phase | the request enters a phase (phases do not nest) |
//! | `gw_probe_poll_enter` | req_id | before each later poll of the request future |
//! | `gw_probe_poll_exit` | req_id | after each poll that returned pending |
//! | `gw_probe_ledger_enqueue` | req_id | receipt handed to the writer |
//! | `gw_probe_sign_begin` / `_end` | batch_id, count | writer thread: a batch is sealed (hashed and signed) |
//! | `gw_probe_receipt_durable` | req_id, seq | writer completed this request's waiter |

use std::future::Future;
use std::pin::Pin;
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

/// The request enters `phase`; it lasts until the next one begins.
pub fn phase(req_id: u64, phase: Phase) {
    gw_probe_phase(req_id, phase as u64, 0);
}

/// Wraps a request's future so the tracer knows which thread ran which request, and when.
/// The first poll begins at `request_begin` (called just before it) and the last one ends at
/// `request_end` (the handler's last act), so only the polls between them are bracketed here:
/// every site hit is a trap when traced.
pub struct Traced<F> {
    req_id: u64,
    polled: bool,
    inner: F,
}

impl<F> Traced<F> {
    pub fn new(req_id: u64, inner: F) -> Self {
        Traced {
            req_id,
            polled: false,
            inner,
        }
    }
}

impl<F: Future> Future for Traced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned; it is never moved out of `self`.
        let this = unsafe { self.get_unchecked_mut() };
        if this.polled {
            gw_probe_poll_enter(this.req_id, 0, 0);
        }
        this.polled = true;
        // SAFETY: see above.
        let out = unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx);
        if out.is_pending() {
            gw_probe_poll_exit(this.req_id, 0, 0);
        }
        out
    }
}
