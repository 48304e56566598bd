//! Rebuild requests from the kernel's event stream and split each one into parts.
//!
//! [`Rebuilder`] is the whole model (`docs/model.md`); the modules under it each keep
//! one kind of history: [`sockets`] (sk ↔ fd, data arrival), [`threads`] (run state),
//! [`writer`] (fsync and signing intervals), [`cpus`] (who ran on each CPU), [`timeline`]
//! (slices → parts); [`wait`] reads them back to say what held the CPU while a request waited.

mod cpus;
pub mod kernel;
mod rebuild;
pub mod record;
mod sockets;
pub mod synthetic;
mod threads;
mod timeline;
pub mod wait;
mod writer;

pub use rebuild::{HOLD_NS, MARGIN_NS, MAX_OPEN_NS, Rebuilder};
pub use record::{
    Hits, Incomplete, OffCpu, Outcome, PARTS, Part, RequestRecord, Slice, StackSample,
};
pub use wait::{Holder, WaitCharge, WriterWork};
