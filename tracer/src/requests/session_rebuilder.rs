//! The rebuild a session runs, by its mode: the same ordered stream in, the same outcomes
//! out. The exact mode rebuilds from the gateway's probe sites ([`Rebuilder`]); the
//! kernel-only mode from the data syscalls' bytes ([`KernelOnlyRebuilder`]).

use std::collections::HashMap;

use tracer_ebpf::abi::Event;

use super::kernel::KernelStats;
use super::{KernelOnlyRebuilder, Outcome, Rebuilder};
use crate::events::data::Data;

pub enum SessionRebuilder {
    Exact(Rebuilder),
    KernelOnly(KernelOnlyRebuilder),
}

impl SessionRebuilder {
    pub fn push(&mut self, event: &Event) {
        match self {
            SessionRebuilder::Exact(r) => r.push(event),
            SessionRebuilder::KernelOnly(r) => r.push(event),
        }
    }

    /// A data syscall's bytes; only a kernel-only session has any.
    pub fn data(&mut self, data: &Data) {
        if let SessionRebuilder::KernelOnly(r) = self {
            r.data(data);
        }
    }

    pub fn lost(&mut self, from_ns: u64, to_ns: u64) {
        match self {
            SessionRebuilder::Exact(r) => r.lost(from_ns, to_ns),
            SessionRebuilder::KernelOnly(r) => r.lost(from_ns, to_ns),
        }
    }

    pub fn drain(&mut self) -> Vec<Outcome> {
        match self {
            SessionRebuilder::Exact(r) => r.drain(),
            SessionRebuilder::KernelOnly(r) => r.drain(),
        }
    }

    pub fn finish(&mut self, end_ns: u64) -> Vec<Outcome> {
        match self {
            SessionRebuilder::Exact(r) => r.finish(end_ns),
            SessionRebuilder::KernelOnly(r) => r.finish(end_ns),
        }
    }

    /// The exact mode's kernel figures for the cross-check (its fsync and run-queue
    /// histograms); a kernel-only session has no model of the gateway to check them against.
    pub fn kernel(&self) -> Option<&KernelStats> {
        match self {
            SessionRebuilder::Exact(r) => Some(r.kernel()),
            SessionRebuilder::KernelOnly(_) => None,
        }
    }

    /// Names of the tasks outside the target that took a target thread's CPU (wait-for).
    pub fn task_names(&self) -> Option<&HashMap<u32, String>> {
        match self {
            SessionRebuilder::Exact(r) => Some(r.task_names()),
            SessionRebuilder::KernelOnly(_) => None,
        }
    }

    pub fn established_unclaimed(&self) -> u64 {
        match self {
            SessionRebuilder::Exact(r) => r.established_unclaimed(),
            SessionRebuilder::KernelOnly(r) => r.established_unclaimed(),
        }
    }
}
