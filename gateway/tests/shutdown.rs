//! Issue 21, item 14: no upstream action without a receipt, when the gateway is stopped with
//! SIGTERM under load or a client resets mid-request.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Demo, gateway_serve, spawn_listening, try_act, wait_exit, without_receipt};
use rustix::net::sockopt::set_socket_linger;
use testproc::Signal;

const CLIENTS: u64 = 8;
const RESETTERS: u64 = 4;

fn body(id: u64) -> String {
    format!(
        r#"{{"service":"demo","action":"echo","on_behalf_of":"user-1","params":{{"id":{id}}}}}"#
    )
}

/// The demo gateway's ledger over a mock upstream that answers after `delay_ms` and logs
/// each request id it acts on to `ids_log`.
fn demo_logging_ids(ids_log: &Path, delay_ms: &str) -> Demo {
    let upstream = spawn_listening(
        env!("CARGO_BIN_EXE_mock-upstream"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--delay-ms",
            delay_ms,
            "--log-ids",
            ids_log.to_str().expect("utf-8"),
        ],
    );
    Demo::with_upstream(upstream)
}

/// The request ids the upstream acted on.
fn ids_seen(ids_log: &Path) -> Vec<u64> {
    std::fs::read_to_string(ids_log)
        .expect("upstream ids")
        .lines()
        .map(|l| l.parse().expect("id line"))
        .collect()
}

/// Sends an act request, waits until it is surely at the upstream, then resets the connection.
fn act_and_reset(addr: &str, key: &str, id: u64) {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return;
    };
    let body = body(id);
    let request = format!(
        "POST /v1/act HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\n\
         x-request-id: {id}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return;
    }
    std::thread::sleep(Duration::from_millis(100));
    // Linger 0: close sends RST, not FIN.
    let _ = set_socket_linger(&stream, Some(Duration::ZERO));
}

#[test]
fn item_14_sigterm_and_client_resets_leave_no_action_without_receipt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ids_log = dir.path().join("upstream-ids");
    let demo = demo_logging_ids(&ids_log, "300");
    let mut server = demo.serve();

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS + RESETTERS)
        .map(|c| {
            let (addr, key) = (server.addr.clone(), demo.key.clone());
            let (stop, answered) = (stop.clone(), answered.clone());
            std::thread::spawn(move || {
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let id = c * 100_000 + i + 1;
                    if c >= CLIENTS {
                        act_and_reset(&addr, &key, id);
                    } else if try_act(&addr, Some(&key), Some(id), &body(id))
                        .is_ok_and(|r| r.status == 200)
                    {
                        answered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // Refused or cut off: the gateway is stopping.
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            })
        })
        .collect();

    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.load(Ordering::Relaxed) < 2 * CLIENTS as usize {
        assert!(Instant::now() < deadline, "too few answers before SIGTERM");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.proc.signal(Signal::TERM).expect("SIGTERM");
    let status = wait_exit(&mut server, Duration::from_secs(30));
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("client thread");
    }
    assert!(
        status.success(),
        "the gateway exited with {status} on SIGTERM"
    );

    // The upstream has answered everything it got; then compare.
    std::thread::sleep(Duration::from_millis(500));
    let seen = ids_seen(&ids_log);
    assert!(
        seen.iter()
            .any(|id| id % 100_000 > 0 && id / 100_000 >= CLIENTS),
        "no reset request reached the upstream"
    );
    let missing = without_receipt(&demo.db, &seen);
    assert!(
        missing.is_empty(),
        "the upstream acted on {} of {} requests without a receipt: {missing:?}",
        missing.len(),
        seen.len()
    );
}

/// Item 14, past the grace period: requests held at the upstream longer than
/// `--shutdown-grace-ms` still get their receipts, while a request stuck before deciding (its
/// body never sent) does not hold the shutdown up.
#[test]
fn item_14_requests_at_the_upstream_past_the_grace_get_their_receipts() {
    const HELD: u64 = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let ids_log = dir.path().join("upstream-ids");
    let demo = demo_logging_ids(&ids_log, "1500");
    let mut server = gateway_serve(&demo.db, &["--shutdown-grace-ms", "100"]);

    // Sends its head and half its body, then waits: a handler that never reaches the upstream.
    let mut stalled = TcpStream::connect(&server.addr).expect("connect");
    let half = format!(
        "POST /v1/act HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"service\":",
        server.addr, demo.key
    );
    stalled.write_all(half.as_bytes()).expect("half a request");

    let clients: Vec<_> = (1..=HELD)
        .map(|id| {
            let (addr, key) = (server.addr.clone(), demo.key.clone());
            // Cut off or answered: the receipts are what is checked.
            std::thread::spawn(move || {
                let _ = try_act(&addr, Some(&key), Some(id), &body(id));
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&ids_log).map_or(0, |s| s.lines().count()) < HELD as usize {
        assert!(
            Instant::now() < deadline,
            "the requests did not reach the upstream"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    server.proc.signal(Signal::TERM).expect("SIGTERM");
    let status = wait_exit(&mut server, Duration::from_secs(30));
    assert!(
        status.success(),
        "the gateway exited with {status} on SIGTERM"
    );
    for client in clients {
        client.join().expect("client thread");
    }
    drop(stalled);

    let seen = ids_seen(&ids_log);
    let missing = without_receipt(&demo.db, &seen);
    assert!(
        missing.is_empty(),
        "past the grace, the upstream acted on {missing:?} (of {seen:?}) without a receipt"
    );
}
