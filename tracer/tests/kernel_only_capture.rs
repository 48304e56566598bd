//! Root only: kernel-only capture (issue 20) on nginx, a proxy without probe sites, as a
//! master and one worker in front of mock-upstream. `tracer record --pid <master>` must choose
//! kernel-only mode, follow the worker (a child process, seeded at attach) and the worker a
//! reload forks while it runs (PROCESS events), and write DATA records holding each request's
//! `x-request-id` for both the client read and the upstream write, by the worker.
//!
//! nginx is installed with apt-get when missing (`nginx-light`, else `nginx`). mock-upstream
//! is built as `e2e_gateway` builds it (`cargo build --release -p gateway`), or taken from
//! `TRACER_E2E_BIN_DIR`. What is checked comes from the hidden `--raw-data` dump (every DATA
//! record) and `--raw-events` (PROCESS events), the outputs the kernel-only rebuild will read.

mod attach_common;

use std::{
    collections::HashSet,
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use attach_common::require_root;
use testproc::{Proc, Signal, Spawn};
use tracer::events::data::{Data, Direction, read_dump};
use tracer_ebpf::abi::{DATA_BYTES, kind, syscall};

const READY: Duration = Duration::from_secs(120);
const BODY: &str = r#"{"hello":"kernel-only"}"#;

fn nginx() -> PathBuf {
    let found = || {
        ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .map(PathBuf::from)
            .into_iter()
            .find(|p| p.exists())
    };
    if let Some(path) = found() {
        return path;
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let install = |package: &str| apt(&["install", "-y", "--no-install-recommends", package]);
    if !install("nginx-light") && !install("nginx") {
        assert!(apt(&["update"]), "apt-get update failed");
        assert!(
            install("nginx-light") || install("nginx"),
            "apt-get install nginx failed"
        );
    }
    found().expect("nginx installed but not found in /usr/sbin or /usr/bin")
}

fn mock_upstream() -> PathBuf {
    if let Some(dir) = std::env::var_os("TRACER_E2E_BIN_DIR") {
        return PathBuf::from(dir).join("mock-upstream");
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let output = Command::new(env!("CARGO"))
        .current_dir(workspace)
        .args([
            "build",
            "--release",
            "-p",
            "gateway",
            "--bin",
            "mock-upstream",
        ])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo build");
    assert!(output.status.success(), "cargo build: {}", output.status);
    output
        .stdout
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .filter_map(|message| message["executable"].as_str().map(PathBuf::from))
        .find(|path| path.file_name().is_some_and(|f| f == "mock-upstream"))
        .expect("cargo build produced no mock-upstream")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(spawn: Spawn) -> Proc {
    spawn.start().unwrap_or_else(|e| panic!("{e:#}"))
}

/// The child processes of `pid` (nginx's workers).
fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = entry.unwrap().path().join("children");
        let text = fs::read_to_string(path).unwrap_or_default();
        found.extend(
            text.split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    found
}

/// One keep-alive POST, its response read to the end of its body. `pad`: bytes of an
/// `x-pad` header after the id.
fn request(stream: &mut BufReader<TcpStream>, port: u16, id: &str, pad: usize) {
    let body = BODY;
    let head = format!(
        "POST /echo HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n\
         x-request-id: {id}\r\nx-pad: {}\r\ncontent-length: {}\r\n\r\n{body}",
        "p".repeat(pad),
        body.len()
    );
    stream.get_mut().write_all(head.as_bytes()).unwrap();
    let mut length = None;
    let mut status = String::new();
    stream.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{id}: {status}");
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = Some(value.trim().parse::<usize>().unwrap());
        }
    }
    let mut body = vec![0; length.expect("a content-length")];
    stream.read_exact(&mut body).unwrap();
}

fn connect(port: u16) -> BufReader<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    BufReader::new(stream)
}

fn holds(data: &Data, id: &str) -> bool {
    let needle = format!("x-request-id: {id}\r\n");
    data.bytes
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// The client read and the upstream write of request `id`, both by `worker`: a receive and a
/// send holding the id, on two different fds.
fn assert_both_sides(data: &[Data], id: &str, worker: u32) {
    let with: Vec<&Data> = data.iter().filter(|d| holds(d, id)).collect();
    let read = with
        .iter()
        .find(|d| d.direction() == Direction::Receive)
        .unwrap_or_else(|| panic!("no client read holds {id}: {with:#?}"));
    let write = with
        .iter()
        .find(|d| d.direction() == Direction::Send && d.fd != read.fd)
        .unwrap_or_else(|| panic!("no upstream write holds {id}: {with:#?}"));
    for record in [read, write] {
        assert_eq!(
            record.tgid, worker,
            "{id} seen in another process: {record:#?}"
        );
        assert!(record.exit_ns >= record.enter_ns);
    }
    assert!(read.exit_ns <= write.enter_ns, "{id}: written before read");
    // nginx writes the upstream request as writev [headers, body]: both iovecs gathered.
    assert_eq!(write.syscall, syscall::WRITEV, "{write:#?}");
    assert!(write.whole(), "{write:#?}");
    assert!(write.bytes.ends_with(BODY.as_bytes()), "{write:#?}");
    assert!(
        read.whole() && read.bytes.ends_with(BODY.as_bytes()),
        "{read:#?}"
    );
}

#[test]
fn nginx_worker_followed_and_request_bytes_captured() {
    if !require_root("nginx_worker_followed_and_request_bytes_captured") {
        return;
    }
    let nginx = nginx();
    let upstream_bin = mock_upstream();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (up_port, port) = (free_port(), free_port());
    let conf = root.join("nginx.conf");
    let r = root.display();
    fs::write(
        &conf,
        format!(
            "worker_processes 1;\npid {r}/nginx.pid;\nerror_log {r}/error.log;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log {r}/access.log;\n  client_body_temp_path {r}/body;\n\
             proxy_temp_path {r}/proxy;\n  fastcgi_temp_path {r}/fastcgi;\n\
             uwsgi_temp_path {r}/uwsgi;\n  scgi_temp_path {r}/scgi;\n\
             upstream up {{ server 127.0.0.1:{up_port}; keepalive 8; }}\n\
             server {{\n    listen 127.0.0.1:{port};\n    location / {{ proxy_pass http://up; \
             proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n  }}\n}}\n"
        ),
    )
    .unwrap();

    let _upstream = start(Spawn::new("mock-upstream", &upstream_bin).args([
        "--listen",
        &format!("127.0.0.1:{up_port}"),
        "--delay-ms",
        "0",
    ]));
    wait_until("mock-upstream to listen", READY, || {
        TcpStream::connect(("127.0.0.1", up_port)).is_ok()
    });
    let mut master = start(Spawn::new("nginx", &nginx).args([
        "-c",
        &conf.to_string_lossy(),
        "-g",
        "daemon off;",
    ]));
    let master_pid = master.pid();
    wait_until("nginx to listen with one worker", READY, || {
        TcpStream::connect(("127.0.0.1", port)).is_ok() && children(master_pid).len() == 1
    });
    let old_worker = children(master_pid)[0];

    let tracer = Spawn::new("tracer", env!("CARGO_BIN_EXE_tracer")).args([
        "record",
        "--pid",
        &master_pid.to_string(),
        "--duration",
        "120",
        "--sample-hz",
        "0",
        "--out",
        &root.join("out").to_string_lossy(),
        "--raw-events",
        &root.join("raw.events").to_string_lossy(),
        "--raw-data",
        &root.join("raw.data").to_string_lossy(),
    ]);
    let mut tracer = start(tracer.grace(Duration::from_secs(30)));
    let mode = tracer
        .wait_for_prefix("tracer: mode: ", READY)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        mode.starts_with(&format!("kernel-only (pid {master_pid} runs ")) && mode.contains("nginx"),
        "{mode}"
    );
    tracer
        .wait_for_prefix("tracer: program ids ", READY)
        .unwrap_or_else(|e| panic!("{e:#}"));

    let tag = std::process::id();
    let before: Vec<String> = (0..3).map(|i| format!("ko-{tag}-before-{i}")).collect();
    let mut client = connect(port);
    for id in &before {
        request(&mut client, port, id, 0);
    }
    // Longer than a DATA record holds: its first DATA_BYTES, said honestly.
    let long = format!("ko-{tag}-long");
    request(&mut client, port, &long, 2 * DATA_BYTES);
    drop(client);

    // A reload: the master forks a new worker while traced; the old one exits.
    master.signal(Signal::HUP).unwrap();
    wait_until("the reload's new worker", READY, || {
        children(master_pid).iter().any(|&c| c != old_worker)
    });
    let new_worker = *children(master_pid)
        .iter()
        .find(|&&c| c != old_worker)
        .unwrap();
    wait_until("the old worker to exit", READY, || {
        !Path::new(&format!("/proc/{old_worker}")).exists()
    });
    let after: Vec<String> = (0..3).map(|i| format!("ko-{tag}-after-{i}")).collect();
    let mut client = connect(port);
    for id in &after {
        request(&mut client, port, id, 0);
    }
    drop(client);
    // Past the reorder window, so the last records are in before the stop.
    std::thread::sleep(Duration::from_millis(200));

    tracer.signal(Signal::INT).unwrap();
    tracer.wait_timeout(READY).unwrap();
    let output = tracer.output();
    assert!(output.contains("tracer: --raw-data: "), "{output}");

    let data = read_dump(&fs::read(root.join("raw.data")).unwrap()).unwrap();
    let events = session::analysis::crosscheck::read_dump(&root.join("raw.events")).unwrap();
    for id in &before {
        assert_both_sides(&data, id, old_worker);
    }
    for id in &after {
        assert_both_sides(&data, id, new_worker);
    }
    let truncated = data
        .iter()
        .find(|d| holds(d, &long) && d.direction() == Direction::Receive)
        .unwrap_or_else(|| panic!("no client read holds {long}"));
    assert_eq!(truncated.bytes.len(), DATA_BYTES, "{truncated:#?}");
    assert!(truncated.len > DATA_BYTES as u64 && !truncated.whole());
    // Only the nginx processes are traced (not mock-upstream, not the client).
    let tgids: HashSet<u32> = data.iter().map(|d| d.tgid).collect();
    let nginx_pids = HashSet::from([master_pid, old_worker, new_worker]);
    assert!(tgids.is_subset(&nginx_pids), "{tgids:?} vs {nginx_pids:?}");
    // Records are in exit order, as the stream carried them.
    assert!(data.windows(2).all(|w| w[0].exit_ns <= w[1].exit_ns));
    // The fork was followed and the old worker's exit seen.
    let process: Vec<_> = events.iter().filter(|e| e.kind == kind::PROCESS).collect();
    assert!(
        process
            .iter()
            .any(|e| e.sub == 0 && e.tid == new_worker && e.args[0] == u64::from(master_pid)),
        "no fork of {new_worker} by {master_pid}: {process:?}\n{output}"
    );
    assert!(
        process.iter().any(|e| e.sub == 1 && e.tid == old_worker),
        "no exit of {old_worker}: {process:?}\n{output}"
    );
    assert!(
        output.contains(&format!("forks followed [{new_worker}<-{master_pid}")),
        "{output}"
    );
    drop(master);
}
