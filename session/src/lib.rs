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
pub mod traced;
pub mod validation;

/// The run directories directly under `profiles` that hold a file `name`, sorted: the
/// recorded runs that tests read back.
pub fn runs_holding(
    profiles: &std::path::Path,
    name: &str,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(profiles)? {
        let dir = entry?.path();
        if dir.join(name).is_file() {
            dirs.push(dir);
        }
    }
    dirs.sort();
    Ok(dirs)
}
