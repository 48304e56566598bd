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
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tracer_ebpf::abi::{Event, kind, syscall};
use tracer_ebpf::sites::Site;

use super::dist::Dist;

/// Bytes of one record: `Event` as little-endian fields, no padding.
pub const RECORD_BYTES: usize = 40;

fn encode(e: &Event) -> [u8; RECORD_BYTES] {
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

/// Writes the raw dump: every event, in the order given, 40 bytes each.
pub struct RawDump {
    out: BufWriter<File>,
    pub written: u64,
}

impl RawDump {
    /// Creates `path` as a session's outputs are created (`overwrite`: `--overwrite`).
    pub fn create(path: &Path, overwrite: bool) -> Result<RawDump> {
        let file = crate::out_dir::create_file_at(path, overwrite)?;
        Ok(RawDump {
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
        })
    }

    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        self.written += 1;
        self.out.write_all(&encode(event))
    }

    pub fn finish(mut self) -> io::Result<u64> {
        self.out.flush()?;
        Ok(self.written)
    }
}

/// Reads a raw dump; a trailing partial record is an error (a truncated file).
pub fn read_dump(path: &Path) -> Result<Vec<Event>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    if len % RECORD_BYTES as u64 != 0 {
        bail!(
            "{}: {len} bytes is not a whole number of {RECORD_BYTES}-byte events (truncated?)",
            path.display()
        );
    }
    let mut input = BufReader::with_capacity(1 << 20, file);
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

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CrossCheck {
    pub events: u64,
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    /// Threads that hit a batch/commit probe site.
    pub writer_tids: Vec<u32>,
    pub fsync_writer: Dist,
    pub fsync_other: Dist,
    /// Both: what the model's writer log holds.
    pub fsync_all: Dist,
    /// Every run-queue delay.
    pub runqueue: Dist,
    pub runqueue_after_wakeup: Dist,
    pub runqueue_after_preemption: Dist,
    /// SWITCH_IN of a thread whose previous state was never seen (start of the dump).
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
        fsync_writer: Dist::of(fsync_writer),
        fsync_other: Dist::of(fsync_other),
        fsync_all: Dist::of(fsync_all),
        runqueue: Dist::of(all),
        runqueue_after_wakeup: Dist::of(after_wakeup),
        runqueue_after_preemption: Dist::of(after_preemption),
        switch_in_unknown,
    }
}

impl CrossCheck {
    pub fn to_json(&self) -> Value {
        json!({
            "events": self.events,
            "first_ts_ns": self.first_ts_ns,
            "last_ts_ns": self.last_ts_ns,
            "writer_tids": self.writer_tids,
            "fsync_writer": self.fsync_writer.to_json(),
            "fsync_other_threads": self.fsync_other.to_json(),
            "fsync": self.fsync_all.to_json(),
            "runqueue": self.runqueue.to_json(),
            "runqueue_after_wakeup": self.runqueue_after_wakeup.to_json(),
            "runqueue_after_preemption": self.runqueue_after_preemption.to_json(),
            "switch_in_unknown_state": self.switch_in_unknown,
        })
    }
}

/// The pairs compared: (name in the model's `kernel` section, this check's distribution).
pub fn pairs(c: &CrossCheck) -> [(&'static str, &Dist); 4] {
    [
        ("fsync", &c.fsync_all),
        ("runqueue", &c.runqueue),
        ("runqueue_after_wakeup", &c.runqueue_after_wakeup),
        ("runqueue_after_preemption", &c.runqueue_after_preemption),
    ]
}

/// Side by side with the model's `kernel` section of breakdown.json: per pair, both
/// distributions and model/independent ratios of count, p50, p99 and max.
pub fn compare(c: &CrossCheck, model_kernel: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for (name, dist) in pairs(c) {
        let mine = dist.to_json();
        let model = &model_kernel[name];
        let ratio = |key: &str| match (model[key].as_f64(), mine[key].as_f64()) {
            (Some(m), Some(i)) if i != 0.0 => json!(m / i),
            (Some(0.0), Some(_)) => json!(1.0),
            _ => Value::Null,
        };
        out.insert(
            name.to_owned(),
            json!({
                "independent": mine,
                "model": model.clone(),
                "model_over_independent": {
                    "count": ratio("count"),
                    "p50": ratio("p50_us"),
                    "p99": ratio("p99_us"),
                    "max": ratio("max_us"),
                },
            }),
        );
    }
    Value::Object(out)
}

/// A text table of [`compare`]'s output.
pub fn table(comparison: &Value) -> String {
    let mut text = format!(
        "{:<27} {:<12} {:>9} {:>10} {:>10} {:>10} {:>10}\n",
        "distribution", "source", "count", "p50 µs", "p99 µs", "max µs", "mean µs"
    );
    let Some(map) = comparison.as_object() else {
        return text;
    };
    for (name, v) in map {
        for source in ["independent", "model"] {
            let d = &v[source];
            let f = |k: &str| d[k].as_f64().map_or("-".to_owned(), |x| format!("{x:.1}"));
            text += &format!(
                "{:<27} {:<12} {:>9} {:>10} {:>10} {:>10} {:>10}\n",
                name,
                source,
                d["count"]
                    .as_u64()
                    .map_or("-".to_owned(), |n| n.to_string()),
                f("p50_us"),
                f("p99_us"),
                f("max_us"),
                f("mean_us"),
            );
        }
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
        let mut dump = RawDump::create(&path, false).unwrap();
        for e in &events {
            dump.write(e).unwrap();
        }
        assert_eq!(dump.finish().unwrap(), 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 80);
        assert_eq!(read_dump(&path).unwrap(), events);
        std::fs::write(&path, [0u8; 41]).unwrap();
        let err = read_dump(&path).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
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
        assert_eq!((c.fsync_writer.count, c.fsync_writer.max_ns), (1, 180));
        assert_eq!((c.fsync_other.count, c.fsync_other.max_ns), (1, 10));
        assert_eq!(c.runqueue_after_preemption.max_ns, 25);
        assert_eq!(c.runqueue_after_wakeup.max_ns, 40);
        assert_eq!((c.runqueue.count, c.runqueue.min_ns), (2, 25));
        assert_eq!(c.switch_in_unknown, 2);
        assert_eq!((c.first_ts_ns, c.last_ts_ns, c.events), (50, 510, 13));
        assert_eq!(c.fsync_all.count, 2);

        let model = json!({
            "fsync": {"count": 2, "p50_us": 0.01, "p99_us": 0.18, "max_us": 0.18},
            "runqueue": {"count": 3, "p50_us": 0.025, "p99_us": 0.04, "max_us": 0.04},
        });
        let cmp = compare(&c, &model);
        assert_eq!(cmp["fsync"]["model_over_independent"]["count"], 1.0);
        assert_eq!(cmp["runqueue"]["model_over_independent"]["count"], 1.5);
        assert_eq!(
            cmp["runqueue_after_wakeup"]["model_over_independent"]["p50"],
            Value::Null
        );
        let text = table(&cmp);
        assert!(
            text.contains("fsync") && text.contains("independent"),
            "{text}"
        );
    }
}
