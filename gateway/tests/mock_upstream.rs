mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{http, mock_upstream};

#[test]
fn echoes_json_body_and_path() {
    let upstream = mock_upstream(0);
    let reply = http(&upstream.addr, "POST", "/echo", &[], br#"{"a":[1,2]}"#);
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json(),
        serde_json::json!({"echo": {"a": [1, 2]}, "path": "/echo", "authorization": null})
    );
}

#[test]
fn non_json_body_echoes_null() {
    let upstream = mock_upstream(1);
    let reply = http(&upstream.addr, "GET", "/x/y", &[], b"");
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json(),
        serde_json::json!({"echo": null, "path": "/x/y", "authorization": null})
    );
}

/// Sends `count` `POST /echo` requests over one keep-alive connection, the first after
/// `start`, and returns each request's latency (write of the request to the end of its
/// response).
fn keep_alive_latencies(addr: &str, count: usize, start: Duration) -> Vec<Duration> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let request = format!("POST /echo HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 2\r\n\r\n{{}}");
    std::thread::sleep(start);
    (0..count)
        .map(|_| {
            let sent = Instant::now();
            writer.write_all(request.as_bytes()).expect("write");
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).expect("read header");
                if line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().expect("content-length");
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("read body");
            sent.elapsed()
        })
        .collect()
}

/// The delay is a behaviour, not a performance target: 5 ms must answer in 5 ms, not in the
/// next whole ms after it (a 1 ms timer tick put the median at 6 ms and more). No answer may
/// come early. A busy machine can only make answers later, so the median is judged on the
/// best of up to three rounds; the old rounding never got one under 5.5 ms. The 16 clients
/// start spread over one delay, as an open loop's requests are, so their answers are not all
/// due at the same instant.
#[test]
fn delay_is_kept_to_well_under_a_millisecond() {
    const DELAY: Duration = Duration::from_millis(5);
    const CLIENTS: u32 = 16;
    const ROUNDS: usize = 3;
    let upstream = mock_upstream(5);
    let addr = upstream.addr.as_str();
    let mut medians = Vec::new();
    for _ in 0..ROUNDS {
        let mut latencies: Vec<Duration> = std::thread::scope(|scope| {
            let clients: Vec<_> = (0..CLIENTS)
                .map(|i| {
                    let start = DELAY * i / CLIENTS;
                    scope.spawn(move || keep_alive_latencies(addr, 13, start))
                })
                .collect();
            clients
                .into_iter()
                .flat_map(|client| client.join().expect("client thread"))
                .collect()
        });
        latencies.sort();
        assert!(
            latencies[0] >= DELAY,
            "an answer came after {:?}, before the {DELAY:?} delay",
            latencies[0]
        );
        let p50 = latencies[latencies.len() / 2];
        if p50 < DELAY + Duration::from_micros(500) {
            return;
        }
        medians.push(p50);
    }
    panic!("median latency for a {DELAY:?} delay, each round: {medians:?}");
}
