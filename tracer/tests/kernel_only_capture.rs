//! Root only: kernel-only capture (issue 20) on proxies without probe sites, in front of
//! mock-upstream.
//!
//! nginx, as a master and one worker: `tracer record --pid <master>` must choose kernel-only
//! mode, follow the worker (a child process, seeded at attach) and the worker a reload forks
//! while it runs (PROCESS events), and write DATA records holding each request's
//! `x-request-id` for both the client read and the upstream write, by the worker.
//!
//! Apache httpd (event MPM, two children), whose mod_proxy writes each upstream request as a
//! writev of an iovec per header line: every such writev must be captured whole, by the
//! children at attach and by those a graceful restart forks, so that every upstream request is
//! parsed (issue 31).
//!
//! The proxies are installed with apt-get when missing, and started as `testproc::proxy`
//! starts them for the other proxy tests. What is checked comes from the hidden `--raw-data`
//! dump (every DATA record), `--raw-events` (PROCESS events) and breakdown.json.

mod attach_common;

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::Path,
    time::{Duration, Instant},
};

use attach_common::{
    Proc, Proxy, Signal, Spawn, build_binaries, installed, mock_upstream, num, open_loop, read_csv,
    require_root, start,
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

/// `tracer record --pid PID` in kernel-only mode with the raw dumps, attached; panics unless
/// it says it traces `binary` kernel-only.
fn record_kernel_only(pid: u32, root: &Path, binary: &str) -> Proc {
    let path = |name: &str| root.join(name).to_string_lossy().into_owned();
    let tracer = Spawn::new("tracer", env!("CARGO_BIN_EXE_tracer")).args([
        "record",
        "--pid",
        &pid.to_string(),
        "--duration",
        "120",
        "--sample-hz",
        "0",
        "--out",
        &path("out"),
        "--raw-events",
        &path("raw.events"),
        "--raw-data",
        &path("raw.data"),
    ]);
    let mut tracer = start(tracer.grace(Duration::from_secs(30)));
    let mode = tracer
        .wait_for_prefix("tracer: mode: ", READY)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        mode.starts_with(&format!("kernel-only (pid {pid} runs ")) && mode.contains(binary),
        "{mode}"
    );
    tracer
        .wait_for_prefix("tracer: program ids ", READY)
        .unwrap_or_else(|e| panic!("{e:#}"));
    tracer
}

/// The x-request-id in a request head, if it has one.
fn request_id(head: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        if !name.eq_ignore_ascii_case("x-request-id") {
            return None;
        }
        value.trim().parse().ok()
    })
}

/// `proxy` in front of mock-upstream (no delay) in a scratch directory, once it listens with
/// `children` child processes: the binaries, the directory, mock-upstream, the proxy's port
/// and its process.
struct Running {
    bins: attach_common::Binaries,
    dir: tempfile::TempDir,
    _upstream: Proc,
    port: u16,
    parent: Proc,
}

fn started_with_children(proxy: Proxy, children: usize) -> Running {
    let bins = build_binaries();
    let dir = tempfile::tempdir().unwrap();
    let (upstream_proc, upstream) = mock_upstream(&bins, "0", "0-1", None);
    let port = free_port().unwrap();
    let spawn = proxy
        .spawn(&installed(proxy), dir.path(), port, &upstream)
        .unwrap();
    let parent = start(spawn);
    let pid = parent.pid();
    wait_until(
        &format!("{proxy:?} to listen with {children} children"),
        READY,
        || TcpStream::connect(("127.0.0.1", port)).is_ok() && descendants_of(pid).len() == children,
    );
    Running {
        bins,
        dir,
        _upstream: upstream_proc,
        port,
        parent,
    }
}

