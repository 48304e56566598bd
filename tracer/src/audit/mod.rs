//! What every `tracer record` keeps so its numbers can be checked from outside, kept in one
//! place so record.rs only forwards: the optional raw event dump (`--raw-events`, for the
//! cross-check in `session::analysis::crosscheck`), the loss spans, and the tracer's own cost
//! (BPF run time, CPU, RSS). The analyses themselves are pure and live in `session`.

pub mod cost;
pub mod hooks;
pub mod raw_dump;
