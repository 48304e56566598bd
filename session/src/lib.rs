//! The typed model of a session's files and of the harness's runs.
//!
//! Everything that writes or reads a session file (the tracer, loadgen, the harness and the
//! renderers of recorded runs) goes through these types, so a renamed or missing key is a
//! compile error or a parse error, never a "—" in a README. No build script and no eBPF
//! toolchain: any crate can depend on it.

pub mod analysis;
pub mod bench;
pub mod breakdown;
pub mod effect;
pub mod json;
pub mod loadgen;
pub mod machine;
pub mod pictures;
pub mod requests;
pub mod stats;
pub mod targets;
pub mod validation;
