//! Idle and slow-header connections under a common `ulimit -n 1024`: they cannot exhaust the
//! gateway's descriptors (issue 21, item 13), nor keep a new client out until their header
//! timeout (issue 37, item 1).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use common::{Demo, spawn_command_logged, try_act_within};
use rustix::process::{Resource, Rlimit, setrlimit};

const OK_BODY: &str =
    r#"{"service":"demo","action":"echo","on_behalf_of":"user-1","params":{"n":1}}"#;
const IDLE: usize = 2000;
const SLOW_HEADER: usize = 1000;
const SECOND: Duration = Duration::from_secs(1);

/// `gateway serve` whose open-file limit is `ulimit -n 1024`, set in the child only.
fn serve_under_ulimit_1024(demo: &Demo, extra: &[&str], log: &std::path::Path) -> common::Proc {
    let mut command = common::gateway_serve_command(&demo.db, extra);
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(|| {
            let limit = Rlimit {
                current: Some(1024),
                maximum: Some(1024),
            };
            Ok(setrlimit(Resource::Nofile, limit)?)
        });
    }
    spawn_command_logged(command, log)
}

#[test]
fn item_13_slowloris_under_ulimit_1024_is_bounded() {
    let demo = Demo::new();
    let log = demo.dir.path().join("gateway.log");
    let mut server = serve_under_ulimit_1024(&demo, &["--header-timeout-ms", "1000"], &log);

    // Connections the gateway refuses outright are fine; what it accepts must not starve it.
    let addr: std::net::SocketAddr = server.addr.parse().expect("address");
    let mut held = Vec::new();
    let flood_deadline = Instant::now() + Duration::from_secs(10);
    for i in 0..IDLE + SLOW_HEADER {
        // Against a gateway that stopped accepting, each connect waits out its timeout.
        if Instant::now() > flood_deadline {
            break;
        }
        let Ok(mut stream) = TcpStream::connect_timeout(&addr, SECOND) else {
            continue;
        };
        if i >= IDLE {
            let _ = stream.write_all(b"POST /v1/act HTTP/1.1\r\nhost: x\r\nx-slow: ");
        }
        held.push(stream);
    }

    let flooded = Instant::now();
    // Slots held by the flood free up at the 1 s header timeout.
    loop {
        match try_act_within(&server.addr, Some(&demo.key), Some(1), OK_BODY, SECOND) {
            Ok(reply) if reply.status == 200 => break,
            _ if flooded.elapsed() > Duration::from_secs(5) => {
                panic!("no request served within 5 s of the flood")
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }

    // Every flood connection ends: closed over the limit, or by the header timeout.
    for stream in &mut held {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut sink = Vec::new();
        match stream.read_to_end(&mut sink) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            Err(e) => panic!("a flood connection is still open after 10 s: {e}"),
        }
    }
    drop(held);
    let started = Instant::now();
    let reply = try_act_within(&server.addr, Some(&demo.key), Some(2), OK_BODY, SECOND)
        .expect("after the flood");
    assert_eq!(reply.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "served in {:?} once the flood is gone",
        started.elapsed()
    );
    assert!(
        server.proc.try_wait().expect("try_wait").is_none(),
        "the gateway exited"
    );
    drop(server);

    let log = std::fs::read_to_string(&log).expect("log");
    let accept_errors = log.lines().filter(|l| l.starts_with("accept:")).count();
    assert!(
        accept_errors <= 1,
        "accept errors logged {accept_errors} times:\n{log}"
    );
}

/// Connections the flood of issue 37 item 1 opens: half idle, half stopped inside their head.
const FLOOD: usize = 3000;
/// The gateway's default `--header-timeout-ms`: until then nothing but the cap's reclaim
/// frees a flood connection's slot.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the normal request may take. The reclaim answers it within milliseconds; 10 s
/// leaves room for a shared 2-core VM busy compiling, and is still far from the 30 s after
/// which the header timeout would have freed slots on its own.
const SERVED_WITHIN: Duration = Duration::from_secs(10);

#[test]
fn issue37_item1_slow_headers_at_the_cap_give_way_to_a_new_client() {
    // Room for this flood and item 13's, which may run at the same time in this process.
    if !raise_own_nofile(2 * FLOOD as u64 + 1024) {
        return;
    }
    let demo = Demo::new();
    let log = demo.dir.path().join("gateway.log");
    // The default header timeout (30 s): only the reclaim can make room in time.
    let server = serve_under_ulimit_1024(&demo, &[], &log);
    let addr: std::net::SocketAddr = server.addr.parse().expect("address");

    let flood_started = Instant::now();
    let mut held = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        let Ok(mut stream) = TcpStream::connect_timeout(&addr, SECOND) else {
            continue;
        };
        if i % 2 == 1 {
            // A refused connection may already be reset; the flood goes on regardless.
            let _ = stream.write_all(b"POST /v1/act HTTP/1.1\r\nHost: x\r\n");
        }
        held.push(stream);
    }
    let flooded = flood_started.elapsed();
    // A connection refused outright still counts; one whose connect timed out (a SYN dropped
    // while the backlog was full) does not.
    assert!(
        held.len() >= FLOOD * 9 / 10,
        "only {} of {FLOOD} flood connections were made",
        held.len()
    );

    let sent = Instant::now();
    let reply = try_act_within(
        &server.addr,
        Some(&demo.key),
        Some(1),
        OK_BODY,
        SERVED_WITHIN,
    );
    let took = sent.elapsed();
    eprintln!(
        "{} flood connections held, opened in {flooded:?}; the normal request took {took:?}",
        held.len()
    );
    let reply = reply.unwrap_or_else(|e| panic!("the normal request after the flood: {e}"));
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(took < SERVED_WITHIN, "served in {took:?}");
    assert!(
        flood_started.elapsed() < HEADER_TIMEOUT,
        "the flood and the request took {:?}: the header timeout may have made the room",
        flood_started.elapsed()
    );
    drop(held);
    drop(server);

    let log = std::fs::read_to_string(&log).expect("log");
    assert!(
        log.lines()
            .any(|l| l.starts_with("connections: at the cap")),
        "no reclaim logged:\n{log}"
    );
}

/// Raises this process's soft open-file limit to `want` (the hard limit too, as root): the
/// flood's sockets are this process's descriptors. False, having said why, when it cannot.
fn raise_own_nofile(want: u64) -> bool {
    use rustix::process::getrlimit;
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|soft| soft >= want) {
        return true;
    }
    let raised = Rlimit {
        current: Some(want),
        // None is unlimited: left so.
        maximum: limit.maximum.map(|hard| hard.max(want)),
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        return true;
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    eprintln!(
        "SKIPPED {test}: needs {want} open files (hard limit {:?}; raising it needs root's \
         CAP_SYS_RESOURCE)",
        limit.maximum
    );
    false
}
