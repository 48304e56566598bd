//! A synthetic session through the whole picture path: records pushed as they complete, then
//! every file written from the spill, with stacks made of this test binary's own functions so
//! the pictures must show real, demangled names.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::Path;

use session::pictures::Pictures;
use tracer::flame::trace_json::ThreadNames;
use tracer::flame::{Bands, FlameSession};
use tracer::requests::synthetic::wait_charge;
use tracer::requests::{Hits, Holder, OffCpu, PARTS, Part, RequestRecord, Slice, StackSample};
use tracer::symbolize::Symbolizer;
use tracer_ebpf::sites::Phase;

#[inline(never)]
fn tail_hot_path(x: u64) -> u64 {
    std::hint::black_box(x) ^ 0x5a5a
}

#[inline(never)]
fn median_work(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(17)
}

#[inline(never)]
fn request_driver(x: u64) -> u64 {
    tail_hot_path(x) + median_work(x)
}

fn addr(f: fn(u64) -> u64) -> u64 {
    assert_ne!(f(3), 0);
    f as usize as u64
}

const WORKER: u32 = 100;
const OTHER_WORKER: u32 = 101;
const WRITER: u32 = 200;
const REQUESTS: u64 = 200;
const TAIL_STACK: i64 = 1;
const MEDIAN_STACK: i64 = 2;
/// A task outside the gateway that held the CPU for part of every request's scheduling.
const HOG: u32 = 777;

/// Request `i` has overhead 100 µs + i µs, laid out as scheduling, auth on CPU, an fsync
/// wait on the writer, and respond on CPU; its scheduling waited 6 µs behind the hog and
/// 4 µs behind another request's auth.
fn record(i: u64) -> RequestRecord {
    let t0 = 1_000_000_000_000 + i * 1_000_000;
    let lengths = [
        (Part::Scheduling, 10_000, 0),
        (
            Part::Cpu(Phase::Auth),
            30_000 + i * 1000,
            if i.is_multiple_of(2) {
                WORKER
            } else {
                OTHER_WORKER
            },
        ),
        (Part::LedgerFsync, 50_000, WRITER),
        (Part::Cpu(Phase::Respond), 10_000, WORKER),
    ];
    let mut parts = [0u64; PARTS];
    let mut slices = Vec::new();
    let mut at = t0;
    for (part, ns, tid) in lengths {
        parts[part.index()] += ns;
        slices.push(Slice {
            start_ns: at,
            end_ns: at + ns,
            part,
            tid,
        });
        at += ns;
    }
    let user_stack = if i >= REQUESTS - 2 {
        TAIL_STACK
    } else {
        MEDIAN_STACK
    };
    let sample = |k: u64| StackSample {
        ts_ns: t0 + 10_000 + k,
        tid: WORKER,
        kernel_stack: -1,
        user_stack,
        phase: Some(Phase::Auth),
    };
    RequestRecord {
        req_id: 10_000 + i,
        status: 200,
        t_arrive_ns: t0,
        t_done_ns: at,
        client_port: None,
        upstream_start_ns: None,
        parts,
        slices,
        samples: vec![sample(0), sample(1)],
        offcpu: vec![
            OffCpu {
                tid: WRITER,
                ns: 20_000,
                kernel_stack: -1,
                user_stack: MEDIAN_STACK,
                part: Part::LedgerFsync,
            },
            OffCpu {
                tid: WORKER,
                ns: 5_000,
                kernel_stack: -1,
                user_stack: -1,
                part: Part::Scheduling,
            },
        ],
        waits: Some(vec![
            wait_charge(Part::Scheduling, Holder::Process(HOG), 6_000, -1),
            wait_charge(
                Part::Scheduling,
                Holder::Request {
                    phase: Some(Phase::Auth),
                },
                4_000,
                TAIL_STACK,
            ),
        ]),
        hits: Hits::default(),
    }
}

fn svg_text(dir: &Path, name: &str) -> String {
    let text = fs::read_to_string(dir.join(name)).unwrap();
    parse_xml(&text).unwrap_or_else(|err| panic!("{name} is not XML: {err}"));
    text
}

/// Draws the pictures of the synthetic records into `dir`, with or without the wait-for view.
fn draw(dir: &Path, wait_for: bool) -> Pictures {
    draw_records(dir, wait_for, (0..REQUESTS).map(record).collect())
}

