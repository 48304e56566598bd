//! Rebuild requests from the kernel's event stream and split each one into parts.
//!
//! [`Rebuilder`] is the whole model (`docs/model.md`); the modules under it each keep
//! one kind of history: [`sockets`] (sk ↔ fd, data arrival), [`threads`] (run state),
//! [`ledger`] (the writer's fsync and signing intervals), [`cpus`] (who ran on each CPU),
//! [`cover`] (slices → parts); [`wait`] reads them back to say what held the CPU while a request waited.
//!
//! A kernel-only session (a proxy without probe sites) has [`KernelOnlyRebuilder`] instead
//! ([`kernel_only`]): it finds the exchanges in the data syscalls' bytes and splits each on
//! the same thread states, sockets and cover.

mod cover;
mod cpus;
mod held;
pub mod kernel;
pub mod kernel_only;
mod ledger;
pub mod outcome;
mod rebuild;
mod recent;
mod session_rebuilder;
mod sockets;
pub mod synthetic;
mod threads;
pub mod wait;

pub use held::HOLD_NS;
pub use kernel_only::KernelOnlyRebuilder;
pub use outcome::{
    Hits, Incomplete, OffCpu, Outcome, PARTS, Part, RequestRecord, Slice, StackSample,
};
pub use rebuild::{MARGIN_NS, MAX_OPEN_NS, Rebuilder};
pub use session_rebuilder::SessionRebuilder;
pub use wait::{Holder, WaitCharge, WriterWork};
