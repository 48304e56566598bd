//! loadgen against mock-upstream on loopback, through the real binary.

mod common;

use common::{MockUpstream, loadgen, read_json, run_direct};

#[test]
fn open_loop_achieves_the_target_rate_and_logs_every_request() {
    let upstream = MockUpstream::start();
    let (summary, rows) = run_direct(
        &upstream.url,
        &[
            "--rate",
            "1000",
            "--duration",
            "3",
            "--warmup",
            "0.5",
            "--connections",
            "8",
            "--first-id",
            "5000",
        ],
    );
    let achieved = summary["achieved_rate"].as_f64().unwrap();
    assert!(
        (achieved - 1000.0).abs() <= 20.0,
        "achieved {achieved} req/s, target 1000"
    );
    assert_eq!(summary["errors"], serde_json::json!({}));
    assert_eq!(summary["sent"], 3500);
    assert_eq!(summary["ok"], 3000);
    assert_eq!(summary["latency_from"], "scheduled");
    let lag_p50 = summary["send_lag_us"]["p50"].as_f64().unwrap();
    assert!(lag_p50 >= 0.0 && lag_p50 <= summary["latency_us"]["p50"].as_f64().unwrap());

    assert_eq!(
        rows.len() as u64,
        summary["sent"].as_u64().unwrap(),
        "one row per request sent"
    );
    assert_eq!(rows.iter().filter(|r| r.warmup).count(), 500);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.id, 5000 + i as u64, "ids are unique and consecutive");
        assert_eq!(row.status, 200);
        assert!(row.scheduled_ns <= row.sent_ns && row.sent_ns <= row.received_ns);
    }
    // Each request names its connection: the eight keep-alive connections' ports.
    let ports: std::collections::BTreeSet<u16> = rows.iter().map(|r| r.local_port).collect();
    assert!(
        ports.len() == 8 && !ports.contains(&0),
        "connections' ports: {ports:?}"
    );
    // The schedule is fixed: 1 ms apart.
    let span = rows.last().unwrap().scheduled_ns - rows[0].scheduled_ns;
    assert!(
        (span as i64 - 3_499_000_000).abs() < 1_000,
        "schedule span {span} ns"
    );
}

#[test]
fn closed_loop_logs_one_row_per_request_sent() {
    let upstream = MockUpstream::start();
    let (summary, rows) = run_direct(
        &upstream.url,
        &["--concurrency", "4", "--duration", "0.5", "--warmup", "0.2"],
    );
    assert!(!rows.is_empty());
    assert_eq!(rows.len() as u64, summary["sent"].as_u64().unwrap());
    let measured = rows.iter().filter(|r| !r.warmup).count() as u64;
    assert_eq!(measured, summary["measured"].as_u64().unwrap());
    let mut ids: Vec<u64> = rows.iter().map(|r| r.id).collect();
    ids.dedup();
    assert_eq!(ids.len(), rows.len(), "ids are unique");
    assert!(
        rows.iter()
            .all(|r| r.scheduled_ns == r.sent_ns && r.status == 200)
    );
    assert_eq!(summary["latency_from"], "sent");
    assert!(
        summary["send_lag_us"].is_null(),
        "no schedule in closed loop"
    );
}

#[test]
fn find_max_reports_a_rate_and_its_steps() {
    let upstream = MockUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("max.json");
    testproc::succeeded_stdout(
        "loadgen",
        loadgen(&[
            "--url",
            &upstream.url,
            "--direct",
            "--find-max",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--max-concurrency",
            "4",
            "--out",
            json.to_str().unwrap(),
        ]),
    );
    let result = read_json(&json);
    let steps = result["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.len() <= 3, "c1, c2, c4 at most");
    assert!(result["max_rate"].as_f64().unwrap() > 0.0);
    let best = steps
        .iter()
        .map(|s| s["achieved_rate"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(result["max_rate"].as_f64().unwrap(), best);
}
