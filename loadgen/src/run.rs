//! The two load shapes. Both record every request sent, warm-up included; the summary decides
//! what counts.
//!
//! Open loop: request `i` is scheduled at `t0 + i / rate`, fixed before the run starts. A
//! task on the runtime's own thread releases each index at its scheduled time (a timerfd
//! deadline, to the µs; every index already due goes out at once); a free connection takes it
//! at once, or later if every connection is busy. Latency is taken from the scheduled time, so
//! a stalled server is charged for the requests it kept waiting (no coordinated omission).
//!
//! Closed loop: `concurrency` connections each send, wait for the response, and send again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;

use crate::clock::{Deadline, monotonic_ns};
use crate::conn::{Conn, Exchange, Outcome};
use crate::progress::Progress;
use crate::target::Target;

/// Upper bound on the requests of one run, so memory and run time stay bounded whatever the
/// flags (40 bytes a record).
pub const MAX_REQUESTS: u64 = 50_000_000;

/// After the last scheduled send, how long queued requests may still go out; later ones are
/// abandoned and reported as `unsent`.
pub const OPEN_LOOP_DRAIN: Duration = Duration::from_secs(2);

/// A pause after a transport error in closed loop, so a dead server is not hammered in a spin.
const CLOSED_LOOP_ERROR_BACKOFF: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, Debug)]
pub enum Load {
    Open { rate: f64, connections: usize },
    Closed { concurrency: usize },
}

#[derive(Clone, Copy, Debug)]
pub struct Record {
    pub id: u64,
    /// Open loop: the planned send time. Closed loop: equal to `sent_ns`.
    pub scheduled_ns: u64,
    pub sent_ns: u64,
    pub received_ns: u64,
    pub outcome: Outcome,
    /// Sent (closed) or scheduled (open) before the warm-up ended: excluded from the summary.
    pub warmup: bool,
    /// Its connection's local port (0: none).
    pub local_port: u16,
}

impl Record {
    pub fn latency_ns(&self) -> u64 {
        self.received_ns.saturating_sub(self.scheduled_ns)
    }
}

pub struct RunOutput {
    pub load: Load,
    /// Every request sent, sorted by id.
    pub records: Vec<Record>,
    pub window_start_ns: u64,
    pub window_ns: u64,
    /// Scheduled requests never sent (open loop, past the drain), all in the measured window.
    pub unsent: u64,
}

/// Hands out unique request ids across the runs of one process (e.g. the steps of `--find-max`).
pub struct IdSource(AtomicU64);

impl IdSource {
    pub fn starting_at(first: u64) -> Self {
        IdSource(AtomicU64::new(first))
    }

    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }

    fn reserve(&self, count: u64) -> u64 {
        self.0.fetch_add(count, Ordering::Relaxed)
    }
}

pub struct RunSpec {
    pub load: Load,
    pub duration: Duration,
    pub warmup: Duration,
    pub timeout: Duration,
}

pub async fn run(
    target: Arc<Target>,
    spec: &RunSpec,
    ids: &Arc<IdSource>,
    progress: Option<Arc<Progress>>,
) -> anyhow::Result<RunOutput> {
    let slots = match spec.load {
        Load::Open { connections, .. } => connections,
        Load::Closed { concurrency } => concurrency,
    };
    ensure!(slots >= 1, "need at least one connection");
    // Every connection is open before the clock starts; this is also the reachability check.
    let mut conns = Vec::with_capacity(slots);
    for _ in 0..slots {
        let mut conn = Conn::new(target.clone(), spec.timeout);
        conn.connect().await?;
        conns.push(conn);
    }
    match spec.load {
        Load::Open { rate, .. } => open_loop(conns, rate, spec, ids, progress).await,
        Load::Closed { .. } => closed_loop(conns, spec, ids, progress).await,
    }
}

#[derive(Clone, Copy)]
struct Schedule {
    t0_ns: u64,
    period_ns: f64,
}

impl Schedule {
    fn at(self, index: u64) -> u64 {
        self.t0_ns + (index as f64 * self.period_ns) as u64
    }
}

