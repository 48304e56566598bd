//! A server that stalls once for 200 ms: the requests scheduled during the stall must be
//! charged their wait, including the ones loadgen could not even send until the stall ended.

#[expect(dead_code, reason = "this test uses only part of the shared helpers")]
mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::run_direct;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use loadgen::clock::monotonic_ns;

const STALL_NS: u64 = 200_000_000;

/// The stall window, [start, end) in CLOCK_MONOTONIC ns, once it has happened.
type Stall = Arc<Mutex<Option<(u64, u64)>>>;

/// Serves on a thread of its own; the first request at or after `stall_after_ns` opens the
/// stall, and every request that arrives during it is answered only when it ends.
fn start_stalling_server(stall_after_ns: u64) -> (String, Stall) {
    let stall: Stall = Arc::default();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server_stall = stall.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            // Ends with the test process; loadgen's connections are its only clients.
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let stall = server_stall.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_req: Request<hyper::body::Incoming>| {
                        let stall = stall.clone();
                        async move {
                            let now = monotonic_ns();
                            let end = {
                                let mut window = stall.lock().unwrap();
                                if window.is_none() && now >= stall_after_ns {
                                    *window = Some((now, now + STALL_NS));
                                }
                                window.and_then(|(start, end)| {
                                    (start..end).contains(&now).then_some(end)
                                })
                            };
                            if let Some(end) = end {
                                tokio::time::sleep(Duration::from_nanos(
                                    end.saturating_sub(monotonic_ns()),
                                ))
                                .await;
                                // tokio's timer may wake a little early; never answer before the end.
                                while monotonic_ns() < end {
                                    tokio::task::yield_now().await;
                                }
                            }
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    let addr = addr_rx.recv().unwrap();
    (format!("http://{addr}"), stall)
}

#[test]
fn requests_scheduled_during_a_stall_include_their_wait() {
    // Warm-up 0.5 s, then 2 s measured at 200 req/s: the stall opens about 1 s into the window.
    let (url, stall) = start_stalling_server(monotonic_ns() + 1_500_000_000);
    let (summary, rows) = run_direct(
        &url,
        &[
            "--rate",
            "200",
            "--duration",
            "2",
            "--warmup",
            "0.5",
            "--connections",
            "4",
        ],
    );
    let (stall_start, stall_end) = stall.lock().unwrap().expect("the server stalled");

    let during: Vec<_> = rows
        .iter()
        .filter(|r| (stall_start..stall_end).contains(&r.scheduled_ns))
        .collect();
    // 200 ms at 200 req/s.
    assert!(
        during.len() >= 35,
        "{} requests scheduled during the stall",
        during.len()
    );
    for row in &during {
        assert_eq!(row.status, 200);
        assert!(
            row.received_ns >= stall_end,
            "request {} answered during the stall",
            row.id
        );
        // Its recorded latency is measured from its scheduled time, so it holds the wait.
        assert!(row.received_ns - row.scheduled_ns >= stall_end - row.scheduled_ns);
    }
    // With 4 connections stuck, most of them could only be sent after the stall: measured
    // from the actual send they would look fast. That is the omission this avoids.
    let queued = during.iter().filter(|r| r.sent_ns >= stall_end).count();
    assert!(
        queued >= during.len() / 2,
        "{queued} of {} were queued in loadgen",
        during.len()
    );

    // The summary carries it: ≥ 2.5% of the 400 measured requests waited ≥ 150 ms.
    let p99_us = summary["latency_us"]["p99"].as_f64().unwrap();
    let max_us = summary["latency_us"]["max"].as_f64().unwrap();
    assert!(p99_us >= 150_000.0, "p99 {p99_us} µs hides the stall");
    assert!(max_us >= 195_000.0, "max {max_us} µs is below the stall");
}
