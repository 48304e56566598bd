//! Chrome trace-event JSON (loads in Perfetto and chrome://tracing) of selected requests.
//!
//! Layout:
//! - process "<comm> threads (pid …)": one track per thread of the traced processes that the
//!   selected requests ran on, named from `/proc/PID/task/TID/comm`, holding each slice
//!   charged to that thread: on-CPU phases, preemption and run-queue waits (`scheduling`),
//!   and on the ledger writer `ledger_fsync`, `signing` and `ledger_other`. A slice shared by
//!   several requests (one fsync serving a batch) is drawn once, with every request id in its
//!   args. Slices that overlap without nesting (two requests waiting for the same thread) go
//!   on extra tracks named "<thread> (overlap N)", so no slice is dropped or mis-nested.
//! - process "requests": one overview track per request, a slice for the whole request with
//!   its parts nested under it, including the parts on no thread (upstream, waits).
//!
//! Times are CLOCK_MONOTONIC µs (the tracer's clock), so they line up with requests.csv.

use std::collections::BTreeMap;
use std::fs;
use std::io;

use serde_json::{Value, json};

use crate::requests::{Part, RequestRecord};

/// Thread id → name.
pub type ThreadNames = BTreeMap<u32, String>;

/// Reads the names of the threads of `pids`; missing or unreadable entries are skipped.
pub fn read_thread_names(pids: &[u32]) -> ThreadNames {
    let mut names = ThreadNames::new();
    for pid in pids {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Ok(comm) = fs::read_to_string(task.path().join("comm")) {
                names.insert(tid, comm.trim_end().to_owned());
            }
        }
    }
    names
}

/// The name of the traced processes' track group: `nginx threads (pid 10, 11)`.
pub fn threads_title(pids: &[u32]) -> String {
    let comm = pids
        .first()
        .and_then(|pid| fs::read_to_string(format!("/proc/{pid}/comm")).ok())
        .map_or_else(|| "traced".to_owned(), |comm| comm.trim_end().to_owned());
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!("{comm} threads (pid {})", pids.join(", "))
}

/// Why a request is in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    Slowest,
    Median,
}

impl Group {
    fn name(self) -> &'static str {
        match self {
            Group::Slowest => "slowest",
            Group::Median => "median",
        }
    }
}

const THREADS_PID: u64 = 1;
const REQUESTS_PID: u64 = 2;
/// Above any Linux tid (pid_max ≤ 2^22), so overlap tracks never collide with a real thread.
const OVERLAP_TID_STRIDE: u64 = 1 << 23;

/// Counts of what was written, for the session summary and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    pub requests: usize,
    pub thread_tracks: usize,
    pub events: usize,
}

