//! Root only: the whole product on the real gateway. mock-upstream, a demo ledger and the
//! gateway (one worker, pinned to CPU 0) run; the tracer attaches; loadgen sends a fixed
//! open-loop rate; the tracer is stopped with SIGINT. Then every 200 response must be a
//! complete traced request, inside the client's own send/receive window on the same clock,
//! with parts that sum to its total and a fsync and a signing share, no event lost, and
//! nothing of ours left in the kernel. The same run on a `strip`ped copy of the gateway checks
//! that the tracer finds the probe sites by their USDT notes.
//!
//! The binaries of the other packages come from `attach_common::build_binaries`.
//!
//! `TRACER_ATTACH` (auto, tracepoint, kprobe, fentry) is passed as the tracer's `--attach`; a
//! forced mode must then be the one breakdown.json says syscalls and sockets used.
//! `TRACER_E2E_RATE` sets the request rate (default 300/s).

mod attach_common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
    time::{Duration, Instant},
};

use attach_common::{
    Background, Row, Signal, Spawn, assert_detached, build_binaries, cpu_hog, demo_gateway, num,
    open_loop, part_columns, read_csv, require_root, start, wait_listening,
};

/// The load: well below the gateway's max, so nothing queues and nothing may be lost.
/// `TRACER_E2E_RATE` overrides it where the gateway is slower (an emulated guest).
const RATE: u64 = 300;
const LOAD_SECONDS: u64 = 3;
const GATEWAY_CPU: &str = "0";
const LOAD_CPU: &str = "1";
/// The CPU hog's name (its comm), unlike any other task's on the machine.
const HOG: &str = "wait-for-hog";
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const FINISH_TIMEOUT: Duration = Duration::from_secs(180);

/// [`traced_run`] for `test`, in its turn; None, having said why, when not root.
fn traced_run_as_root(hog: bool, binary: Binary) -> Option<TracedRun> {
    if !require_root() {
        return None;
    }
    let _turn = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    Some(traced_run(hog, binary))
}

/// Which gateway binary a traced run starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Binary {
    AsBuilt,
    /// A copy without symbols: the tracer must find the sites by their USDT notes.
    Stripped,
}

/// `strip`s a copy of `gateway` into `dir`, and checks that no probe-site symbol is left.
fn stripped_copy(gateway: &Path, dir: &Path) -> PathBuf {
    use object::{Object as _, ObjectSymbol as _};

    let copy = dir.join("gateway-stripped");
    let status = Command::new("strip")
        .arg("-o")
        .arg(&copy)
        .arg(gateway)
        .status()
        .expect("running strip (binutils)");
    assert!(status.success(), "strip failed: {status}");
    let data = std::fs::read(&copy).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let left: Vec<String> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter_map(|symbol| symbol.name().ok().map(str::to_owned))
        .filter(|name| name.starts_with("gw_probe_"))
        .collect();
    assert!(left.is_empty(), "strip left {left:?}");
    copy
}

