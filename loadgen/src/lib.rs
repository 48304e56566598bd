//! An out-of-process load generator for the gateway, honest about the tail: open loop from a
//! fixed schedule with latency taken from the scheduled send (no coordinated omission),
//! closed loop, and a max-throughput search. See `loadgen --help`.

pub mod cli;
pub mod clock;
pub mod conn;
pub mod find_max;
pub mod progress;
pub mod run;
pub mod summary;
pub mod target;

pub use cli::{Args, Report, execute};
