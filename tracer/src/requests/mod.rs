//! Rebuild requests from the kernel's event stream and split each one into parts.
//!
//! [`Rebuilder`] is the whole model (`docs/model.md`); the modules under it each keep
//! one kind of history: [`sockets`] (sk ↔ fd, data arrival), [`threads`] (run state),
//! [`writer`] (fsync and signing intervals), [`timeline`] (slices → parts).

pub mod kernel;
mod rebuild;
pub mod record;
mod sockets;
pub mod synthetic;
mod threads;
mod timeline;
mod writer;

pub use rebuild::{HOLD_NS, MARGIN_NS, MAX_OPEN_NS, Rebuilder};
pub use record::{
    Hits, Incomplete, OffCpu, Outcome, PARTS, Part, RequestRecord, Slice, StackSample,
};