/// The traced runs take turns: each pins a gateway on CPU 0, and the hog of one would
/// be on the other's CPU.
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What one traced run left behind (the temp dir holds the session and the client's CSV).
struct TracedRun {
    _dir: tempfile::TempDir,
    out: PathBuf,
    client_csv: PathBuf,
    stderr: String,
    started: Instant,
    /// The pid of the CPU hog, if the run had one.
    hog: Option<u32>,
    /// The tracer's `--attach` (`TRACER_ATTACH`) and loadgen's rate (`TRACER_E2E_RATE`).
    attach: String,
    rate: u64,
}

/// mock-upstream, a demo ledger and the gateway on CPU 0, the tracer attached, loadgen's open
/// loop, SIGINT to the tracer; with `hog`, a busy loop ([`HOG`]) pinned to the gateway's CPU
/// from attach to the end of the load. Checks that nothing of ours outlives the tracer.
///
/// The hog's run sends over one connection, so that at most one request is in the gateway:
/// with eight, a gateway slowed by emulation and by the hog queues requests behind each other,
/// and `another request` outweighed the hog in one guest run of CI.
fn traced_run(hog: bool, binary: Binary) -> TracedRun {
    let started = Instant::now();
    let bins = build_binaries();
    let dir = tempfile::tempdir().unwrap();
    let gateway_bin = match binary {
        Binary::AsBuilt => bins.gateway.clone(),
        Binary::Stripped => stripped_copy(&bins.gateway, dir.path()),
    };
    let out = dir.path().join("session");
    let client_csv = dir.path().join("client.csv");

    let mut mock = start(
        Spawn::new("mock-upstream", &bins.mock_upstream)
            .args(["--listen", "127.0.0.1:0"])
            .cpus(Some(LOAD_CPU)),
    );
    let upstream = format!("http://{}", wait_listening(&mut mock));
    let (mut gateway, gateway_url, key) =
        demo_gateway(&gateway_bin, dir.path(), &upstream, GATEWAY_CPU);

    let pid = gateway.pid().to_string();
    let attach = std::env::var("TRACER_ATTACH").unwrap_or_else(|_| "auto".to_owned());
    let mut tracer = Background::attached(
        Spawn::new("tracer", env!("CARGO_BIN_EXE_tracer"))
            .args(["record", "--pid", &pid, "--out", out.to_str().unwrap()])
            .args(["--attach", &attach, "--wait-for"])
            .cpus(Some(LOAD_CPU)),
        READY_TIMEOUT,
    );
    let attached_s = started.elapsed().as_secs_f64();
    let hog = hog.then(|| {
        // Weighted above the gateway's threads (nice -5: ~3× the CPU share of each), so that
        // it stays the largest holder where the writer is slow too (emulated, SQLite's insert
        // held 35% of the waits against the unweighted hog's 45% in a guest run).
        cpu_hog(dir.path(), HOG, GATEWAY_CPU)
    });

    let rate: u64 = std::env::var("TRACER_E2E_RATE")
        .map(|rate| {
            rate.parse()
                .expect("TRACER_E2E_RATE is requests per second")
        })
        .unwrap_or(RATE);
    let connections = if hog.is_some() { "1" } else { "8" };
    open_loop(
        &bins.loadgen,
        LOAD_CPU,
        &["--url", &gateway_url, "--key", &key],
        (rate, LOAD_SECONDS, connections),
        &client_csv,
    );

    let stderr = tracer.stop(FINISH_TIMEOUT);
    eprintln!(
        "e2e: attached after {attached_s:.1}s, done after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    for line in stderr.lines().filter(|l| l.starts_with("tracer: attach ")) {
        eprintln!("e2e: {line}");
    }

    assert_detached(
        &stderr,
        &[&gateway_bin, &gateway_bin.canonicalize().unwrap()],
    );
    // The gateway ends on SIGINT (its Ctrl-C); killed if it does not within a few seconds.
    let _ = gateway.signal(Signal::INT);
    let _ = gateway.wait_timeout(Duration::from_secs(5));
    drop(mock);
    let hog = hog.map(|hog| hog.pid());
    TracedRun {
        _dir: dir,
        out,
        client_csv,
        stderr,
        started,
        hog,
        attach,
        rate,
    }
}

/// The client's view (every request answered 200, at least 8/9 of the schedule) and the
/// tracer's (the same requests, all complete) agree. Returns each request's client window
/// (sent, received) and the traced rows.
fn client_and_tracer_agree(run: &TracedRun) -> (BTreeMap<u64, (u64, u64)>, Vec<Row>) {
    let client = read_csv(&run.client_csv);
    assert!(
        // At least 8/9 of the schedule (800 requests at the default rate).
        client.len() as u64 >= run.rate * LOAD_SECONDS * 8 / 9,
        "loadgen sent only {} requests",
        client.len()
    );
    let not_ok: Vec<_> = client.iter().filter(|r| r["status"] != "200").collect();
    assert!(not_ok.is_empty(), "non-200 responses: {not_ok:?}");
    let window: BTreeMap<u64, (u64, u64)> = client
        .iter()
        .map(|r| {
            (
                num(r, "request_id"),
                (num(r, "sent_ns"), num(r, "received_ns")),
            )
        })
        .collect();

    let traced = read_csv(&run.out.join("requests.csv"));
    let incomplete = read_csv(&run.out.join("incomplete.csv"));
    let traced_ids: BTreeSet<u64> = traced.iter().map(|r| num(r, "request_id")).collect();
    let client_ids: BTreeSet<u64> = window.keys().copied().collect();
    let missing: Vec<_> = client_ids.difference(&traced_ids).collect();
    let extra: Vec<_> = traced_ids.difference(&client_ids).collect();
    assert!(
        missing.is_empty() && extra.is_empty() && traced.len() == client.len(),
        "{} client 200s, {} traced rows; missing {missing:?}; not sent by the client {extra:?}; \
         incomplete {incomplete:?}",
        client.len(),
        traced.len(),
    );
    assert!(incomplete.is_empty(), "incomplete: {incomplete:?}");
    (window, traced)
}

#[test]
fn traced_gateway_requests_match_the_client() {
    let Some(run) = traced_run_as_root(false, Binary::AsBuilt) else {
        return;
    };
    let (out, stderr, started) = (&run.out, &run.stderr, run.started);
    let attach = &run.attach;
    let (window, traced) = client_and_tracer_agree(&run);

    let part_columns = part_columns(&traced[0]);
    assert!(part_columns.len() >= 10, "{part_columns:?}");
    let mut without: BTreeMap<&str, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for row in &traced {
        let id = num(row, "request_id");
        let (sent, received) = window[&id];
        let (arrive, done) = (num(row, "t_arrive_ns"), num(row, "t_done_ns"));
        assert!(
            sent <= arrive && arrive <= done && done <= received,
            "request {id}: client sent {sent}, t_arrive {arrive}, t_done {done}, client \
             received {received}"
        );
        let total = num(row, "total_ns");
        assert_eq!(total, done - arrive, "request {id}");
        let parts: u64 = part_columns.iter().map(|c| num(row, c)).sum();
        assert_eq!(parts, total, "request {id}: parts {parts} != total {total}");
        assert_eq!(
            num(row, "overhead_ns"),
            total - num(row, "upstream_ns"),
            "request {id}"
        );
        // Every 200 carries a durable receipt: its wait covered a fsync and a signature.
        for part in ["ledger_fsync_ns", "signing_ns"] {
            if num(row, part) == 0 {
                without.entry(part).or_default().push(row.clone());
            }
        }
    }
    let counts: Vec<(&str, usize)> = without.iter().map(|(p, rows)| (*p, rows.len())).collect();
    assert!(
        without.is_empty(),
        "of {} requests, these many have a zero part: {counts:?}; first ones: {:?}",
        traced.len(),
        without
            .values()
            .flat_map(|rows| rows.iter().take(3))
            .collect::<Vec<_>>()
    );

    let breakdown: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("breakdown.json")).unwrap()).unwrap();
    assert_eq!(breakdown["lost_events"], 0, "{breakdown}");
    assert_eq!(breakdown["requests"], traced.len() as u64);
    assert_eq!(breakdown["incomplete"], 0);
    let modes = &breakdown["attach_modes"];
    eprintln!(
        "e2e: attach_modes syscalls={} sockets={} sched={} sites={}",
        modes["syscalls"], modes["sockets"], modes["sched"], modes["sites"]
    );
    assert_eq!(modes["attach"], attach.as_str(), "{modes}");
    if attach != "auto" {
        for group in ["syscalls", "sockets"] {
            assert_eq!(modes[group], attach.as_str(), "{group}: {modes}");
        }
    }
    // The pictures are written on SIGINT too.
    for file in [
        "tail-oncpu.svg",
        "all-oncpu.svg",
        "tail-offcpu.svg",
        "tail-diff.svg",
        "trace.json",
    ] {
        assert!(out.join(file).exists(), "no {file}:\n{stderr}");
    }
    // Without a hog the wait-for view still charges all of the tail's scheduling, and no
    // busy loop is among its holders.
    for section in ["wait", "wait_all"] {
        let wait = wait_view(out, section);
        assert_eq!(
            wait["charged_ns"], wait["scheduling_ns"],
            "{section}: {wait}"
        );
        assert!(
            holders(&wait)
                .iter()
                .all(|h| !h.starts_with(&format!("other process · {HOG} "))),
            "{section}: {wait}"
        );
    }
    eprintln!(
        "e2e: {} requests traced and matched in {:.1}s",
        traced.len(),
        started.elapsed().as_secs_f64()
    );
}