#[test]
fn nginx_worker_followed_and_request_bytes_captured() {
    if !require_root() {
        return;
    }
    let Running {
        bins: _bins,
        dir,
        _upstream,
        port,
        parent: mut master,
    } = started_with_children(Proxy::Nginx, 1);
    let root = dir.path();
    let master_pid = master.pid();
    let old_worker = descendants_of(master_pid)[0];

    let mut tracer = record_kernel_only(master_pid, root, "nginx");

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

#[test]
fn apache_upstream_requests_captured_whole_and_its_children_followed() {
    if !require_root() {
        return;
    }
    // loadgen at 100 req/s for 2 s, twice: before and after a graceful restart.
    const LOAD: (u64, u64, &str) = (100, 2, "4");
    let Running {
        bins,
        dir,
        _upstream,
        port,
        mut parent,
    } = started_with_children(Proxy::Apache, 2);
    let root = dir.path();
    let parent_pid = parent.pid();
    let first: Vec<u32> = descendants_of(parent_pid);

    let mut tracer = record_kernel_only(parent_pid, root, "apache2");
    let url = format!("http://127.0.0.1:{port}");
    let load = |csv: &str| {
        open_loop(
            &bins.loadgen,
            "1",
            &["--url", &url, "--direct"],
            LOAD,
            &root.join(csv),
        );
        let rows = read_csv(&root.join(csv));
        let ok: BTreeSet<u64> = rows
            .iter()
            .filter(|r| r["status"] == "200")
            .map(|r| num(r, "request_id"))
            .collect();
        assert!(
            ok.len() as u64 >= LOAD.0 * LOAD.1 * 8 / 9,
            "Apache answered {} of {} requests with 200",
            ok.len(),
            rows.len()
        );
        ok
    };
    let before = load("client-before.csv");
    // A graceful restart: the old children exit, and the parent forks new ones while traced
    // (as many as its spare-thread rule asks for: one here, more under load).
    parent.signal(Signal::USR1).unwrap();
    wait_until("the restart's children to replace the first", READY, || {
        let now = descendants_of(parent_pid);
        !now.is_empty() && now.iter().all(|c| !first.contains(c))
    });
    let restarted: Vec<u32> = descendants_of(parent_pid);
    let after = load("client-after.csv");
    // Past the reorder window, so the last records are in before the stop.
    std::thread::sleep(Duration::from_millis(200));
    tracer.signal(Signal::INT).unwrap();
    tracer.wait_timeout(READY).unwrap();
    let output = tracer.output();

    let breakdown: session::breakdown::Breakdown =
        serde_json::from_str(&fs::read_to_string(root.join("out/breakdown.json")).unwrap())
            .unwrap();
    let joined = breakdown.kernel_only.expect("a kernel-only session");
    assert_eq!(
        joined
            .unsupported
            .get("header block past the bytes captured"),
        None,
        "{joined:?}\n{output}"
    );
    let ok = before.len() + after.len();
    assert!(
        joined.upstream_requests >= ok as u64,
        "{} upstream requests parsed for {ok} client 200s: {joined:?}",
        joined.upstream_requests
    );

    // Every upstream request head is one writev by a child, captured whole (it is shorter
    // than a record), and each 200 the client got is among them, by the children of its time.
    let data = read_dump(&fs::read(root.join("raw.data")).unwrap()).unwrap();
    let upstream_writes: Vec<&Data> = data
        .iter()
        .filter(|d| d.direction() == Direction::Send && d.bytes.starts_with(b"POST "))
        .collect();
    let mut written = BTreeMap::new();
    for write in &upstream_writes {
        assert_eq!(write.syscall, syscall::WRITEV, "{write:#?}");
        assert!(write.whole() && write.len < DATA_BYTES as u64, "{write:#?}");
        let head_end = write
            .bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no end of the header block: {write:#?}"));
        let id = request_id(&write.bytes[..head_end])
            .unwrap_or_else(|| panic!("no x-request-id: {write:#?}"));
        written.insert(id, write.tgid);
    }
    // The restart's children were followed as forks of the parent.
    let events = session::analysis::crosscheck::read_dump(&root.join("raw.events")).unwrap();
    let forked: Vec<u32> = events
        .iter()
        .filter(|e| e.kind == kind::PROCESS && e.sub == 0 && e.args[0] == u64::from(parent_pid))
        .map(|e| e.tid)
        .collect();
    assert!(
        restarted.iter().all(|c| forked.contains(c)),
        "the restart's children {restarted:?} are not all among the forks followed {forked:?}\n{output}"
    );
    for (ids, children) in [(&before, &first), (&after, &forked)] {
        for id in ids {
            let tgid = written
                .get(id)
                .unwrap_or_else(|| panic!("no upstream writev holds request {id}\n{output}"));
            assert!(
                children.contains(tgid),
                "request {id} written by {tgid}, not one of {children:?}"
            );
        }
    }
    drop(parent);
}
