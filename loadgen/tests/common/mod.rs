//! Shared by the loopback tests: the mock-upstream binary, run as a child process, and the
//! loadgen binary under test.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

/// Builds `mock-upstream` once per test binary, into the target dir this test runs from (so
/// no second copy of the gateway's dependencies is compiled), or takes `MOCK_UPSTREAM_BIN`.
pub fn mock_upstream_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("MOCK_UPSTREAM_BIN") {
            return PathBuf::from(bin);
        }
        // …/<target>/<profile>/deps/<test binary>
        let exe = std::env::current_exe().expect("test binary path");
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("profile dir");
        let target_dir = profile_dir.parent().expect("target dir");
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut build = Command::new(cargo);
        build
            .args([
                "build",
                "--quiet",
                "-p",
                "gateway",
                "--bin",
                "mock-upstream",
                "--manifest-path",
                manifest,
            ])
            .arg("--target-dir")
            .arg(target_dir);
        if profile_dir
            .file_name()
            .is_some_and(|name| name == "release")
        {
            build.arg("--release");
        }
        let status = build
            .status()
            .expect("running cargo build for mock-upstream");
        assert!(status.success(), "building mock-upstream failed");
        profile_dir.join("mock-upstream")
    })
    .clone()
}

/// A running mock-upstream, stopped and reaped when dropped (a [`testproc::Proc`]).
pub struct MockUpstream {
    _proc: testproc::Proc,
    pub url: String,
}

impl MockUpstream {
    pub fn start() -> Self {
        let mut proc = testproc::Spawn::new("mock-upstream", mock_upstream_bin())
            .args(["--listen", "127.0.0.1:0"])
            .start()
            .unwrap_or_else(|e| panic!("{e:#}"));
        let addr = proc
            .wait_for_prefix("listening on ", Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{e:#}"));
        MockUpstream {
            _proc: proc,
            url: format!("http://{addr}"),
        }
    }
}

pub fn loadgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .arg("--quiet")
        .output()
        .expect("running loadgen")
}

/// `loadgen --url URL --direct ARGS` writing its summary and per-request log into a temp
/// dir; panics with loadgen's stderr if it fails. Returns the summary and the rows.
pub fn run_direct(url: &str, args: &[&str]) -> (serde_json::Value, Vec<Row>) {
    let dir = tempfile::tempdir().unwrap();
    let (json, csv) = (dir.path().join("run.json"), dir.path().join("requests.csv"));
    let mut all = vec!["--url", url, "--direct"];
    all.extend_from_slice(args);
    all.extend(["--out", json.to_str().unwrap()]);
    all.extend(["--requests-out", csv.to_str().unwrap()]);
    testproc::succeeded_stdout("loadgen", loadgen(&all));
    (read_json(&json), read_csv(&csv))
}

pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("reading JSON")).expect("valid JSON")
}

pub struct Row {
    pub id: u64,
    pub scheduled_ns: u64,
    pub sent_ns: u64,
    pub received_ns: u64,
    pub status: u16,
    pub warmup: bool,
    /// The connection's local port (0: never connected).
    pub local_port: u16,
}

pub fn read_csv(path: &std::path::Path) -> Vec<Row> {
    let text = std::fs::read_to_string(path).expect("reading CSV");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("request_id,scheduled_ns,sent_ns,received_ns,status,error,warmup,local_port")
    );
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 8, "row {line:?}");
            Row {
                id: f[0].parse().unwrap(),
                scheduled_ns: f[1].parse().unwrap(),
                sent_ns: f[2].parse().unwrap(),
                received_ns: f[3].parse().unwrap(),
                status: f[4].parse().unwrap(),
                warmup: f[6] == "1",
                local_port: f[7].parse().unwrap(),
            }
        })
        .collect()
}
