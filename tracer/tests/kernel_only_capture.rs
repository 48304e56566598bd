//! Root only: kernel-only capture (issue 20) on nginx, a proxy without probe sites, as a
//! master and one worker in front of mock-upstream. `tracer record --pid <master>` must choose
//! kernel-only mode, follow the worker (a child process, seeded at attach) and the worker a
//! reload forks while it runs (PROCESS events), and write DATA records holding each request's
//! `x-request-id` for both the client read and the upstream write, by the worker.
//!
//! nginx is installed with apt-get when missing, and started as `testproc::proxy` starts it
//! for the other proxy tests. What is checked comes from the hidden `--raw-data` dump (every DATA
//! record) and `--raw-events` (PROCESS events), the outputs the kernel-only rebuild will read.

mod attach_common;

use std::{
    collections::HashSet,
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::Path,
    time::{Duration, Instant},
};

use attach_common::{
    Proxy, Signal, Spawn, build_binaries, installed, mock_upstream, require_root, start,
};
use testproc::proxy::free_port;
use tracer::attach::target::descendants_of;
use tracer::events::data::{Data, Direction, read_dump};
use tracer_ebpf::abi::{DATA_BYTES, kind, syscall};

const READY: Duration = Duration::from_secs(120);
const BODY: &str = r#"{"hello":"kernel-only"}"#;

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
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
    if !require_root() {
        return;
    }
    let bins = build_binaries();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (_upstream, upstream) = mock_upstream(&bins, "0", "0-1", None);
    let port = free_port().unwrap();
    let spawn = Proxy::Nginx
        .spawn(&installed(Proxy::Nginx), root, port, &upstream)
        .unwrap();
    let mut master = start(spawn);
    let master_pid = master.pid();
    wait_until("nginx to listen with one worker", READY, || {
        TcpStream::connect(("127.0.0.1", port)).is_ok() && descendants_of(master_pid).len() == 1
    });
    let old_worker = descendants_of(master_pid)[0];

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
        descendants_of(master_pid).iter().any(|&c| c != old_worker)
    });
    let new_worker = *descendants_of(master_pid)
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
    // Only bytes a socket moved: the worker wrote an access-log line (to a file) for each
    // request, and none of them is a DATA record.
    let log = fs::read_to_string(root.join("access.log")).unwrap();
    let line_start = b"127.0.0.1 - - [";
    assert!(
        log.lines()
            .filter(|l| l.as_bytes().starts_with(line_start))
            .count()
            >= before.len() + 1 + after.len(),
        "{log}"
    );
    assert!(
        !data.iter().any(|d| d.bytes.starts_with(line_start)),
        "an access-log write is a DATA record"
    );
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
