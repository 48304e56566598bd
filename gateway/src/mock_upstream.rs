//! A keep-alive JSON echo server standing in for the tool behind the gateway.
//!
//! Every request (any method, any path) is answered with
//! `{"echo": <request body as JSON, or null>, "path": "<request path>", "authorization":
//! <the Authorization header, or null>}` after a [`Delay`]: fixed, or drawn per request from a
//! range. Concurrent requests overlap their delays as a real service would.
//!
//! With an [`IdLog`], the `id` field of each JSON body it receives is appended to a file, one
//! per line, before the delay: the requests it saw, for a test to match against receipts.
//! With a [`RequestLog`], every request gets a line once answered: which one it was (loadgen's
//! `params.request_id`), when it arrived and was answered, and the delay drawn, so a test can
//! check a tracer's `upstream` of each request against what the upstream itself saw.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
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
use rand::Rng as _;
use rustix::thread::set_current_timer_slack;
use rustix::time::{ClockId, Timespec, clock_gettime};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Serves until the process ends. Prints `listening on ADDR` once the socket is bound: tests and
/// xtask wait for that line before sending.
pub async fn run(listener: TcpListener, delay: Delay, logs: Logs) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let timer = (!delay.is_zero()).then(Timer::start).transpose()?;
    let delay = Arc::new(delay);
    println!("listening on {local}");
    loop {
        let (stream, _peer): (_, SocketAddr) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Transient accept errors (e.g. EMFILE) must not end the server.
            Err(_) => continue,
        };
        let _ = stream.set_nodelay(true);
        let timer = timer.clone();
        let (delay, logs) = (delay.clone(), logs.clone());
        tokio::spawn(async move {
            let service =
                service_fn(move |req| echo(req, delay.clone(), timer.clone(), logs.clone()));
            // A client that disconnects mid-request is not an error worth reporting.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn echo(
    req: Request<Incoming>,
    delay: Arc<Delay>,
    timer: Option<Arc<Timer>>,
    logs: Logs,
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
    // The whole request is here: what a proxy's upstream time must cover from.
    let received_ns = monotonic_ns();
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    if let Some(ids) = &logs.ids {
        ids.record(&echo);
    }
    let wait = delay.draw();
    if let Some(timer) = timer
        && !wait.is_zero()
    {
        timer.sleep(wait).await;
    }
    if let Some(requests) = &logs.requests {
        requests.record(&echo, received_ns, wait);
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

/// What each request waits before its answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Delay {
    Fixed(Duration),
    /// Drawn uniformly from `[min, max]`, at µs resolution, for every request.
    Uniform {
        min: Duration,
        max: Duration,
    },
}

impl Delay {
    /// `MS` (fixed) or `MIN-MAX` (uniform), in milliseconds, fractions allowed, each in
    /// `[0, 3600000]`.
    pub fn parse(text: &str) -> Result<Delay, String> {
        let ms = |t: &str| match t.trim().parse::<f64>() {
            Ok(ms) if (0.0..=3_600_000.0).contains(&ms) => Ok(Duration::from_secs_f64(ms / 1e3)),
            _ => Err(format!(
                "expected milliseconds in [0, 3600000] (or MIN-MAX), got {text}"
            )),
        };
        match text.split_once('-') {
            None => Ok(Delay::Fixed(ms(text)?)),
            Some((min, max)) => {
                let (min, max) = (ms(min)?, ms(max)?);
                if min > max {
                    return Err(format!("the range {text} ends before it starts"));
                }
                Ok(Delay::Uniform { min, max })
            }
        }
    }

    fn is_zero(&self) -> bool {
        match *self {
            Delay::Fixed(d) => d.is_zero(),
            Delay::Uniform { max, .. } => max.is_zero(),
        }
    }

    fn draw(&self) -> Duration {
        match *self {
            Delay::Fixed(d) => d,
            Delay::Uniform { min, max } => {
                let (lo, hi) = (min.as_micros() as u64, max.as_micros() as u64);
                Duration::from_micros(rand::thread_rng().gen_range(lo..=hi))
            }
        }
    }
}

/// What mock-upstream logs, each optional.
#[derive(Clone, Default)]
pub struct Logs {
    pub ids: Option<Arc<IdLog>>,
    pub requests: Option<Arc<RequestLog>>,
}

/// One CSV line per answered request: `request_id,received_ns,answered_ns,delay_us`
/// (CLOCK_MONOTONIC: `received_ns` once its whole body was read, `answered_ns` just before
/// its response is handed to the connection; `request_id` is the body's
/// `params.request_id`, empty without one).
pub struct RequestLog(Mutex<File>);

impl RequestLog {
    pub const HEADER: &str = "request_id,received_ns,answered_ns,delay_us\n";

    pub fn create(path: &std::path::Path) -> std::io::Result<RequestLog> {
        let mut file = File::create(path)?;
        file.write_all(Self::HEADER.as_bytes())?;
        Ok(RequestLog(Mutex::new(file)))
    }

    fn record(&self, body: &serde_json::Value, received_ns: u64, delay: Duration) {
        let id = body
            .pointer("/params/request_id")
            .and_then(serde_json::Value::as_u64)
            .map(|id| id.to_string())
            .unwrap_or_default();
        let line = format!(
            "{id},{received_ns},{},{}\n",
            monotonic_ns(),
            delay.as_micros()
        );
        let mut file = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // One unbuffered write a line, as IdLog.
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("mock-upstream: logging request {id}: {e}");
        }
    }
}

/// The delays, kept on a thread of its own: tokio's timer wheel ticks in whole ms and rounds
/// every sleep up to the next tick (5 ms answered in ~6.4 ms). This thread waits for the
/// earliest deadline with 1 µs timer slack (woken early when an earlier one is queued), then
/// wakes the requests due.
struct Timer {
    /// Deadlines, earliest first; `seq` keeps equal deadlines apart (and in order).
    queue: Mutex<TimerQueue>,
    queued: Condvar,
}

#[derive(Default)]
struct TimerQueue {
    heap: BinaryHeap<Reverse<(Timespec, u64)>>,
    waiting: std::collections::HashMap<u64, oneshot::Sender<()>>,
    seq: u64,
}

impl Timer {
    fn start() -> std::io::Result<Arc<Timer>> {
        let timer = Arc::new(Timer {
            queue: Mutex::new(TimerQueue::default()),
            queued: Condvar::new(),
        });
        let thread = timer.clone();
        std::thread::Builder::new()
            .name("mock-timer".to_owned())
            .spawn(move || thread.run())?;
        Ok(timer)
    }

    /// Returns `delay` after it is called.
    async fn sleep(&self, delay: Duration) {
        let (done, wait) = oneshot::channel();
        let delay = Timespec::try_from(delay).unwrap_or(Timespec {
            tv_sec: i64::MAX / 2,
            tv_nsec: 0,
        });
        {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            let deadline = monotonic() + delay;
            let earliest = queue
                .heap
                .peek()
                .is_none_or(|Reverse((d, _))| deadline < *d);
            queue.seq += 1;
            let seq = queue.seq;
            queue.heap.push(Reverse((deadline, seq)));
            queue.waiting.insert(seq, done);
            if earliest {
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
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let Some(&Reverse((next, _))) = queue.heap.peek() else {
                queue = self
                    .queued
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            let now = monotonic();
            if now < next {
                let left = Duration::try_from(next - now).unwrap_or_default();
                queue = self
                    .queued
                    .wait_timeout(queue, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            while let Some(&Reverse((deadline, seq))) = queue.heap.peek()
                && deadline <= now
            {
                queue.heap.pop();
                due.extend(queue.waiting.remove(&seq));
            }
            drop(queue);
            for done in due.drain(..) {
                let _ = done.send(());
            }
            queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        }
    }
}

fn monotonic() -> Timespec {
    clock_gettime(ClockId::Monotonic)
}

fn monotonic_ns() -> u64 {
    let t = monotonic();
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
