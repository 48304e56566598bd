//! A keep-alive JSON echo server standing in for the tool behind the gateway.
//!
//! Every request (any method, any path) is answered with
//! `{"echo": <request body as JSON, or null>, "path": "<request path>", "authorization":
//! <the Authorization header, or null>}` after a fixed delay. Concurrent requests overlap
//! their delays as a real service would.
//!
//! With an [`IdLog`], the `id` field of each JSON body it receives is appended to a file, one
//! per line, before the delay: the requests it saw, for a test to match against receipts.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustix::io::Errno;
use rustix::thread::{clock_nanosleep_absolute, set_current_timer_slack};
use rustix::time::{ClockId, Timespec, clock_gettime};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Serves until the process ends. Prints `listening on ADDR` once the socket is bound: tests and
/// xtask wait for that line before sending.
pub async fn run(
    listener: TcpListener,
    delay: Duration,
    ids: Option<Arc<IdLog>>,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let timer = (!delay.is_zero())
        .then(|| Timer::start(delay))
        .transpose()?;
    println!("listening on {local}");
    loop {
        let (stream, _peer): (_, SocketAddr) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Transient accept errors (e.g. EMFILE) must not end the server.
            Err(_) => continue,
        };
        let _ = stream.set_nodelay(true);
        let timer = timer.clone();
        let ids = ids.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| echo(req, timer.clone(), ids.clone()));
            // A client that disconnects mid-request is not an error worth reporting.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn echo(
    req: Request<Incoming>,
    timer: Option<Arc<Timer>>,
    ids: Option<Arc<IdLog>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    // Echoed so tests can see which credential the gateway injected.
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    if let Some(ids) = ids {
        ids.record(&echo);
    }
    if let Some(timer) = timer {
        timer.sleep().await;
    }
    let reply = serde_json::json!({ "echo": echo, "path": path, "authorization": authorization });
    let bytes = serde_json::to_vec(&reply).unwrap_or_default();
    let response = Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
    Ok(response)
}

/// The `id` of every body served, one decimal per line.
pub struct IdLog(Mutex<File>);

impl IdLog {
    pub fn create(path: &std::path::Path) -> std::io::Result<IdLog> {
        Ok(IdLog(Mutex::new(File::create(path)?)))
    }

    fn record(&self, body: &serde_json::Value) {
        let Some(id) = body.get("id").and_then(serde_json::Value::as_u64) else {
            return;
        };
        let mut file = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // One unbuffered write a line: the line is in the file even if the process is killed.
        if let Err(e) = file.write_all(format!("{id}\n").as_bytes()) {
            eprintln!("mock-upstream: logging id {id}: {e}");
        }
    }
}

/// The delay, kept on a thread of its own: tokio's timer wheel ticks in whole ms and rounds
/// every sleep up to the next tick (5 ms answered in ~6.4 ms). This thread sleeps to each
/// deadline with absolute `clock_nanosleep` and 1 µs timer slack, then wakes the requests due.
struct Timer {
    delay: Timespec,
    /// Deadlines in order: each is `now + delay` taken under the lock, with one fixed delay.
    queue: Mutex<VecDeque<(Timespec, oneshot::Sender<()>)>>,
    queued: Condvar,
}

impl Timer {
    fn start(delay: Duration) -> std::io::Result<Arc<Timer>> {
        let timer = Arc::new(Timer {
            delay: Timespec::try_from(delay).map_err(|_| std::io::ErrorKind::InvalidInput)?,
            queue: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
        });
        let thread = timer.clone();
        std::thread::Builder::new()
            .name("mock-timer".to_owned())
            .spawn(move || thread.run())?;
        Ok(timer)
    }

    /// Returns `delay` after it is called.
    async fn sleep(&self) {
        let (done, wait) = oneshot::channel();
        {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push_back((monotonic() + self.delay, done));
            if queue.len() == 1 {
                self.queued.notify_one();
            }
        }
        // The timer thread never drops a sender unsent.
        let _ = wait.await;
    }

    fn run(&self) {
        // The default 50 µs slack would make every answer up to 50 µs late; failure only costs
        // that precision.
        let _ = set_current_timer_slack(std::num::NonZeroU64::new(1_000));
        let mut due = Vec::new();
        loop {
            let next = {
                let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                loop {
                    match queue.front() {
                        Some((deadline, _)) => break *deadline,
                        None => {
                            queue = self
                                .queued
                                .wait(queue)
                                .unwrap_or_else(PoisonError::into_inner);
                        }
                    }
                }
            };
            // Deadlines only grow, so nothing queued during the sleep is due before `next`.
            while clock_nanosleep_absolute(ClockId::Monotonic, &next) == Err(Errno::INTR) {}
            let now = monotonic();
            {
                let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                while queue.front().is_some_and(|(deadline, _)| *deadline <= now) {
                    due.extend(queue.pop_front().map(|(_, done)| done));
                }
            }
            for done in due.drain(..) {
                let _ = done.send(());
            }
        }
    }
}

fn monotonic() -> Timespec {
    clock_gettime(ClockId::Monotonic)
}