/// Builds the trace of `requests` (in the order given: their overview tracks follow it).
pub fn trace(
    requests: &[(Group, &RequestRecord)],
    threads: &ThreadNames,
    threads_title: &str,
) -> (Value, TraceSummary) {
    let mut events = vec![
        meta(
            "process_name",
            THREADS_PID,
            None,
            json!({ "name": threads_title }),
        ),
        meta(
            "process_sort_index",
            THREADS_PID,
            None,
            json!({ "sort_index": 0 }),
        ),
        meta(
            "process_name",
            REQUESTS_PID,
            None,
            json!({ "name": format!("requests: {} slowest and {} median by overhead",
                requests.iter().filter(|(g, _)| *g == Group::Slowest).count(),
                requests.iter().filter(|(g, _)| *g == Group::Median).count()) }),
        ),
        meta(
            "process_sort_index",
            REQUESTS_PID,
            None,
            json!({ "sort_index": 1 }),
        ),
    ];

    let thread_events = thread_slices(requests);
    let mut thread_tracks = 0;
    for (tid, lanes) in &thread_events {
        let name = threads
            .get(tid)
            .map_or_else(|| format!("tid {tid}"), |comm| format!("{comm} {tid}"));
        for (lane, slices) in lanes.iter().enumerate() {
            let track = u64::from(*tid) + lane as u64 * OVERLAP_TID_STRIDE;
            let track_name = if lane == 0 {
                name.clone()
            } else {
                format!("{name} (overlap {lane})")
            };
            events.extend(track_meta(THREADS_PID, track, &track_name));
            thread_tracks += 1;
            for s in slices {
                let ids: Vec<u64> = s.requests.iter().map(|(_, id)| *id).collect();
                let mut args = json!({ "part": s.part.name(), "req_id": ids[0] });
                if ids.len() > 1 {
                    args["req_ids"] = json!(ids);
                }
                let cat = s
                    .requests
                    .iter()
                    .map(|(g, _)| g.name())
                    .min()
                    .unwrap_or("median");
                events.push(complete(
                    s.part.name(),
                    cat,
                    THREADS_PID,
                    track,
                    s.start_ns,
                    s.end_ns,
                    args,
                ));
            }
        }
    }

    let mut ranks = BTreeMap::new();
    for (index, (group, req)) in requests.iter().enumerate() {
        let rank = ranks.entry(*group).or_insert(0);
        *rank += 1;
        let track = index as u64 + 1;
        let label = format!(
            "{} #{} req {} ({} µs overhead)",
            group.name(),
            rank,
            req.req_id,
            req.overhead_ns() / 1000
        );
        events.extend(track_meta(REQUESTS_PID, track, &label));
        let mut args = json!({
            "req_id": req.req_id,
            "part": "request",
            "status": req.status,
            "total_us": req.total_ns() as f64 / 1e3,
            "overhead_us": req.overhead_ns() as f64 / 1e3,
        });
        for part in Part::ALL {
            if req.part_ns(part) > 0 {
                args[format!("{}_us", part.name())] = json!(req.part_ns(part) as f64 / 1e3);
            }
        }
        events.push(complete(
            &format!("req {}", req.req_id),
            group.name(),
            REQUESTS_PID,
            track,
            req.t_arrive_ns,
            req.t_done_ns,
            args,
        ));
        for s in &req.slices {
            let args = json!({ "req_id": req.req_id, "part": s.part.name(), "tid": s.tid });
            events.push(complete(
                s.part.name(),
                group.name(),
                REQUESTS_PID,
                track,
                s.start_ns,
                s.end_ns,
                args,
            ));
        }
    }

    let summary = TraceSummary {
        requests: requests.len(),
        thread_tracks,
        events: events.iter().filter(|e| e["ph"] == "X").count(),
    };
    (
        json!({ "traceEvents": events, "displayTimeUnit": "ns" }),
        summary,
    )
}

pub fn write_trace(
    mut out: impl io::Write,
    requests: &[(Group, &RequestRecord)],
    threads: &ThreadNames,
    threads_title: &str,
) -> io::Result<TraceSummary> {
    let (value, summary) = trace(requests, threads, threads_title);
    out.write_all(&serde_json::to_vec(&value).map_err(io::Error::other)?)?;
    Ok(summary)
}

/// One slice on a thread track, with the requests it belongs to.
struct ThreadSlice {
    start_ns: u64,
    end_ns: u64,
    part: Part,
    requests: Vec<RequestRef>,
}

/// A request's group and id.
type RequestRef = (Group, u64);

/// Non-overlapping rows of slices of one thread; the first is the thread's own track.
type Lanes = Vec<Vec<ThreadSlice>>;

/// Per thread, lanes of slices that do not overlap; identical slices merged.
fn thread_slices(requests: &[(Group, &RequestRecord)]) -> BTreeMap<u32, Lanes> {
    // (tid, start, end, part) → the requests that share that exact slice.
    let mut merged: BTreeMap<(u32, u64, u64, Part), Vec<RequestRef>> = BTreeMap::new();
    for (group, req) in requests {
        for s in req
            .slices
            .iter()
            .filter(|s| s.tid != 0 && s.end_ns > s.start_ns)
        {
            merged
                .entry((s.tid, s.start_ns, s.end_ns, s.part))
                .or_default()
                .push((*group, req.req_id));
        }
    }
    let mut by_thread: BTreeMap<u32, Vec<ThreadSlice>> = BTreeMap::new();
    for ((tid, start_ns, end_ns, part), requests) in merged {
        by_thread.entry(tid).or_default().push(ThreadSlice {
            start_ns,
            end_ns,
            part,
            requests,
        });
    }
    by_thread
        .into_iter()
        .map(|(tid, mut slices)| {
            // Earliest first, longer first on ties, so the first-fit lanes come out stable.
            slices.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns), s.part));
            let mut lanes: Lanes = Vec::new();
            for slice in slices {
                let free = lanes
                    .iter()
                    .position(|lane| lane.last().is_none_or(|last| last.end_ns <= slice.start_ns));
                match free {
                    Some(lane) => lanes[lane].push(slice),
                    None => lanes.push(vec![slice]),
                }
            }
            (tid, lanes)
        })
        .collect()
}

