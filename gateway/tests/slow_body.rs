//! Issue 37, item 4: an authenticated client that trickles its body gets 408 once the body's
//! deadline has passed, instead of holding its connection and a handler for as long as it likes.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Demo, gateway_serve};

/// `--header-timeout-ms`, which the body's deadline defaults to.
const DEADLINE: Duration = Duration::from_millis(1000);

#[test]
fn issue37_item4_a_trickled_body_gets_408_at_its_deadline() {
    let demo = Demo::new();
    let server = gateway_serve(&demo.db, &["--header-timeout-ms", "1000"]);
    let mut stream = TcpStream::connect(&server.addr).expect("connect");
    let head = format!(
        "POST /v1/act HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: 1000\r\n\r\n",
        demo.key
    );
    stream.write_all(head.as_bytes()).expect("head");
    let started = Instant::now();
    // One byte every 100 ms: the body is always arriving, never complete.
    let mut trickle = stream.try_clone().expect("clone");
    let trickler = std::thread::spawn(move || {
        while started.elapsed() < Duration::from_secs(15) {
            if trickle.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let mut raw = Vec::new();
    let read = stream.read_to_end(&mut raw);
    let took = started.elapsed();
    let reply = String::from_utf8_lossy(&raw);
    assert!(
        reply.starts_with("HTTP/1.1 408"),
        "after {took:?} ({read:?}): {reply:?}"
    );
    assert!(reply.contains("\"code\":\"body_timeout\""), "{reply}");
    // The deadline, give or take a loaded machine; and the connection is closed (the read
    // above ended), so its slot is free.
    assert!(
        took >= DEADLINE && took < DEADLINE + Duration::from_secs(5),
        "answered after {took:?}"
    );
    drop(stream);
    trickler.join().expect("trickler");
}
