//! Root only: how a session ends when it is told to. SIGTERM and SIGHUP (an ssh drop) end it
//! like Ctrl-C, writing its files and leaving nothing attached; a second Ctrl-C exits at once;
//! a stderr nobody reads any more does not stop it; tracefs it mounted is unmounted.

mod attach_common;

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use attach_common::*;

/// The fixture's body when re-executed by the tests below; a no-op in a normal test run.
#[test]
fn fixture_child() {
    if let Ok(secs) = std::env::var(FIXTURE_ENV) {
        fixture_main(secs.parse().unwrap());
    }
}

const READY: Duration = Duration::from_secs(120);

/// The session's files are there and readable.
fn assert_outputs(out: &Path, stderr: &str) {
    let breakdown = std::fs::read_to_string(out.join("breakdown.json"))
        .unwrap_or_else(|e| panic!("no breakdown.json ({e}):\n{stderr}"));
    let json: serde_json::Value = serde_json::from_str(&breakdown).unwrap();
    assert!(json["requests"].is_u64(), "{breakdown}");
    let requests = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    assert!(requests.starts_with("request_id,"), "{requests}");
}

/// Records the fixture, sends `signal` once attached, and checks the session ended cleanly.
fn stops_cleanly_on(signal: i32) {
    let me = std::env::current_exe().unwrap();
    let mut fixture = spawn_fixture(&me, 600.0);
    let out = tempfile::tempdir().unwrap();
    let tracer = Background::spawn(&record_args(fixture.id(), out.path(), &["--no-calibrate"]));
    tracer.wait_ready(READY);
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child, not reaped yet.
    unsafe { libc::kill(tracer.child.id() as i32, signal) };
    let (status, stderr) = tracer.finish();
    fixture.kill().unwrap();
    fixture.wait().unwrap();
    assert!(status.success(), "tracer failed ({status}):\n{stderr}");
    assert!(
        stderr.contains(&format!("stopped (signal {signal})")),
        "{stderr}"
    );
    assert_outputs(out.path(), &stderr);
    assert_eq!(still_loaded(&program_ids(&stderr)), Vec::<u32>::new());
    assert_eq!(leftover_uprobes(&me), Vec::<String>::new());
}

#[test]
fn sigterm_mid_session_writes_the_outputs_and_detaches() {
    if require_root("sigterm_mid_session_writes_the_outputs_and_detaches") {
        stops_cleanly_on(libc::SIGTERM);
    }
}

#[test]
fn sighup_mid_session_writes_the_outputs_and_detaches() {
    if require_root("sighup_mid_session_writes_the_outputs_and_detaches") {
        stops_cleanly_on(libc::SIGHUP);
    }
}

#[test]
fn a_second_sigint_exits_at_once_writing_nothing() {
    if !require_root("a_second_sigint_exits_at_once_writing_nothing") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let mut fixture = spawn_fixture(&me, 600.0);
    let out = tempfile::tempdir().unwrap();
    let args = record_args(fixture.id(), out.path(), &["--no-calibrate"]);
    let mut child = tracer()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    let pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut seen = String::new();
    let mut wait_for = |prefix: &str| loop {
        let line = received
            .recv_timeout(READY)
            .unwrap_or_else(|_| panic!("no `{prefix}` line:\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with(prefix) {
            break;
        }
    };
    // SAFETY (both kills): signalling our own child, not reaped yet.
    wait_for("tracer: program ids ");
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    // Only once the first is handled: two pending SIGINTs would merge into one.
    wait_for("tracer: stopping (signal 2)");
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    reader.join().unwrap();
    fixture.kill().unwrap();
    fixture.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status}:\n{seen}");
    assert!(
        !out.path().join("breakdown.json").exists(),
        "an interrupted stop writes no breakdown:\n{seen}"
    );
}

#[test]
fn a_closed_stderr_does_not_stop_the_session() {
    if !require_root("a_closed_stderr_does_not_stop_the_session") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let mut fixture = spawn_fixture(&me, 600.0);
    let out = tempfile::tempdir().unwrap();
    // Progress lines come every second: the ones after the ready line hit a closed pipe.
    let args = record_args(
        fixture.id(),
        out.path(),
        &["--no-calibrate", "--duration", "3"],
    );
    let mut child = tracer()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with("tracer: program ids ") {
            break;
        }
    }
    // The reader is dropped here: every later write to stderr fails with EPIPE.
    let status = child.wait().unwrap();
    fixture.kill().unwrap();
    fixture.wait().unwrap();
    assert!(status.success(), "tracer failed ({status}):\n{seen}");
    assert_outputs(out.path(), &seen);
}

/// In a mount namespace of its own where tracefs is not mounted, the tracer mounts it, and
/// unmounts it when done.
#[test]
fn tracefs_the_tracer_mounted_is_unmounted() {
    if !require_root("tracefs_the_tracer_mounted_is_unmounted") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let mut fixture = spawn_fixture(&me, 600.0);
    let out = tempfile::tempdir().unwrap();
    let args = record_args(
        fixture.id(),
        out.path(),
        &["--no-calibrate", "--duration", "1"],
    );
    // Exit 99: tracefs still mounted after the tracer. The host's mounts are not touched.
    let script = r#"umount /sys/kernel/tracing || exit 98
"$@"; rc=$?
grep -q ' /sys/kernel/tracing tracefs ' /proc/self/mounts && exit 99
exit $rc"#;
    let output = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(env!("CARGO_BIN_EXE_tracer"))
        .args(&args)
        .output()
        .expect("running unshare");
    fixture.kill().unwrap();
    fixture.wait().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}:\n{stderr}", output.status);
    assert!(stderr.contains("tracer: mounted tracefs"), "{stderr}");
    assert!(stderr.contains("tracer: unmounted tracefs"), "{stderr}");
    assert_outputs(out.path(), &stderr);
}