/// A track's name and its place in the viewer's order (tracks sort by their id).
fn track_meta(pid: u64, track: u64, name: &str) -> [Value; 2] {
    [
        meta("thread_name", pid, Some(track), json!({ "name": name })),
        meta(
            "thread_sort_index",
            pid,
            Some(track),
            json!({ "sort_index": track }),
        ),
    ]
}

fn meta(name: &str, pid: u64, tid: Option<u64>, args: Value) -> Value {
    let mut event = json!({ "name": name, "ph": "M", "pid": pid, "args": args });
    if let Some(tid) = tid {
        event["tid"] = json!(tid);
    }
    event
}

fn complete(
    name: &str,
    cat: &str,
    pid: u64,
    tid: u64,
    start_ns: u64,
    end_ns: u64,
    args: Value,
) -> Value {
    json!({
        "name": name,
        "cat": cat,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": micros(start_ns),
        "dur": micros(end_ns - start_ns),
        "args": args,
    })
}

/// ns → µs with ns precision (exact in f64 for CLOCK_MONOTONIC values below ~104 days).
fn micros(ns: u64) -> f64 {
    ns as f64 / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::{Hits, PARTS, Slice};
    use tracer_ebpf::sites::Phase;

    fn req(req_id: u64, t0: u64, slices: &[(u64, u64, Part, u32)]) -> RequestRecord {
        let mut parts = [0u64; PARTS];
        for (a, b, part, _) in slices {
            parts[part.index()] += b - a;
        }
        RequestRecord {
            req_id,
            status: 200,
            t_arrive_ns: t0,
            t_done_ns: slices.last().unwrap().1,
            client_port: None,
            upstream_start_ns: None,
            parts,
            slices: slices
                .iter()
                .map(|&(start_ns, end_ns, part, tid)| Slice {
                    start_ns,
                    end_ns,
                    part,
                    tid,
                })
                .collect(),
            samples: vec![],
            offcpu: vec![],
            waits: None,
            hits: Hits::default(),
        }
    }

    #[test]
    fn shared_fsync_is_drawn_once_and_overlapping_waits_get_their_own_track() {
        let a = req(
            1,
            0,
            &[
                (0, 10, Part::Scheduling, 100),
                (10, 20, Part::Cpu(Phase::Auth), 100),
                (20, 50, Part::LedgerFsync, 200),
                (50, 60, Part::Cpu(Phase::Respond), 100),
            ],
        );
        let b = req(
            2,
            5,
            &[
                (5, 15, Part::Scheduling, 100),
                (15, 20, Part::Upstream, 0),
                (20, 50, Part::LedgerFsync, 200),
                (50, 70, Part::Scheduling, 100),
            ],
        );
        let names = ThreadNames::from([
            (100, "tokio-rt-worker".to_owned()),
            (200, "ledger-writer".to_owned()),
        ]);
        let (value, summary) = trace(
            &[(Group::Slowest, &a), (Group::Median, &b)],
            &names,
            "gateway threads (pid 42)",
        );
        let events = value["traceEvents"].as_array().unwrap();
        let fsync: Vec<_> = events
            .iter()
            .filter(|e| e["name"] == "ledger_fsync" && e["pid"] == 1)
            .collect();
        assert_eq!(fsync.len(), 1);
        assert_eq!(fsync[0]["args"]["req_ids"], json!([1, 2]));
        assert_eq!(fsync[0]["ts"], json!(0.02));
        let track_names: Vec<_> = events
            .iter()
            .filter(|e| e["name"] == "thread_name" && e["pid"] == 1)
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            track_names,
            [
                "tokio-rt-worker 100",
                "tokio-rt-worker 100 (overlap 1)",
                "ledger-writer 200"
            ]
        );
        assert_eq!(summary.thread_tracks, 3);
        // Overview: a request slice plus each part, upstream included.
        let overview = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == 2)
            .count();
        assert_eq!(overview, 1 + 4 + 1 + 4);
    }
}