/// pictures.json's wait-for summary of the tail (`wait`) or of every request (`wait_all`).
fn wait_view(out: &Path, section: &str) -> serde_json::Value {
    let pictures: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("pictures.json")).unwrap()).unwrap();
    pictures[section].clone()
}

/// Each holder with its share of the charged time, for a failure or progress line.
fn shares(wait: &serde_json::Value) -> Vec<String> {
    let charged = wait["charged_ns"].as_f64().unwrap_or(0.0).max(1.0);
    wait["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            let share = 100.0 * h["ns"].as_f64().unwrap_or(0.0) / charged;
            format!("{share:.1}% {}", h["holder"].as_str().unwrap())
        })
        .collect()
}

fn holders(wait: &serde_json::Value) -> Vec<String> {
    wait["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["holder"].as_str().unwrap().to_owned())
        .collect()
}

/// The hog is the largest holder of the requests' `scheduling` and is in the tail's view
/// whenever the tail waited runnable at all.
/// Largest over every request, not only the tail: the tail (above the p99 of overhead) is
/// picked by overhead, which a slow fdatasync on a shared disk can dominate, and then its few
/// requests' scheduling is too small a sample to rank holders by (in one run of two here the
/// hog was second to the writer in the tail, first over all requests).
#[test]
fn a_cpu_hog_on_the_gateway_cpu_is_what_requests_waited_behind() {
    let Some(run) = traced_run_as_root(true, Binary::AsBuilt) else {
        return;
    };
    let hog = run.hog.expect("the run had a hog");
    // By pid: a task is named by its comm when it first takes a gateway thread's CPU, and the
    // hog may do so as `taskset`, before it execs into HOG (seen in the emulated guest).
    let is_hog =
        |h: &String| h.starts_with("other process · ") && h.ends_with(&format!(" (pid {hog})"));
    assert!(run.out.join("tail-wait.svg").exists(), "{}", run.stderr);
    let all = wait_view(&run.out, "wait_all");
    assert_eq!(all["charged_ns"], all["scheduling_ns"], "{all}");
    assert!(
        holders(&all).first().is_some_and(is_hog),
        "the hog (pid {hog}) is the largest holder: {:#?}",
        shares(&all)
    );
    let tail = wait_view(&run.out, "wait");
    assert_eq!(tail["charged_ns"], tail["scheduling_ns"], "{tail}");
    let folded = std::fs::read_to_string(run.out.join("tail-wait.folded")).unwrap();
    // A tail whose overhead was all fdatasync and CPU has no wait to name (seen in the
    // emulated guest, where a slow disk picks the tail); any scheduling in it names the hog.
    if tail["scheduling_ns"].as_u64() == Some(0) {
        eprintln!("e2e hog: the tail's requests were never runnable-waiting: no holder to name");
        assert!(
            !folded.lines().any(|l| l.starts_with("scheduling;")),
            "{folded}"
        );
    } else {
        assert!(
            holders(&tail).iter().any(is_hog),
            "{:#?}\n{tail}",
            shares(&tail)
        );
        assert!(
            folded
                .lines()
                .any(|l| l.starts_with("scheduling;other process;")
                    && l.contains(&format!(" (pid {hog}) "))),
            "{folded}"
        );
    }
    eprintln!(
        "e2e hog: done after {:.1}s; holders over all requests {:?}, in the tail {:?}",
        run.started.elapsed().as_secs_f64(),
        shares(&all),
        shares(&tail)
    );
}

/// `strip` removes the probe sites' symbols, not their USDT notes: the tracer finds the sites by
/// the notes and rebuilds every request.
#[test]
fn a_stripped_gateway_is_traced_by_its_usdt_notes() {
    let Some(run) = traced_run_as_root(false, Binary::Stripped) else {
        return;
    };
    assert!(
        run.stderr
            .lines()
            .any(|line| line.starts_with("tracer: attach sites")
                && line.contains("probe sites (no phase site: --phases) by USDT notes")),
        "{}",
        run.stderr
    );
    let (_, traced) = client_and_tracer_agree(&run);
    let breakdown: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.out.join("breakdown.json")).unwrap()).unwrap();
    assert_eq!(breakdown["lost_events"], 0, "{breakdown}");
    assert_eq!(breakdown["requests"], traced.len() as u64, "{breakdown}");
}
