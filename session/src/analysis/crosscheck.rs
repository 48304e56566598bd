//! The independent cross-check: from a raw dump of every event the tracer read
//! (`tracer record --raw-events FILE`), aggregate two things directly, without the rebuild
//! model or any of its code:
//!
//! - fsync/fdatasync durations (SYSCALL exit − enter), on the ledger writer thread (the thread
//!   that hits the batch/commit probe sites) and on any other thread;
//! - run-queue delays of the target's threads: WAKEUP of a blocked thread → SWITCH_IN, and
//!   preempting SWITCH_OUT → SWITCH_IN.
//!
//! The tracer reports the same two distributions from its model (`kernel` in breakdown.json);
//! the two should agree. Where they differ, the model's extra inference (an in-context event
//! proving a thread ran after a lost switch-in) is the first suspect.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tracer_ebpf::abi::{Event, kind, syscall};
use tracer_ebpf::sites::Site;

use super::dist::{Dist, DistUs};
use crate::breakdown::{self, KernelHist};

/// The line a dump starts with, before its records: it tells a dump from any other file (the
/// tracer's `--overwrite` replaces only a file that starts with it).
pub const DUMP_HEADER: &[u8] = b"tracer --raw-events 1\n";

/// Bytes of one record: `Event` as little-endian fields, no padding.
pub const RECORD_BYTES: usize = 40;

