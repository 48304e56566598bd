//! Rebuild requests from the kernel's event stream and split each one into parts.

pub mod record;

pub use record::{Hits, Incomplete, OffCpu, Outcome, Part, RequestRecord, Slice, StackSample, PARTS};