async fn open_loop(
    conns: Vec<Conn>,
    rate: f64,
    spec: &RunSpec,
    ids: &Arc<IdSource>,
    progress: Option<Arc<Progress>>,
) -> anyhow::Result<RunOutput> {
    let total_s = (spec.warmup + spec.duration).as_secs_f64();
    let count = (total_s * rate).round() as u64;
    ensure!(
        count >= 1,
        "--rate × (--duration + --warmup) schedules no request"
    );
    ensure!(
        count <= MAX_REQUESTS,
        "--rate × (--duration + --warmup) = {count} requests, above the limit of {MAX_REQUESTS}"
    );
    let first_id = ids.reserve(count);
    let schedule = Schedule {
        t0_ns: monotonic_ns() + 5_000_000,
        period_ns: 1e9 / rate,
    };
    let warmup_end_ns = schedule.t0_ns + spec.warmup.as_nanos() as u64;
    let last_scheduled_ns = schedule.at(count - 1);
    let give_up_ns = last_scheduled_ns + OPEN_LOOP_DRAIN.as_nanos() as u64;

    let (release, released) = mpsc::unbounded_channel::<u64>();
    let deadline = Deadline::new().context("creating the open loop's timerfd")?;
    // Ends when every index is released (dropping `release` tells the connections) or when
    // every connection has given up.
    let dispatcher = tokio::spawn(async move {
        let mut next = 0;
        while next < count {
            deadline.until(schedule.at(next)).await?;
            let now = monotonic_ns();
            while next < count && schedule.at(next) <= now {
                if release.send(next).is_err() {
                    return Ok(());
                }
                next += 1;
            }
        }
        Ok::<_, std::io::Error>(())
    });

    let released = Arc::new(Mutex::new(released));
    let mut workers = JoinSet::new();
    for mut conn in conns {
        let released = released.clone();
        let progress = progress.clone();
        workers.spawn(async move {
            let mut records = Vec::new();
            loop {
                let next = released.lock().await.recv().await;
                let Some(index) = next else { break };
                if monotonic_ns() > give_up_ns {
                    break;
                }
                let scheduled_ns = schedule.at(index);
                let exchange = conn.send(first_id + index).await;
                if let Some(progress) = &progress {
                    progress.count(exchange.outcome);
                }
                records.push(record(
                    first_id + index,
                    scheduled_ns,
                    exchange,
                    scheduled_ns < warmup_end_ns,
                ));
            }
            records
        });
    }
    let mut records = Vec::with_capacity(count as usize);
    while let Some(done) = workers.join_next().await {
        records.extend(done.context("a connection task panicked")?);
    }
    drop(released);
    dispatcher
        .await
        .context("the dispatcher task panicked")?
        .context("waiting for a scheduled send time")?;
    records.sort_unstable_by_key(|r| r.id);
    let unsent = count - records.len() as u64;
    Ok(RunOutput {
        load: spec.load,
        records,
        window_start_ns: warmup_end_ns,
        window_ns: spec.duration.as_nanos() as u64,
        unsent,
    })
}

async fn closed_loop(
    conns: Vec<Conn>,
    spec: &RunSpec,
    ids: &Arc<IdSource>,
    progress: Option<Arc<Progress>>,
) -> anyhow::Result<RunOutput> {
    let start_ns = monotonic_ns();
    let warmup_end_ns = start_ns + spec.warmup.as_nanos() as u64;
    let stop_ns = warmup_end_ns + spec.duration.as_nanos() as u64;
    let budget = Arc::new(AtomicU64::new(MAX_REQUESTS));
    let mut workers = JoinSet::new();
    for mut conn in conns {
        let progress = progress.clone();
        let budget = budget.clone();
        let ids = ids.clone();
        workers.spawn(async move {
            let mut records = Vec::new();
            loop {
                let id = ids.next();
                let exchange = conn.send(id).await;
                if let Some(progress) = &progress {
                    progress.count(exchange.outcome);
                }
                records.push(record(
                    id,
                    exchange.sent_ns,
                    exchange,
                    exchange.sent_ns < warmup_end_ns,
                ));
                if exchange.outcome == Outcome::Transport {
                    tokio::time::sleep(CLOSED_LOOP_ERROR_BACKOFF).await;
                }
                if monotonic_ns() >= stop_ns || budget.fetch_sub(1, Ordering::Relaxed) <= 1 {
                    break;
                }
            }
            records
        });
    }
    let mut records = Vec::new();
    while let Some(done) = workers.join_next().await {
        records.extend(done.context("a connection task panicked")?);
    }
    records.sort_unstable_by_key(|r| r.id);
    Ok(RunOutput {
        load: spec.load,
        records,
        window_start_ns: warmup_end_ns,
        window_ns: spec.duration.as_nanos() as u64,
        unsent: 0,
    })
}

fn record(id: u64, scheduled_ns: u64, exchange: Exchange, warmup: bool) -> Record {
    Record {
        id,
        scheduled_ns,
        sent_ns: exchange.sent_ns,
        received_ns: exchange.received_ns,
        outcome: exchange.outcome,
        warmup,
        local_port: exchange.local_port,
    }
}
