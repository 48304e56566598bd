//! A fixed synthetic session → the stdout table and breakdown.json, compared with
//! tests/golden/. Rerun with `BLESS=1` to accept a deliberate change.

use std::collections::BTreeMap;
use std::path::Path;

use session::breakdown::Breakdown;
use session::requests::{IncompleteRow, RequestRow};
use tracer::out_dir::OutDir;
use tracer::report::{SessionEnd, SessionMeta, SessionWriter};
use tracer::requests::synthetic::record_of_parts;
use tracer::requests::{Hits, Incomplete, Outcome, PARTS, Part};
use tracer_ebpf::sites::Phase;

mod xorshift;
use xorshift::Rng;

/// 2000 requests: upstream ~1 ms, a few µs of CPU per phase, a receipt wait of fsync and
/// signing, and a heavy tail from fsync and scheduling in about 2% of requests.
fn session() -> Vec<Outcome> {
    let mut rng = Rng(0x5eed);
    let mut out = Vec::new();
    let mut t = 1_000_000_000u64;
    for id in 1..=2000u64 {
        let mut parts = [0u64; PARTS];
        let mut set = |p: Part, ns: u64| parts[p.index()] = ns;
        let slow = rng.next().is_multiple_of(50);
        set(Part::Upstream, rng.range(900_000, 1_100_000));
        set(
            Part::Scheduling,
            rng.range(5_000, 20_000) + if slow { rng.range(100_000, 900_000) } else { 0 },
        );
        set(
            Part::LedgerFsync,
            rng.range(200_000, 300_000)
                + if slow {
                    rng.range(1_000_000, 4_000_000)
                } else {
                    0
                },
        );
        set(Part::Signing, rng.range(30_000, 40_000));
        set(Part::LedgerOther, rng.range(10_000, 60_000));
        for phase in [
            Phase::Parse,
            Phase::Auth,
            Phase::Scope,
            Phase::Upstream,
            Phase::Respond,
        ] {
            set(Part::Cpu(phase), rng.range(2_000, 9_000));
        }
        set(Part::BlockedOther, rng.range(0, 3_000));
        let hits = Hits {
            sites: 22,
            syscalls: 4,
            sock: 3,
            sched: (id % 7) as u32,
            samples: (id % 3 == 0) as u32,
        };
        out.push(Outcome::Complete(record_of_parts(id, 200, t, parts, hits)));
        if id.is_multiple_of(400) {
            let reason = if id.is_multiple_of(800) {
                "events lost"
            } else {
                "arrival not seen"
            };
            out.push(Outcome::Incomplete(Incomplete {
                req_id: 100_000 + id,
                reason: reason.into(),
            }));
        }
        t += rng.range(200_000, 800_000);
    }
    out
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with BLESS=1 to create it)", path.display()));
    assert_eq!(
        actual, expected,
        "{name} differs from the golden file; BLESS=1 accepts the change"
    );
}

fn run(dir: &Path) -> tracer::report::Summary {
    let meta = SessionMeta {
        pid: 4242,
        record_args: ["tracer", "record", "--pid", "4242", "--out", "golden"]
            .map(str::to_owned)
            .to_vec(),
        attach_modes: BTreeMap::from([
            ("sched_switch".to_owned(), "tp_btf".to_owned()),
            ("sys_exit_write".to_owned(), "tracepoint".to_owned()),
            ("probe_sites".to_owned(), "uprobe".to_owned()),
        ]),
    };
    let out = OutDir::open_for(dir, false, None).unwrap();
    let mut writer = SessionWriter::create(&out, meta).unwrap();
    for outcome in session() {
        writer.write(&outcome).unwrap();
    }
    writer
        .finish(SessionEnd {
            duration_s: 10.0,
            lost_events: 17,
        })
        .unwrap()
}

#[test]
fn table_and_breakdown_match_golden_files() {
    let dir = tempfile::tempdir().unwrap();
    let summary = run(dir.path());
    let json = std::fs::read_to_string(dir.path().join("breakdown.json")).unwrap();
    golden("report_table.txt", &summary.table);
    golden("report_breakdown.json", &json);
}

#[test]
fn files_are_consistent_with_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let summary = run(dir.path());
    assert_eq!((summary.requests, summary.incomplete), (2000, 5));

    let csv = std::fs::read_to_string(dir.path().join("requests.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(
        header.starts_with(
            "request_id,status,t_arrive_ns,t_done_ns,total_ns,overhead_ns,upstream_ns,"
        ),
        "{header}"
    );
    assert!(
        header.ends_with(",unattributed_ns,client_port,t_upstream_ns"),
        "{header}"
    );
    let rows: Vec<RequestRow> = session::requests::rows(csv.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), 2000);
    for row in &rows {
        assert_eq!(row.parts().len(), PARTS);
        assert_eq!(
            row.parts().iter().sum::<u64>(),
            row.total_ns,
            "parts sum to total"
        );
        assert_eq!(
            row.total_ns - row.upstream_ns,
            row.overhead_ns,
            "overhead = total - upstream"
        );
        assert_eq!(row.t_done_ns - row.t_arrive_ns, row.total_ns);
    }
    let incomplete: Vec<IncompleteRow> =
        session::requests::rows(std::fs::File::open(dir.path().join("incomplete.csv")).unwrap())
            .collect::<Result<_, _>>()
            .unwrap();
    assert_eq!(incomplete.len(), 5);

    let json =
        Breakdown::from_json(&std::fs::read_to_string(dir.path().join("breakdown.json")).unwrap())
            .unwrap();
    assert_eq!(json.requests, 2000);
    assert_eq!(json.incomplete, 5);
    assert_eq!(json.incomplete_reasons["events lost"], 2);
    assert_eq!(json.lost_events, 17);
    assert_eq!(json.attach_modes["sched_switch"], "tp_btf");
    for (band, parts) in [("tail", &json.tail.parts), ("median", &json.median.parts)] {
        assert_eq!(parts.len(), PARTS);
        assert!(parts["upstream"].share.is_none());
        let shares: f64 = parts.values().filter_map(|p| p.share).sum();
        assert!(
            (shares - 1.0).abs() < 0.01,
            "{band}: shares sum to {shares}"
        );
    }
    // The tail: requests strictly above the p99 of overhead, recounted from the CSV.
    let threshold = summary.tail_threshold_ns;
    let above = rows.iter().filter(|r| r.overhead_ns > threshold).count() as u64;
    assert_eq!(summary.tail.requests, above);
    assert!((10..=30).contains(&above), "about 1% of 2000: {above}");
    let exact: f64 = Part::ALL
        .iter()
        .filter(|p| **p != Part::Upstream)
        .map(|p| summary.tail.share(*p).unwrap())
        .sum();
    assert!(
        (exact - 1.0).abs() < 1e-9,
        "unrounded shares sum to 1: {exact}"
    );
    assert!(
        summary.median.requests >= 150,
        "p45..p55 holds about 10%: {}",
        summary.median.requests
    );
}

#[test]
fn bad_directory_is_a_clear_error() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let err = OutDir::open_for(&file.path().join("sub"), false, None).unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("output directory") && err.contains("is not a directory"),
        "{err}"
    );
}
