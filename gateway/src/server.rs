//! The HTTP/1.1 server: accept loop, routing, request ids and the request-level probe sites.
//!
//! Per request, on the tokio worker that polls its connection's task:
//! `request_begin(req_id, client fd, client id)` when the handler future is created, phases
//! inside, and
//! `request_end(req_id, status)` as the last thing the handler does, right before hyper writes
//! the response. The connection's task is wrapped in [`ConnectionTask`]: its later polls while
//! the request is in flight are bracketed by `poll_enter` / `poll_exit`, and in [`Repoll`],
//! which polls it again at once when hyper's halves wake each other inside one poll.

use std::convert::Infallible;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rand::RngCore;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::act::{self, Answer, REQUEST_ID};
use crate::app::App;
use crate::conns::{Conn, Slots};
use crate::error::ApiError;
use crate::ledger::Unavailable;
use crate::probe::{self, ConnectionTask};
use crate::repoll::Repoll;

/// How far ahead [`keep_a_timer_armed`] keeps its timer: under any upstream timeout.
const ARMED_AHEAD: Duration = Duration::from_millis(250);

/// tokio unparks its driver (an eventfd write, then a spurious epoll return) whenever a new
/// timer is due before every registered one. With few requests in flight that was each
/// request's upstream timeout, a syscall per request; a timer always due within
/// [`ARMED_AHEAD`] makes those later timers cost nothing extra.
async fn keep_a_timer_armed() {
    loop {
        tokio::time::sleep(ARMED_AHEAD).await;
    }
}

/// What one client may hold, and how long a shutdown waits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A connection must deliver a whole request head within this time of starting to wait for
    /// one. hyper starts that wait when the connection is accepted and again after each
    /// response, so this bounds slow headers and idle keep-alive connections alike.
    pub header_timeout: Duration,
    /// Connections served at once. At the cap, the connections that have waited longest for
    /// a request head are closed to make room ([`crate::conns`]); when every one is serving a
    /// request, a new connection is accepted and closed at once.
    pub max_connections: u32,
    /// After `shutdown`, how long the requests in flight may take to finish. A request already
    /// deciding (up to its upstream call) is waited for past it, through its receipt.
    pub grace: Duration,
}

/// How long the acceptor waits for reclaimed connections to close when they hold every slot
/// beyond the cap, before it turns a new connection away. One between requests closes on its
/// next poll, which the acceptor can outrun; one that was serving a request finishes it first.
const ROOM_WAIT: Duration = Duration::from_millis(250);

/// How long accepting pauses after the process or system runs out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections until `shutdown` completes, then stops accepting, asks every connection
/// to finish its request in flight and close. Returns whether all closed within the grace period;
/// either way, every request that began deciding (and so may have called the upstream) has
/// settled its receipt on return.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> bool {
    tokio::spawn(keep_a_timer_armed());
    let slots = Slots::new(limits.max_connections);
    let (stop, stopping) = watch::channel(());
    let mut out_of_descriptors = false;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                out_of_descriptors = false;
                stream
            }
            Err(e) if is_out_of_descriptors(&e) => {
                // Retrying at once would spin: nothing frees a descriptor until a connection
                // closes. Say so once per episode, not once per retry.
                if !out_of_descriptors {
                    eprintln!("accept: {e}; pausing accepts until connections close");
                    out_of_descriptors = true;
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
            // A connection reset before it was accepted, and the like: only that one is lost.
            Err(_) => continue,
        };
        let mut admitted = slots.admit();
        if admitted.is_none() && tokio::time::timeout(ROOM_WAIT, slots.room()).await.is_ok() {
            admitted = slots.admit();
        }
        let Some((conn, mut reclaimed)) = admitted else {
            // Every slot serves a request or is still closing: closing this one at once keeps
            // the descriptors for them.
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let client_fd = stream.as_raw_fd() as u64;
        let app = app.clone();
        let conn = Arc::new(conn);
        let task_in_flight = conn.in_flight.clone();
        let mut stopping = stopping.clone();
        let connection = async move {
            let service_conn = conn.clone();
            let service = service_fn(move |req| {
                let ids = Ids {
                    probe: probe::next_probe_id(),
                    client: client_request_id(&req),
                };
                service_conn.serving();
                service_conn
                    .in_flight
                    .begin(ids.probe, client_fd, ids.client);
                handle(app.clone(), req, ids, service_conn.clone())
            });
            // half_close: hyper does not watch the socket while a handler runs, so a client
            // that resets mid-request cannot cancel a handler between its upstream call and
            // its receipt; the reset surfaces when the response is written.
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .half_close(true)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            // Client resets and malformed HTTP end the connection; nothing to report.
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopping.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
                Ok(()) = &mut reclaimed => {
                    // Made room for a new connection at the cap. Between requests nothing is
                    // lost by closing now (hyper's graceful shutdown would wait for a first
                    // head); a request that began meanwhile runs to its response first.
                    if conn.in_flight.has_request() {
                        connection.as_mut().graceful_shutdown();
                        let _ = connection.await;
                    }
                }
            }
        };
        tokio::spawn(ConnectionTask::new(task_in_flight, Repoll::new(connection)));
    }
    drop(listener);
    stop.send_replace(());
    let drained = tokio::time::timeout(limits.grace, slots.all_closed())
        .await
        .is_ok();
    // Past the grace, requests that may have acted upstream still finish their receipts; the
    // rest are cut off when the runtime is dropped.
    app.acting.close().await;
    drained
}

