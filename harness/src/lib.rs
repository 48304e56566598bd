//! The measurement harness behind `cargo xtask bench`, `profile`, `validate` and
//! `profiles-index`: it starts the gateway, mock-upstream, loadgen and the tracer as pinned
//! processes, measures them, and writes a run's files and README through the typed model
//! (`session`). xtask forwards those commands here and keeps the developer tasks.

pub mod ab;
pub mod baseline;
pub mod bench;
pub mod flags;
pub mod install;
pub mod machine;
pub mod privilege;
pub mod procs;
pub mod procstat;
pub mod profile;
pub mod profiles_index;
pub mod session_dir;
pub mod validate;
pub mod workspace;