/// One event as a dump record (the tracer's `--raw-events` writer).
pub fn encode(e: &Event) -> [u8; RECORD_BYTES] {
    let mut b = [0u8; RECORD_BYTES];
    b[0..8].copy_from_slice(&e.ts_ns.to_le_bytes());
    b[8..12].copy_from_slice(&e.tid.to_le_bytes());
    b[12..14].copy_from_slice(&e.kind.to_le_bytes());
    b[14..16].copy_from_slice(&e.sub.to_le_bytes());
    for (i, a) in e.args.iter().enumerate() {
        b[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    b
}

fn decode(b: &[u8; RECORD_BYTES]) -> Event {
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    Event {
        ts_ns: u64_at(0),
        tid: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
        kind: u16::from_le_bytes(b[12..14].try_into().expect("2 bytes")),
        sub: u16::from_le_bytes(b[14..16].try_into().expect("2 bytes")),
        args: [u64_at(16), u64_at(24), u64_at(32)],
    }
}

/// Reads a raw dump; a missing header or a trailing partial record is an error.
pub fn read_dump(path: &Path) -> Result<Vec<Event>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file
        .metadata()?
        .len()
        .saturating_sub(DUMP_HEADER.len() as u64);
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut header = [0u8; DUMP_HEADER.len()];
    if input.read_exact(&mut header).is_err() || header != DUMP_HEADER {
        bail!(
            "{} is not a --raw-events dump (it does not start with {:?}); record one with \
             `tracer record --raw-events FILE`",
            path.display(),
            String::from_utf8_lossy(DUMP_HEADER)
        );
    }
    if len % RECORD_BYTES as u64 != 0 {
        bail!(
            "{}: {len} bytes of records is not a whole number of {RECORD_BYTES}-byte events \
             (truncated?)",
            path.display()
        );
    }
    let mut events = Vec::with_capacity((len / RECORD_BYTES as u64) as usize);
    let mut buf = [0u8; RECORD_BYTES];
    loop {
        match input.read_exact(&mut buf) {
            Ok(()) => events.push(decode(&buf)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    Ok(events)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    Running,
    Blocked,
    /// Runnable since this ts; `true` if it got there by preemption.
    Waiting(u64, bool),
}

/// The independent figures, as validation.json holds them (`crosscheck.independent`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrossCheck {
    pub events: u64,
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    /// Threads that hit a batch/commit probe site.
    pub writer_tids: Vec<u32>,
    pub fsync_writer: DistUs,
    #[serde(rename = "fsync_other_threads")]
    pub fsync_other: DistUs,
    /// Both: what the model's writer log holds.
    #[serde(rename = "fsync")]
    pub fsync_all: DistUs,
    /// Every run-queue delay.
    pub runqueue: DistUs,
    pub runqueue_after_wakeup: DistUs,
    pub runqueue_after_preemption: DistUs,
    /// SWITCH_IN of a thread whose previous state was never seen (start of the dump).
    #[serde(rename = "switch_in_unknown_state")]
    pub switch_in_unknown: u64,
}

/// Aggregates `events` (any order; sorted here by timestamp, ties kept in dump order).
pub fn check(mut events: Vec<Event>) -> CrossCheck {
    events.sort_by_key(|e| e.ts_ns);
    let writers: BTreeSet<u32> = events
        .iter()
        .filter(|e| {
            e.kind == kind::SITE
                && [Site::SignBegin, Site::SignEnd]
                    .iter()
                    .any(|s| *s as u16 == e.sub)
        })
        .map(|e| e.tid)
        .collect();
    let (mut fsync_writer, mut fsync_other) = (Vec::new(), Vec::new());
    let (mut after_wakeup, mut after_preemption) = (Vec::new(), Vec::new());
    let mut state: HashMap<u32, RunState> = HashMap::new();
    let mut switch_in_unknown = 0;
    for e in &events {
        match e.kind {
            kind::SYSCALL if syscall::is_sync(e.sub) => {
                let ns = e.ts_ns as i64 - e.args[0] as i64;
                if writers.contains(&e.tid) {
                    fsync_writer.push(ns);
                } else {
                    fsync_other.push(ns);
                }
            }
            kind::SWITCH_OUT => {
                let next = if e.sub == 1 {
                    RunState::Waiting(e.ts_ns, true)
                } else {
                    RunState::Blocked
                };
                state.insert(e.tid, next);
            }
            kind::WAKEUP => {
                // Only a blocked thread starts waiting; a wakeup of a running or already
                // runnable thread (or one never seen) changes nothing we know.
                if let Some(s @ RunState::Blocked) = state.get_mut(&e.tid) {
                    *s = RunState::Waiting(e.ts_ns, false);
                }
            }
            kind::SWITCH_IN => match state.insert(e.tid, RunState::Running) {
                Some(RunState::Waiting(since, preempted)) => {
                    let ns = e.ts_ns as i64 - since as i64;
                    if preempted {
                        after_preemption.push(ns);
                    } else {
                        after_wakeup.push(ns);
                    }
                }
                None => switch_in_unknown += 1,
                Some(_) => {}
            },
            _ => {}
        }
    }
    let fsync_all: Vec<i64> = fsync_writer.iter().chain(&fsync_other).copied().collect();
    let all: Vec<i64> = after_wakeup
        .iter()
        .chain(&after_preemption)
        .copied()
        .collect();
    CrossCheck {
        events: events.len() as u64,
        first_ts_ns: events.first().map_or(0, |e| e.ts_ns),
        last_ts_ns: events.last().map_or(0, |e| e.ts_ns),
        writer_tids: writers.into_iter().collect(),
        fsync_writer: Dist::of(fsync_writer).to_us(),
        fsync_other: Dist::of(fsync_other).to_us(),
        fsync_all: Dist::of(fsync_all).to_us(),
        runqueue: Dist::of(all).to_us(),
        runqueue_after_wakeup: Dist::of(after_wakeup).to_us(),
        runqueue_after_preemption: Dist::of(after_preemption).to_us(),
        switch_in_unknown,
    }
}

/// The model's side: breakdown.json's `kernel` section, the distributions compared here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
pub struct ModelKernel {
    pub fsync: Option<KernelHist>,
    pub runqueue: Option<KernelHist>,
    pub runqueue_after_wakeup: Option<KernelHist>,
    pub runqueue_after_preemption: Option<KernelHist>,
}

impl From<&breakdown::Kernel> for ModelKernel {
    fn from(k: &breakdown::Kernel) -> ModelKernel {
        ModelKernel {
            fsync: Some(k.fsync),
            runqueue: Some(k.runqueue),
            runqueue_after_wakeup: Some(k.runqueue_after_wakeup),
            runqueue_after_preemption: Some(k.runqueue_after_preemption),
        }
    }
}

/// model / independent of a few figures; `None` where either side has none, or the
/// independent figure is 0 and the model's is not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ratios {
    pub count: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

/// One distribution from both sides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub independent: DistUs,
    pub model: Option<KernelHist>,
    pub model_over_independent: Ratios,
}

/// Side by side with the model, per distribution (`crosscheck.comparison` in validation.json).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    pub fsync: Pair,
    pub runqueue: Pair,
    pub runqueue_after_wakeup: Pair,
    pub runqueue_after_preemption: Pair,
}

impl Comparison {
    /// The pairs with their names, in the order the table prints them.
    pub fn named(&self) -> [(&'static str, &Pair); 4] {
        [
            ("fsync", &self.fsync),
            ("runqueue", &self.runqueue),
            ("runqueue_after_preemption", &self.runqueue_after_preemption),
            ("runqueue_after_wakeup", &self.runqueue_after_wakeup),
        ]
    }
}

/// What validation.json holds under `crosscheck`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub comparison: Comparison,
    pub independent: CrossCheck,
}

fn ratio(model: Option<f64>, independent: f64) -> Option<f64> {
    match model? {
        m if independent != 0.0 => Some(m / independent),
        0.0 => Some(1.0),
        _ => None,
    }
}

fn pair(independent: DistUs, model: Option<KernelHist>) -> Pair {
    Pair {
        independent,
        model,
        model_over_independent: Ratios {
            count: ratio(model.map(|m| m.count as f64), independent.count as f64),
            p50: ratio(model.map(|m| m.p50_us), independent.p50_us),
            p99: ratio(model.map(|m| m.p99_us), independent.p99_us),
            max: ratio(model.map(|m| m.max_us), independent.max_us),
        },
    }
}

/// Side by side with the model's `kernel` section of breakdown.json: per pair, both
/// distributions and model/independent ratios of count, p50, p99 and max.
pub fn compare(c: &CrossCheck, model: &ModelKernel) -> Comparison {
    Comparison {
        fsync: pair(c.fsync_all, model.fsync),
        runqueue: pair(c.runqueue, model.runqueue),
        runqueue_after_wakeup: pair(c.runqueue_after_wakeup, model.runqueue_after_wakeup),
        runqueue_after_preemption: pair(
            c.runqueue_after_preemption,
            model.runqueue_after_preemption,
        ),
    }
}

/// A text table of [`compare`]'s output.
pub fn table(comparison: &Comparison) -> String {
    let mut text = String::new();
    let mut row = |name: &str, source: &str, figures: [String; 5]| {
        let [count, p50, p99, max, mean] = figures;
        let _ = writeln!(
            text,
            "{name:<27} {source:<12} {count:>9} {p50:>10} {p99:>10} {max:>10} {mean:>10}"
        );
    };
    row(
        "distribution",
        "source",
        ["count", "p50 µs", "p99 µs", "max µs", "mean µs"].map(str::to_owned),
    );
    let us = |x: f64| format!("{x:.1}");
    for (name, pair) in comparison.named() {
        let d = pair.independent;
        row(
            name,
            "independent",
            [
                d.count.to_string(),
                us(d.p50_us),
                us(d.p99_us),
                us(d.max_us),
                us(d.mean_us),
            ],
        );
        let figures = pair.model.map_or_else(
            || ["-"; 5].map(str::to_owned),
            |m| {
                [
                    m.count.to_string(),
                    us(m.p50_us),
                    us(m.p99_us),
                    us(m.max_us),
                    us(m.mean_us),
                ]
            },
        );
        row(name, "model", figures);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts_ns: u64, tid: u32, kind: u16, sub: u16, args: [u64; 3]) -> Event {
        Event {
            ts_ns,
            tid,
            kind,
            sub,
            args,
        }
    }

    #[test]
    fn dump_round_trips_and_rejects_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.events");
        let events = vec![
            ev(5, 1, kind::SYSCALL, syscall::FDATASYNC, [2, 9, u64::MAX]),
            ev(7, 2, kind::SWITCH_IN, 0, [0; 3]),
        ];
        let records: Vec<u8> = events.iter().flat_map(encode).collect();
        assert_eq!(records.len(), 80);
        std::fs::write(&path, [DUMP_HEADER, &records].concat()).unwrap();
        assert_eq!(read_dump(&path).unwrap(), events);
        std::fs::write(&path, [DUMP_HEADER, &[0u8; 41]].concat()).unwrap();
        let err = read_dump(&path).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        // A headerless file (an older dump, or not a dump at all) is refused, saying why.
        std::fs::write(&path, &records).unwrap();
        let err = read_dump(&path).unwrap_err().to_string();
        assert!(err.contains("is not a --raw-events dump"), "{err}");
    }

    #[test]
    fn fsyncs_split_by_writer_and_run_queue_delays_by_cause() {
        let w = 10; // writer
        let t = 20; // worker
        let events = vec![
            ev(100, w, kind::SITE, Site::SignBegin as u16, [1, 3, 0]),
            ev(300, w, kind::SYSCALL, syscall::FDATASYNC, [120, 5, 0]), // 180 ns
            ev(400, t, kind::SYSCALL, syscall::FSYNC, [390, 6, 0]),     // 10 ns, not writer
            ev(50, t, kind::SWITCH_IN, 0, [0; 3]),                      // unknown before
            ev(60, t, kind::WAKEUP, 0, [0; 3]),                         // while running: nothing
            ev(70, t, kind::SWITCH_OUT, 1, [0; 3]),                     // preempted
            ev(95, t, kind::SWITCH_IN, 0, [0; 3]),                      // 25 ns after preemption
            ev(200, t, kind::SWITCH_OUT, 0, [0; 3]),                    // blocked
            ev(250, t, kind::WAKEUP, 0, [0; 3]),
            ev(260, t, kind::WAKEUP, 0, [0; 3]), // already runnable: keeps 250
            ev(290, t, kind::SWITCH_IN, 0, [0; 3]), // 40 ns after wakeup
            ev(500, w, kind::WAKEUP, 0, [0; 3]), // writer state unknown: ignored
            ev(510, w, kind::SWITCH_IN, 0, [0; 3]),
        ];
        let c = check(events);
        assert_eq!(c.writer_tids, vec![w]);
        assert_eq!((c.fsync_writer.count, c.fsync_writer.max_us), (1, 0.18));
        assert_eq!((c.fsync_other.count, c.fsync_other.max_us), (1, 0.01));
        assert_eq!(c.runqueue_after_preemption.max_us, 0.025);
        assert_eq!(c.runqueue_after_wakeup.max_us, 0.04);
        assert_eq!((c.runqueue.count, c.runqueue.min_us), (2, 0.025));
        assert_eq!(c.switch_in_unknown, 2);
        assert_eq!((c.first_ts_ns, c.last_ts_ns, c.events), (50, 510, 13));
        assert_eq!(c.fsync_all.count, 2);

        let dist = |count, p50_us, p99_us| KernelHist {
            count,
            p50_us,
            p90_us: p99_us,
            p99_us,
            p999_us: p99_us,
            max_us: p99_us,
            mean_us: p50_us,
        };
        let model: ModelKernel = serde_json::from_value(serde_json::json!({
            "fsync": dist(2, 0.01, 0.18),
            "runqueue": dist(3, 0.025, 0.04),
            "runqueue_after_preemption": null,
        }))
        .unwrap();
        let cmp = compare(&c, &model);
        assert_eq!(cmp.fsync.model_over_independent.count, Some(1.0));
        assert_eq!(cmp.runqueue.model_over_independent.count, Some(1.5));
        assert_eq!(cmp.runqueue_after_wakeup.model_over_independent.p50, None);
        let text = table(&cmp);
        assert!(
            text.contains("fsync") && text.contains("independent"),
            "{text}"
        );
        let wakeup_model = text
            .lines()
            .find(|l| l.starts_with("runqueue_after_wakeup ") && l.contains("model"));
        assert!(wakeup_model.is_some_and(|l| l.ends_with(" -")), "{text}");
    }
}
