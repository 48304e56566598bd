//! Accuracy invariants on a real gateway (root; skipped with a message otherwise):
//! - a small open-loop run with the tracer attached: every 200 response is traced complete,
//!   and for each, client send ≤ t_arrive ≤ t_done ≤ client receive (so no negative
//!   `client − tracer` gap);
//! - a forced-loss run (1 MiB ring, the tracer's reader stopped for 2 s): events are lost,
//!   requests are marked incomplete, and no complete request overlaps a loss span or breaks
//!   the invariants above.

mod attach_common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use attach_common::{
    Background, Binaries, Proc, Signal, Spawn, cargo_build_binaries, demo_init, start,
    wait_listening,
};
use session::analysis::accuracy::{self, Accuracy};

/// Starts a server that prints `listening on ADDR`; returns it and the address.
fn serve(name: &str, command: Command) -> (Proc, String) {
    let mut server = start(Spawn::command(name, command));
    let addr = wait_listening(&mut server);
    (server, addr)
}

/// `tracer record` with `extra` flags, once its programs are attached.
fn attach(pid: u32, out: &Path, extra: &[&str]) -> Background {
    Background::attached(
        Spawn::command("tracer", attach_common::tracer())
            .args(["record", "--pid", &pid.to_string(), "--out"])
            .arg(out)
            .args(["--sample-hz", "99"])
            .args(extra)
            .log(out.with_extension("log")),
        Duration::from_secs(60),
    )
}

/// SIGINT, then wait for the tracer to write its files; returns breakdown.json.
fn stop(mut tracer: Background, out: &Path) -> serde_json::Value {
    tracer.stop(Duration::from_secs(120));
    serde_json::from_str(&fs::read_to_string(out.join("breakdown.json")).unwrap()).unwrap()
}

fn loadgen(bins: &Binaries, url: &str, key: &str, rate: u32, secs: u32, csv: &Path) -> Command {
    let mut command = Command::new(&bins.loadgen);
    command
        .args(["--url", url, "--key", key, "--rate", &rate.to_string()])
        .args(["--duration", &secs.to_string(), "--warmup", "0"])
        .args(["--connections", "8", "--quiet", "--requests-out"])
        .arg(csv)
        .stdout(Stdio::null());
    command
}

fn join(client_csv: &Path, out: &Path) -> Accuracy {
    let (requests, incomplete) = (out.join("requests.csv"), out.join("incomplete.csv"));
    accuracy::join_files(client_csv, &requests, &incomplete).unwrap()
}

/// Complete requests overlapping one of breakdown.json's loss spans.
fn crossing_loss(out: &Path, breakdown: &serde_json::Value) -> usize {
    let spans: Vec<(u64, u64)> = breakdown["loss_spans"]
        .as_array()
        .expect("breakdown.json lists loss_spans")
        .iter()
        .map(|s| (s[0].as_u64().unwrap(), s[1].as_u64().unwrap()))
        .collect();
    let file = fs::File::open(out.join("requests.csv")).unwrap();
    let traced = accuracy::read_traced_csv(file).unwrap();
    traced
        .iter()
        .filter(|r| {
            spans
                .iter()
                .any(|&(from, to)| from <= r.t_done_ns && to >= r.t_arrive_ns)
        })
        .count()
}

#[test]
fn client_and_tracer_agree_and_loss_is_never_attributed() {
    if !attach_common::require_root() {
        return;
    }
    let bins = cargo_build_binaries();
    let dir = tempfile::tempdir().unwrap();
    let mut mock = Command::new(&bins.mock_upstream);
    mock.args(["--listen", "127.0.0.1:0"]);
    let (_mock, mock_addr) = serve("mock-upstream", mock);
    let db = dir.path().join("ledger.db");
    let key = demo_init(&bins.gateway, &db, &format!("http://{mock_addr}"));
    let mut gateway = Command::new(&bins.gateway);
    gateway
        .args(["serve", "--listen", "127.0.0.1:0", "--workers", "1", "--db"])
        .arg(&db);
    let (gateway, addr) = serve("gateway", gateway);
    let url = format!("http://{addr}");
    let pid = gateway.pid();

    // A small open loop, traced.
    let out = dir.path().join("small");
    let tracer = attach(pid, &out, &[]);
    let csv = dir.path().join("small-client.csv");
    let status = loadgen(&bins, &url, &key, 200, 3, &csv).status().unwrap();
    assert!(status.success(), "loadgen failed");
    let breakdown = stop(tracer, &out);
    let acc = join(&csv, &out);
    assert!(acc.matched >= 500, "{acc:?}");
    assert_eq!(
        acc.untraced_ok, 0,
        "200s not traced: {:?}",
        acc.untraced_ok_ids
    );
    assert_eq!(acc.negative, 0, "negative gaps: {:?}", acc.negative_ids);
    assert_eq!((acc.arrive_before_sent, acc.done_after_received), (0, 0));
    assert_eq!((acc.tracer_only, acc.status_mismatch), (0, 0));
    assert_eq!(breakdown["lost_events"], 0);

    // Forced loss: a 1 MiB ring, and the reader stopped for 2 s mid-run.
    let out = dir.path().join("forced");
    let mut tracer = attach(pid, &out, &["--ring-mib", "1"]);
    let csv = dir.path().join("forced-client.csv");
    let mut load = start(Spawn::command(
        "loadgen",
        loadgen(&bins, &url, &key, 1000, 5, &csv),
    ));
    std::thread::sleep(Duration::from_secs(1));
    tracer.signal(Signal::STOP);
    std::thread::sleep(Duration::from_secs(2));
    tracer.signal(Signal::CONT);
    let status = load.wait().unwrap();
    assert!(status.success(), "loadgen failed ({status}){}", load.tail());
    let breakdown = stop(tracer, &out);
    assert!(
        breakdown["lost_events"].as_u64().unwrap() > 0,
        "no loss forced"
    );
    assert!(
        breakdown["incomplete"].as_u64().unwrap() > 0,
        "no request marked incomplete"
    );
    // Woken to a full ring, the reader ran at normal priority until it kept up again.
    assert!(
        breakdown["tracer"]["reader_behind_s"].as_f64().unwrap() > 0.0,
        "the reader never counted itself behind: {}",
        breakdown["tracer"]
    );
    assert_eq!(
        crossing_loss(&out, &breakdown),
        0,
        "a complete request crosses a loss span"
    );
    let acc = join(&csv, &out);
    assert!(acc.matched > 0, "{acc:?}");
    assert_eq!(acc.negative, 0, "negative gaps: {:?}", acc.negative_ids);
    assert_eq!((acc.arrive_before_sent, acc.done_after_received), (0, 0));
    assert_eq!((acc.tracer_only, acc.status_mismatch), (0, 0));

    drop(gateway);
    let uprobes = fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    let gateway_path = bins.gateway.display().to_string();
    assert!(!uprobes.contains(&gateway_path), "uprobes left: {uprobes}");
}