fn is_out_of_descriptors(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    e.raw_os_error().is_some_and(|raw| {
        [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM]
            .contains(&Errno::from_raw_os_error(raw))
    })
}

/// A request's two ids: the gateway's probe id (unique, for the tracer) and the client's
/// `x-request-id` (for the receipt and the response header; it may repeat).
#[derive(Clone, Copy, Debug)]
struct Ids {
    probe: u64,
    client: u64,
}

async fn handle(
    app: Arc<App>,
    req: Request<Incoming>,
    ids: Ids,
    conn: Arc<Conn>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let answer = route(&app, req, ids).await;
    let status = answer.status;
    let mut response = Response::new(Full::new(Bytes::from(answer.body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(REQUEST_ID, HeaderValue::from(ids.client));
    conn.waiting();
    conn.in_flight.end(ids.probe, u64::from(status.as_u16()));
    Ok(response)
}

async fn route(app: &App, req: Request<Incoming>, ids: Ids) -> Answer {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/act") => match app.ledger.unavailable() {
            // With no receipt possible, refuse before any upstream call.
            Some(down) => ledger_down(down),
            None => act::act(app, req, ids.probe, ids.client).await,
        },
        (&Method::GET, "/healthz") => match app.ledger.unavailable() {
            Some(down) => ledger_down(down),
            None => Answer {
                status: StatusCode::OK,
                body: b"{\"ok\":true}".to_vec(),
            },
        },
        (&Method::GET, "/v1/receipts/pubkey") => Answer {
            status: StatusCode::OK,
            body: app.pubkey_body.to_vec(),
        },
        (_, "/v1/act" | "/healthz" | "/v1/receipts/pubkey") => ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed",
        )
        .into(),
        _ => ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route").into(),
    }
}

fn ledger_down(down: Unavailable<'_>) -> Answer {
    let (code, message) = match down {
        Unavailable::Full => (
            "ledger_full",
            "the disk under the receipt ledger is full; acts are refused until it has room".into(),
        ),
        Unavailable::Failed(reason) => (
            "ledger_failed",
            format!("the receipt ledger failed: {reason}"),
        ),
    };
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message).into()
}

/// The client's `x-request-id` (u64 decimal), or a fresh one when absent or invalid.
fn client_request_id(req: &Request<Incoming>) -> u64 {
    req.headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(generate_request_id)
}

fn generate_request_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // A random base per process keeps generated ids from colliding across restarts.
    let base = *BASE.get_or_init(|| rand::rngs::OsRng.next_u64());
    base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}
