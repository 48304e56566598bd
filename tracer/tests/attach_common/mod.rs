//! Shared by the attach_* integration tests: a root check that skips loudly, and a fixture
//! target that has every probe site and does real socket, file and scheduler work.
//!
//! The fixture is the test binary itself: the `fixture_child` test re-executed with
//! `TRACER_FIXTURE_SECS` set runs the workload, so the probe-site symbols the tracer looks for
//! are in the very binary it attaches to. They are the gateway's own sites
//! (`gateway::probe`), linked in because [`fixture_main`] calls every one of them.

#![allow(
    dead_code,
    reason = "each test binary uses a different subset; `expect` would fail in the other"
)]

use std::{
    ffi::OsStr,
    io::{IoSlice, IoSliceMut, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use gateway::probe::{
    gw_probe_ledger_enqueue, gw_probe_phase, gw_probe_poll_enter, gw_probe_poll_exit,
    gw_probe_receipt_durable, gw_probe_request_begin, gw_probe_request_end, gw_probe_sign_begin,
    gw_probe_sign_end,
};

pub use testproc::{Proc, Signal, Spawn, Stream, proxy::Proxy};

pub const FIXTURE_ENV: &str = "TRACER_FIXTURE_SECS";
/// How long the fixture may take to listen.
const READY: Duration = Duration::from_secs(120);

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Prints why and returns false when the test cannot run here. The test is named by its
/// thread, which libtest names after it.
pub fn require_root() -> bool {
    if is_root() {
        return true;
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    eprintln!("SKIPPED {test}: needs root (eBPF); CI runs it as root");
    false
}

/// The executables of the tests on a real gateway (the harness's): they belong to other
/// packages, so cargo does not build them for a tracer test.
pub use harness::procs::Binaries;

/// `cargo build --release -p gateway -p loadgen` (the cargo that runs the test, in the
/// workspace, so `CARGO_TARGET_DIR` and `.cargo/config.toml` apply as for any build), taking
/// the executables' paths from cargo's JSON messages.
pub fn cargo_build_binaries() -> Binaries {
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

/// The binaries from `TRACER_E2E_BIN_DIR` when it is set (`cargo xtask vmtest` builds them on
/// the host for a guest without a toolchain), else built by [`cargo_build_binaries`].
pub fn build_binaries() -> Binaries {
    if let Some(dir) = std::env::var_os("TRACER_E2E_BIN_DIR") {
        let dir = PathBuf::from(dir);
        return Binaries {
            gateway: dir.join("gateway"),
            mock_upstream: dir.join("mock-upstream"),
            loadgen: dir.join("loadgen"),
        };
    }
    cargo_build_binaries()
}

/// A CSV row: column name → text.
pub type Row = std::collections::BTreeMap<String, String>;

/// A CSV with a header (a session's or loadgen's, which quote nothing), as rows.
pub fn read_csv(path: &Path) -> Vec<Row> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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

/// The part columns of a requests.csv row: every `*_ns` column but the times and the totals.
pub fn part_columns(row: &Row) -> Vec<String> {
    const NOT_PARTS: [&str; 5] = [
        "t_arrive_ns",
        "t_done_ns",
        "total_ns",
        "overhead_ns",
        "t_upstream_ns",
    ];
    row.keys()
        .filter(|k| k.ends_with("_ns") && !NOT_PARTS.contains(&k.as_str()))
        .cloned()
        .collect()
}

/// The sum of a requests.csv row's parts.
pub fn parts_sum(row: &Row) -> u64 {
    part_columns(row).iter().map(|c| num(row, c)).sum()
}

pub fn num(row: &Row, column: &str) -> u64 {
    row.get(column)
        .unwrap_or_else(|| panic!("no column {column}"))
        .parse()
        .unwrap_or_else(|_| panic!("{column} is not a number: {row:?}"))
}

/// `gateway init --demo` in `dir` in front of `upstream` (a URL), then `gateway serve` with one
/// worker pinned to `cpu`: the running gateway, its URL and the demo API key.
pub fn demo_gateway(
    gateway: &Path,
    dir: &Path,
    upstream: &str,
    cpu: &str,
) -> (Proc, String, String) {
    let db = dir.join("ledger.db");
    let key = demo_init(gateway, &db, upstream);
    let mut served = start(
        Spawn::new("gateway", gateway)
            .arg("serve")
            .arg("--db")
            .arg(&db)
            .args(["--listen", "127.0.0.1:0", "--workers", "1"])
            .cpus(Some(cpu)),
    );
    let url = format!("http://{}", wait_listening(&mut served));
    (served, url, key)
}

/// `gateway init --demo` of `db` in front of `upstream` (a URL): the demo API key.
pub fn demo_init(gateway: &Path, db: &Path, upstream: &str) -> String {
    harness::procs::init_demo_db(gateway, db, upstream).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `proxy`'s binary, installed with apt-get first where it is missing.
pub fn installed(proxy: Proxy) -> PathBuf {
    harness::procs::installed_proxy(proxy).unwrap_or_else(|e| panic!("{e:#}"))
}

/// mock-upstream answering after `delay_ms` (ms, or a range `MIN-MAX` drawn from per
/// request), pinned to `cpu`, logging every request to `log` if given: the process and its
/// address (host:port).
pub fn mock_upstream(
    bins: &Binaries,
    delay_ms: &str,
    cpu: &str,
    log: Option<&Path>,
) -> (Proc, String) {
    let mut spawn = Spawn::new("mock-upstream", &bins.mock_upstream)
        .args(["--listen", "127.0.0.1:0"])
        .args(["--delay-ms", delay_ms])
        .cpus(Some(cpu));
    if let Some(log) = log {
        spawn = spawn.arg("--log-requests").arg(log);
    }
    let mut mock = start(spawn);
    let addr = wait_listening(&mut mock);
    (mock, addr)
}

/// loadgen's open loop, pinned to `cpu`: `rate` requests a second for `seconds` (no warm-up)
/// over `connections` keep-alive connections, against `target` (`--url` and what it needs:
/// `--key K`, or `--direct`), each request logged to `requests_out`. Panics if it fails.
pub fn open_loop(
    loadgen: &Path,
    cpu: &str,
    target: &[&str],
    (rate, seconds, connections): (u64, u64, &str),
    requests_out: &Path,
) {
    testproc::stdout_of(
        Command::new("taskset")
            .args(["-c", cpu])
            .arg(loadgen)
            .args(target)
            .args(["--rate", &rate.to_string()])
            .args(["--duration", &seconds.to_string(), "--warmup", "0"])
            .args(["--connections", connections, "--quiet", "--requests-out"])
            .arg(requests_out),
    );
}

/// A CPU hog at nice -5 (weighted ~3x a nice-0 thread) pinned to `cpu`, named `name` (a shell
/// run through a link of that name in `dir`: the kernel names the task after the link).
pub fn cpu_hog(dir: &Path, name: &str, cpu: &str) -> Proc {
    let link = dir.join(name);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/bin/sh", &link).unwrap();
    let mut command = Command::new("nice");
    command
        .args(["-n", "-5", "taskset", "-c", cpu])
        .arg(&link)
        .args(["-c", "while :; do :; done"]);
    start(Spawn::command("hog", command))
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

pub fn tracer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tracer"))
}

pub fn run_tracer<S: AsRef<OsStr>>(args: &[S]) -> Output {
    tracer()
        .args(args)
        .output()
        .expect("running the tracer binary")
}

/// `tracer record` of `pid` into `out`, attached as [`attach_choice`] says, then `extra`.
pub fn record_args(pid: u32, out: &Path, extra: &[&str]) -> Vec<String> {
    let pid = pid.to_string();
    let out = out.to_str().expect("a UTF-8 temporary path");
    let attach = attach_choice();
    ["record", "--pid", &pid, "--out", out, "--attach", &attach]
        .into_iter()
        .chain(extra.iter().copied())
        .map(str::to_owned)
        .collect()
}

/// The fixture's workload, for `secs` seconds: a client thread opens a new loopback connection
/// per request; the server accepts, reads, hits the sites, fdatasyncs, answers, yields.
pub fn fixture_main(secs: f64) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    println!("listening {addr}");
    std::io::stdout().flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let client = std::thread::spawn(move || {
        let mut n = 0u64;
        while Instant::now() < deadline && n < 100_000 {
            let Ok(mut stream) = TcpStream::connect(addr) else {
                break;
            };
            // Past the deadline the server stops accepting; never wait on it for long.
            stream
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            let _ = stream.write_all(b"ping");
            let mut buf = [0u8; 4];
            let _ = stream.read_exact(&mut buf);
            n += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let log = tempfile::tempfile().unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut req_id = 0u64;
    while Instant::now() < deadline {
        let Ok((mut stream, _)) = listener.accept() else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        stream.set_nonblocking(false).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        req_id += 1;
        gw_probe_request_begin(req_id, stream.as_raw_fd() as u64, 0);
        let mut buf = [0u8; 4];
        let _ = stream.read_exact(&mut buf);
        gw_probe_phase(req_id, 1, 0);
        gw_probe_ledger_enqueue(req_id, 0, 0);
        gw_probe_poll_exit(req_id, 0, 0);
        gw_probe_sign_begin(req_id, 1, 0);
        gw_probe_sign_end(req_id, 1, 0);
        (&log).write_all(b"receipt\n").unwrap();
        log.sync_data().unwrap();
        gw_probe_receipt_durable(req_id, req_id, 0);
        gw_probe_poll_enter(req_id, 0, 0);
        gw_probe_request_end(req_id, 200, 0);
        let _ = stream.write_all(&buf);
        std::thread::yield_now();
    }
    client.join().unwrap();
}

/// With this set, the fixture only listens, on 127.0.0.1 (no client, no accept), until killed.
pub const LISTEN_ONLY_ENV: &str = "TRACER_FIXTURE_LISTEN_ONLY";

/// The listen-only fixture's body.
pub fn listen_only_main() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("listening {}", listener.local_addr().unwrap());
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// With this set, the fixture serves one connection with readv and writev of many small
/// iovecs ([`iov_fixture_main`]), then waits until killed.
pub const IOV_FIXTURE_ENV: &str = "TRACER_FIXTURE_IOV";

/// Bytes the iov fixture's client sends, which the fixture reads with readv into 3-byte
/// buffers.
pub const IOV_FIXTURE_IN: usize = 300;

/// Byte `i` of the iov fixture's stream `seed` (its input is stream 0, its writes 1, 2, 3):
/// a period of 251, so that a byte out of place shows.
pub fn iov_pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 7 + seed * 13) % 251) as u8)
        .collect()
}

/// The iovec lengths of the iov fixture's three writevs: 200 iovecs of 0 to 3 bytes (300
/// bytes, all of them captured); 1000 of one byte (the first 512 captured); 1023 empty ones
/// then 10 bytes (Linux's most iovecs a call, all walked to reach the bytes).
pub fn iov_fixture_writes() -> [Vec<usize>; 3] {
    [
        (0..200).map(|i| i % 4).collect(),
        vec![1; 1000],
        (0..1024).map(|i| if i == 1023 { 10 } else { 0 }).collect(),
    ]
}

/// The iov fixture's body.
pub fn iov_fixture_main() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("listening {}", listener.local_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let (mut conn, _) = listener.accept().unwrap();
    let mut input = vec![0; IOV_FIXTURE_IN];
    let mut filled = 0;
    while filled < input.len() {
        let mut bufs: Vec<IoSliceMut> =
            input[filled..].chunks_mut(3).map(IoSliceMut::new).collect();
        let n = conn.read_vectored(&mut bufs).unwrap();
        assert!(n > 0, "the client closed early");
        filled += n;
    }
    for (k, lens) in iov_fixture_writes().iter().enumerate() {
        let data = iov_pattern(k + 1, lens.iter().sum());
        let mut at = 0;
        let slices: Vec<IoSlice> = lens
            .iter()
            .map(|&len| {
                at += len;
                IoSlice::new(&data[at - len..at])
            })
            .collect();
        // Loopback takes it all at once: one writev, one DATA record.
        assert_eq!(conn.write_vectored(&slices).unwrap(), data.len());
    }
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Starts the iov fixture; returns it and its address.
pub fn spawn_iov_fixture(test_binary: &Path) -> (Proc, std::net::SocketAddr) {
    let (fixture, addr) = spawn_fixture_with(test_binary, IOV_FIXTURE_ENV, "1");
    (fixture, addr.parse().expect("the fixture's address"))
}

/// Starts the fixture for `secs` and waits until it listens; stopped and reaped on drop.
pub fn spawn_fixture(test_binary: &Path, secs: f64) -> Proc {
    spawn_fixture_with(test_binary, FIXTURE_ENV, &secs.to_string()).0
}

/// Starts the listen-only fixture; returns it and its address.
pub fn spawn_listen_only(test_binary: &Path) -> (Proc, std::net::SocketAddr) {
    let (fixture, addr) = spawn_fixture_with(test_binary, LISTEN_ONLY_ENV, "1");
    (fixture, addr.parse().expect("the fixture's address"))
}

fn spawn_fixture_with(test_binary: &Path, env: &str, value: &str) -> (Proc, String) {
    let mut fixture = testproc::Spawn::new("fixture", test_binary)
        .args([
            "--exact",
            "fixture_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env, value)
        .start()
        .unwrap_or_else(|e| panic!("{e:#}"));
    // libtest prints `test fixture_child ... ` on the same line first.
    let addr = fixture
        .wait_for("its listening line", READY, |line| {
            line.split_once("listening ")
                .map(|(_, addr)| addr.trim().to_owned())
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
    (fixture, addr)
}

/// Records a fresh fixture (the test binary `me`) with [`record_args`] and `extra`, which
/// must end the session (`--duration`), then stops the fixture. Panics with the tracer's
/// output unless it succeeded; returns that output (stderr).
pub fn record_fixture(me: &Path, extra: &[&str]) -> String {
    // Killed when done: long enough for a slow (emulated) machine to calibrate and attach.
    let fixture = spawn_fixture(me, 600.0);
    let out = tempfile::tempdir().unwrap();
    let output = run_tracer(&record_args(fixture.pid(), out.path(), extra));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    drop(fixture);
    assert!(output.status.success(), "tracer failed:\n{stderr}");
    stderr
}

/// `TRACER_ATTACH`, the `--attach` value a test passes on (`cargo xtask vmtest` runs the tests
/// once per mode); `auto` when unset.
pub fn attach_choice() -> String {
    std::env::var("TRACER_ATTACH").unwrap_or_else(|_| "auto".to_owned())
}

/// The modes (sched, syscalls, sockets) the groups should be attached with under
/// [`attach_choice`] on this kernel, as the tracer's own detection picks them.
pub fn expected_kinds() -> (String, String, String) {
    let choice = clap::ValueEnum::from_str(&attach_choice(), false)
        .expect("TRACER_ATTACH: auto, tracepoint, kprobe or fentry");
    let plan = tracer::attach::detect::Plan::new(choice).expect("detecting attach modes");
    (
        plan.sched.as_str().to_owned(),
        plan.syscalls.to_string(),
        plan.sockets.to_string(),
    )
}

/// A tracer running in the background, its output collected (a [`testproc::Proc`]: stopped
/// and reaped on drop); [`Self::wait_ready`] blocks until it printed its ready line
/// (`tracer: program ids`), [`Self::stop`] ends its session as Ctrl-C does.
pub struct Background(pub Proc);

impl Background {
    pub fn spawn<S: AsRef<OsStr>>(args: &[S]) -> Background {
        Background(start(
            Spawn::new("tracer", env!("CARGO_BIN_EXE_tracer")).args(args),
        ))
    }

    /// Starts `spawn` (a tracer) and waits until its programs are attached.
    pub fn attached(spawn: Spawn, timeout: Duration) -> Background {
        let mut tracer = Background(start(spawn));
        tracer.wait_ready(timeout);
        tracer
    }

    /// SIGINT, then waits up to `timeout` for the session's files and the exit; its stderr.
    /// Panics with that output unless it exits 0.
    pub fn stop(&mut self, timeout: Duration) -> String {
        self.signal(Signal::INT);
        let status = self
            .0
            .wait_timeout(timeout)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let stderr = self.0.output_of(Stream::Stderr);
        assert!(
            status.success(),
            "{} failed ({status}):\n{stderr}",
            self.0.name()
        );
        stderr
    }

    /// Panics with the tracer's output if it is not attached within `timeout`.
    pub fn wait_ready(&mut self, timeout: Duration) {
        self.wait_for_prefix("tracer: program ids ", timeout);
    }

    /// Panics with the tracer's output unless it prints a line starting with `prefix` within
    /// `timeout`.
    pub fn wait_for_prefix(&mut self, prefix: &str, timeout: Duration) {
        if let Err(err) = self.0.wait_for_prefix(prefix, timeout) {
            panic!("{err:#}");
        }
    }

    pub fn signal(&mut self, signal: Signal) {
        self.0.signal(signal).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Waits for the tracer to exit; returns its status and everything it wrote to stderr.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = self.0.wait().unwrap();
        (status, self.0.output_of(Stream::Stderr))
    }
}

/// uprobe_events lines that name `binary` (ours would, if any were left behind).
pub fn leftover_uprobes(binary: &Path) -> Vec<String> {
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    let name = binary.to_string_lossy().into_owned();
    events
        .lines()
        .filter(|line| line.contains(&name))
        .map(str::to_owned)
        .collect()
}

/// Of `ids`, those still loaded in the kernel a few seconds on. A raw tracepoint link drops
/// its program only after an RCU grace period (tasks trace, since Linux 6.9), so the programs
/// of a tracer that just exited can linger for a moment; none may stay.
pub fn still_loaded(ids: &[u32]) -> Vec<u32> {
    let loaded = || -> Vec<u32> {
        aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .map(|info| info.id())
            .filter(|id| ids.contains(id))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = loaded();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts that nothing of a finished tracer outlives it: none of the programs its stderr
/// names (`tracer: program ids …`, which must be there) is still loaded, and no uprobe names
/// any of `binaries`.
pub fn assert_detached(stderr: &str, binaries: &[&Path]) {
    let ids = program_ids(stderr);
    assert!(!ids.is_empty(), "no program ids line:\n{stderr}");
    assert_eq!(
        still_loaded(&ids),
        Vec::<u32>::new(),
        "programs outlived the tracer"
    );
    for binary in binaries {
        assert_eq!(leftover_uprobes(binary), Vec::<String>::new());
    }
}

/// The ids from the tracer's `tracer: program ids 1,2,3` line.
pub fn program_ids(stderr: &str) -> Vec<u32> {
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("tracer: program ids "))
        .map(|ids| {
            ids.split(',')
                .filter_map(|id| id.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `name=count` pairs from the tracer's `tracer: events ...` line.
pub fn event_counts(stderr: &str) -> Vec<(String, u64)> {
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("tracer: events "))
        .map(|pairs| {
            pairs
                .split_whitespace()
                .filter_map(|pair| pair.split_once('='))
                .map(|(name, count)| (name.to_owned(), count.parse().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}
