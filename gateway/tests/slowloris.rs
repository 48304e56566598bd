//! Issue 21, item 13: idle and slow-header connections cannot exhaust the gateway's descriptors
//! under a common `ulimit -n 1024`, and normal requests are still served.

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

#[test]
fn item_13_slowloris_under_ulimit_1024_is_bounded() {
    let demo = Demo::new();
    let log = demo.dir.path().join("gateway.log");
    let mut command = common::gateway_serve_command(&demo.db, &["--header-timeout-ms", "1000"]);
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
    let mut server = spawn_command_logged(command, &log);

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
