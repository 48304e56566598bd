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
//! | `gw_probe_request_begin` | req_id, client fd | handler future created |
//! | `gw_probe_request_end` | req_id, status | handler produced its response |
//! | `gw_probe_phase_begin` | req_id, phase, aux | a phase starts (aux = upstream fd for `upstream`) |
//! | `gw_probe_phase_end` | req_id, phase | a phase ends |
//! | `gw_probe_poll_enter` | req_id | before each poll of the request future |
//! | `gw_probe_poll_exit` | req_id, ready | after each poll |
//! | `gw_probe_ledger_enqueue` | req_id | receipt handed to the writer |
//! | `gw_probe_batch_begin` | batch_id, count | writer thread: a batch starts |
//! | `gw_probe_sign_begin` / `_end` | batch_id, seq | writer thread: one record's signature |
//! | `gw_probe_commit_begin` / `_end` | batch_id | writer thread: insert + commit (fdatasync) |
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
probe_site!(gw_probe_phase_begin);
probe_site!(gw_probe_phase_end);
probe_site!(gw_probe_poll_enter);
probe_site!(gw_probe_poll_exit);
probe_site!(gw_probe_ledger_enqueue);
probe_site!(gw_probe_batch_begin);
probe_site!(gw_probe_sign_begin);
probe_site!(gw_probe_sign_end);
probe_site!(gw_probe_commit_begin);
probe_site!(gw_probe_commit_end);
probe_site!(gw_probe_receipt_durable);

/// Marks one phase of one request: `phase_begin` now, `phase_end` when dropped, so every exit
/// path (early returns and `?` included) closes the phase.
pub struct PhaseGuard {
    req_id: u64,
    phase: Phase,
}

impl PhaseGuard {
    pub fn begin(req_id: u64, phase: Phase) -> Self {
        Self::begin_with(req_id, phase, 0)
    }

    pub fn begin_with(req_id: u64, phase: Phase, aux: u64) -> Self {
        gw_probe_phase_begin(req_id, phase as u64, aux);
        PhaseGuard { req_id, phase }
    }
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        gw_probe_phase_end(self.req_id, self.phase as u64, 0);
    }
}

/// Wraps a request's future so every poll is bracketed by `poll_enter` / `poll_exit`: this is
/// how the tracer knows which thread ran which request, and when.
pub struct Traced<F> {
    req_id: u64,
    inner: F,
}

impl<F> Traced<F> {
    pub fn new(req_id: u64, inner: F) -> Self {
        Traced { req_id, inner }
    }
}

impl<F: Future> Future for Traced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned; it is never moved out of `self`.
        let this = unsafe { self.get_unchecked_mut() };
        gw_probe_poll_enter(this.req_id, 0, 0);
        // SAFETY: see above.
        let out = unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx);
        gw_probe_poll_exit(this.req_id, u64::from(out.is_ready()), 0);
        out
    }
}