fn draw_records(dir: &Path, wait_for: bool, records: Vec<RequestRecord>) -> Pictures {
    let out = tracer::out_dir::OutDir::open_for(dir, false, None).unwrap();
    let mut session = FlameSession::create(&out).unwrap();
    if wait_for {
        session = session.with_wait_for();
    }
    for r in &records {
        session.push(r).unwrap();
    }
    assert_eq!(session.requests(), REQUESTS);

    let driver = addr(request_driver);
    let stacks = HashMap::from([
        (TAIL_STACK, vec![addr(tail_hot_path) + 1, driver + 1]),
        (MEDIAN_STACK, vec![addr(median_work) + 1, driver + 1]),
    ]);
    let overheads: Vec<u64> = records.iter().map(RequestRecord::overhead_ns).collect();
    let bands = Bands::nearest_rank(&overheads).unwrap();
    let mut symbolizer = Symbolizer::for_process(std::process::id()).unwrap();
    let threads = ThreadNames::from([
        (WORKER, "tokio-rt-worker".to_owned()),
        (WRITER, "ledger-writer".to_owned()),
    ]);
    session
        .finish(
            &bands,
            &stacks,
            &mut symbolizer,
            &threads,
            &HashMap::from([(HOG, "hog".to_owned())]),
            "gateway threads (pid 4242)",
        )
        .unwrap()
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn without_the_wait_for_view_no_wait_picture_is_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let summary = draw(dir.path(), false);
    assert_eq!(summary.requests, REQUESTS);
    assert_eq!((summary.wait, summary.wait_all), (None, None));
    let names = file_names(dir.path());
    assert!(names.contains(&"tail-oncpu.svg".to_owned()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("tail-wait")),
        "{names:?}"
    );
    let pictures = read_pictures(dir.path());
    assert!(pictures.wait.is_none() && pictures.wait_all.is_none());
}

