//! Proof of the numbers (issue 6): pure analyses over files a session leaves behind.
//!
//! - [`accuracy`]: the tracer's `requests.csv` joined with loadgen's `--requests-out` by
//!   request id, on the one CLOCK_MONOTONIC clock: `client latency − tracer total` must be ≥ 0.
//! - [`ab`]: interleaved traced/untraced windows at one open-loop rate → per-arm percentiles and
//!   traced/untraced ratios with their spread.
//! - [`crosscheck`]: fsync durations and run-queue delays aggregated straight from a raw event
//!   dump, deliberately without the rebuild model, to compare with what the model reports.
//!
//! Everything here reads files and returns numbers; `cargo xtask validate` and `profile` run
//! the sessions and call these directly.

pub mod ab;
pub mod accuracy;
pub mod crosscheck;
pub mod dist;
