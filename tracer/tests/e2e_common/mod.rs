//! What the end-to-end tests share: the release binaries of the other packages, starting
//! servers, and reading the CSVs of a session and of loadgen.
//!
//! The gateway, mock-upstream and loadgen binaries belong to other packages, so cargo does not
//! build them for these tests: `build_binaries` runs `cargo build --release -p gateway -p
//! loadgen` itself (the cargo that runs the test, in the workspace, so `CARGO_TARGET_DIR` and
//! `.cargo/config.toml` apply as for any build) and takes the executables' paths from cargo's
//! JSON messages. With `TRACER_E2E_BIN_DIR` set it takes them from that directory instead
//! (`cargo xtask vmtest` builds them on the host and runs the tests in a guest, which has no
//! toolchain).

#![allow(dead_code, reason = "each test binary uses its own subset")]

use std::{
    collections::BTreeMap,
    fs::File,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use testproc::{Proc, Spawn};

pub struct Binaries {
    pub gateway: PathBuf,
    pub mock_upstream: PathBuf,
    pub loadgen: PathBuf,
}

pub fn build_binaries() -> Binaries {
    if let Some(dir) = std::env::var_os("TRACER_E2E_BIN_DIR") {
        let dir = PathBuf::from(dir);
        return Binaries {
            gateway: dir.join("gateway"),
            mock_upstream: dir.join("mock-upstream"),
            loadgen: dir.join("loadgen"),
        };
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let output = Command::new(env!("CARGO"))
        .current_dir(workspace)
        .args(["build", "--release", "-p", "gateway", "-p", "loadgen"])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo build");
    assert!(
        output.status.success(),
        "cargo build failed: {}",
        output.status
    );
    let executables: Vec<PathBuf> = output
        .stdout
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .filter_map(|message| message["executable"].as_str().map(PathBuf::from))
        .collect();
    let find = |name: &str| {
        executables
            .iter()
            .find(|path| path.file_name().is_some_and(|file| file == name))
            .unwrap_or_else(|| panic!("cargo build produced no `{name}`"))
            .clone()
    };
    Binaries {
        gateway: find("gateway"),
        mock_upstream: find("mock-upstream"),
        loadgen: find("loadgen"),
    }
}

/// Starts `spawn` (a [`Proc`]: stopped and reaped on drop, so a failing assertion leaves
/// nothing running), panicking with why it could not.
pub fn start(spawn: Spawn) -> Proc {
    spawn.start().unwrap_or_else(|e| panic!("{e:#}"))
}

/// Waits for a server's `listening on ADDR` line; its address.
pub fn wait_listening(proc: &mut Proc) -> String {
    proc.wait_for_prefix("listening on ", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// A CSV row: column name → text.
pub type Row = BTreeMap<String, String>;

/// A CSV with a header, as rows.
pub fn read_csv(path: &Path) -> Vec<Row> {
    let mut text = String::new();
    File::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .read_to_string(&mut text)
        .unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    lines
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            assert_eq!(fields.len(), header.len(), "{}: {line}", path.display());
            header
                .iter()
                .zip(fields)
                .map(|(h, f)| ((*h).to_owned(), f.to_owned()))
                .collect()
        })
        .collect()
}

pub fn num(row: &BTreeMap<String, String>, column: &str) -> u64 {
    row.get(column)
        .unwrap_or_else(|| panic!("no column {column}"))
        .parse()
        .unwrap_or_else(|_| panic!("{column} is not a number: {row:?}"))
}
