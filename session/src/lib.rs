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

/// A `kB` field of a /proc/PID/status text, in KiB: the memory figures the tracer's cost and
/// the harness's runs record (`VmHWM`, `VmRSS`).
pub fn proc_status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_fields() {
        let status = "Name:\tx\nVmHWM:\t  1234 kB\nVmRSS:\t 99 kB\n";
        assert_eq!(proc_status_kib(status, "VmHWM"), Some(1234));
        assert_eq!(proc_status_kib(status, "VmRSS"), Some(99));
        assert_eq!(proc_status_kib(status, "Vm"), None);
        let status = "Name:\ttracer\nVmHWM:\t  40960 kB\nVmRSS:\t 2048 kB\n";
        assert_eq!(proc_status_kib(status, "VmHWM"), Some(40_960));
        assert_eq!(proc_status_kib(status, "VmRSS"), Some(2_048));
        assert_eq!(proc_status_kib(status, "VmSwap"), None);
    }
}