#[test]
fn a_session_writes_every_picture_with_real_frames() {
    let dir = tempfile::tempdir().unwrap();
    let summary = draw(dir.path(), true);
    assert_eq!(
        read_pictures(dir.path()),
        summary,
        "what is returned is what is written"
    );

    assert_eq!(summary.requests, REQUESTS);
    assert_eq!(
        summary.tail.requests, 2,
        "nearest-rank p99 of 200 leaves 2 above it"
    );
    assert_eq!(summary.median_band.requests, 21);
    assert_eq!(summary.tail.samples, 4);
    assert_eq!(
        summary.trace.slowest_req_ids.first(),
        Some(&(10_000 + REQUESTS - 1))
    );
    assert_eq!(summary.trace.slowest_req_ids.len(), 20);
    assert_eq!(summary.trace.median_req_ids.len(), 20);

    assert_eq!(
        file_names(dir.path()),
        [
            "all-oncpu.folded",
            "all-oncpu.svg",
            "median-oncpu.folded",
            "pictures.json",
            "tail-diff.svg",
            "tail-offcpu.folded",
            "tail-offcpu.svg",
            "tail-oncpu.folded",
            "tail-oncpu.svg",
            "tail-wait.folded",
            "tail-wait.svg",
            "trace.json",
        ],
        "every picture is written and the spill file is gone"
    );

    let tail = svg_text(dir.path(), "tail-oncpu.svg");
    assert!(tail.contains("flame_session::tail_hot_path"));
    assert!(tail.contains("flame_session::request_driver"));
    assert!(
        !tail.contains("median_work"),
        "median stacks stay out of the tail"
    );
    assert!(tail.contains("2 tail requests"));
    let all = svg_text(dir.path(), "all-oncpu.svg");
    assert!(
        all.contains("flame_session::tail_hot_path") && all.contains("flame_session::median_work")
    );
    let off = svg_text(dir.path(), "tail-offcpu.svg");
    assert!(off.contains("fdatasync") && off.contains("flame_session::median_work"));
    svg_text(dir.path(), "tail-diff.svg");

    // The off-CPU tower of ledger_fsync sums to the part: 2 requests × 50 µs.
    let off_folded: tracer::flame::fold::Folded =
        fs::read_to_string(dir.path().join("tail-offcpu.folded"))
            .unwrap()
            .parse()
            .unwrap();
    assert_eq!(off_folded.count_with_frame("ledger_fsync"), 100_000);
    assert_eq!(off_folded.count_with_frame("scheduling"), 10_000);

    // The wait-for view: the tail's scheduling ns, all charged, the hog's share by name.
    let wait_folded: tracer::flame::fold::Folded =
        fs::read_to_string(dir.path().join("tail-wait.folded"))
            .unwrap()
            .parse()
            .unwrap();
    assert_eq!(wait_folded.total(), 20_000);
    assert_eq!(wait_folded.count_with_frame("hog (pid 777)"), 12_000);
    assert_eq!(wait_folded.count_with_frame("cpu.auth"), 8_000);
    let wait_svg = svg_text(dir.path(), "tail-wait.svg");
    assert!(
        wait_svg.contains("hog (pid 777)") && wait_svg.contains("flame_session::tail_hot_path")
    );
    let wait = summary.wait.unwrap();
    assert_eq!(wait.scheduling_ns, 20_000);
    assert_eq!(wait.charged_ns, 20_000);
    assert_eq!(
        wait.holders[0],
        session::pictures::Holder {
            holder: "other process · hog (pid 777)".to_owned(),
            ns: 12_000
        }
    );
    // Every request had its waits charged (10 µs each), so wait_all covers all of them.
    let wait_all = summary.wait_all.unwrap();
    assert_eq!(summary.wait_all_of, Some(Some("every request".to_owned())));
    assert_eq!(
        (wait_all.requests, wait_all.charged_ns),
        (Some(REQUESTS), 10_000 * REQUESTS)
    );
    let pictures = read_pictures(dir.path());
    let (wait, wait_all) = (pictures.wait.unwrap(), pictures.wait_all.unwrap());
    assert_eq!(wait.scheduling_ns, 20_000);
    assert_eq!(wait_all.scheduling_ns, 10_000 * REQUESTS);
    assert_eq!(pictures.wait_all_of, Some(Some("every request".to_owned())));
    assert_eq!(wait.uncharged_requests, Some(0));

    for folded in [
        "tail-wait.folded",
        "tail-oncpu.folded",
        "all-oncpu.folded",
        "tail-offcpu.folded",
        "median-oncpu.folded",
    ] {
        let mut svg = Vec::new();
        let file = fs::File::open(dir.path().join(folded)).unwrap();
        inferno::flamegraph::from_reader(
            &mut inferno::flamegraph::Options::default(),
            file,
            &mut svg,
        )
        .unwrap_or_else(|err| panic!("{folded} does not re-render: {err}"));
        parse_xml(std::str::from_utf8(&svg).unwrap()).unwrap();
    }

    let trace: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.path().join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let complete: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    let tracks: BTreeSet<(u64, u64)> = complete
        .iter()
        .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();
    let thread_tracks = tracks.iter().filter(|(pid, _)| *pid == 1).count();
    assert!(
        thread_tracks >= 3,
        "worker, other worker and writer tracks: {tracks:?}"
    );
    assert_eq!(
        tracks.len() - thread_tracks,
        40,
        "one overview track per request"
    );
    for e in &complete {
        assert!(e["ts"].as_f64().is_some() && e["dur"].as_f64().unwrap() >= 0.0);
        assert!(e["args"]["req_id"].as_u64().is_some() && e["args"]["part"].as_str().is_some());
    }
    let fsync_on_writer = complete
        .iter()
        .filter(|e| e["tid"] == WRITER && e["name"] == "ledger_fsync")
        .count();
    assert_eq!(fsync_on_writer, 40);
}

/// inferno's SVGs carry a DOCTYPE, which roxmltree rejects unless asked.
fn parse_xml(text: &str) -> Result<roxmltree::Document<'_>, roxmltree::Error> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(text, options)
}

#[test]
fn wait_all_stands_on_the_uniform_sample_when_not_every_request_was_charged() {
    let dir = tempfile::tempdir().unwrap();
    // Every request but the tail's two lose their charges, as past the tracer's warm-up.
    let records = (0..REQUESTS)
        .map(|i| {
            let mut r = record(i);
            if i < REQUESTS - 2 && !tracer::requests::wait::in_uniform_sample(r.req_id) {
                r.waits = None;
            }
            r
        })
        .collect();
    let summary = draw_records(dir.path(), true, records);
    let sampled = (0..REQUESTS)
        .filter(|i| tracer::requests::wait::in_uniform_sample(10_000 + i))
        .count() as u64;
    assert!(sampled > 0 && sampled < REQUESTS, "{sampled}");
    assert_eq!(
        summary.wait_all_of,
        Some(Some("a uniform 1-in-16 sample".to_owned()))
    );
    let wait_all = summary.wait_all.unwrap();
    assert_eq!(
        (wait_all.requests, wait_all.charged_ns),
        (Some(sampled), 10_000 * sampled)
    );
}

/// pictures.json, through the model (a key it does not know fails here).
fn read_pictures(dir: &Path) -> Pictures {
    serde_json::from_slice(&fs::read(dir.join("pictures.json")).unwrap()).unwrap()
}
