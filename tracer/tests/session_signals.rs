//! Root only: how a session ends when it is told to. SIGTERM and SIGHUP (an ssh drop) end it
//! like Ctrl-C, writing its files and leaving nothing attached; a second Ctrl-C exits at once;
//! a stderr nobody reads any more does not stop it; tracefs it mounted is unmounted.

mod attach_common;

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
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

/// A running fixture, stopped when the test ends (a failed assertion too), and an empty --out.
struct Setup {
    me: PathBuf,
    fixture: Proc,
    out: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let me = std::env::current_exe().unwrap();
        // Long enough for a slow machine to attach; stopped on drop.
        let fixture = spawn_fixture(&me, 600.0);
        let out = tempfile::tempdir().unwrap();
        Setup { me, fixture, out }
    }

    /// `tracer record` of the fixture into the --out, without calibration, then `extra`.
    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut all = vec!["--no-calibrate"];
        all.extend_from_slice(extra);
        record_args(self.fixture.pid(), self.out.path(), &all)
    }

    /// The tracer with `extra`, its stderr piped to the test.
    fn spawn_tracer(&self, extra: &[&str]) -> Proc {
        testproc::Spawn::command("tracer", tracer())
            .args(self.args(extra))
            .stderr(Stdio::piped())
            .start()
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The session's files are there and readable.
    fn assert_outputs(&self, stderr: &str) {
        let out = self.out.path();
        let breakdown = std::fs::read_to_string(out.join("breakdown.json"))
            .unwrap_or_else(|e| panic!("no breakdown.json ({e}):\n{stderr}"));
        let json: serde_json::Value = serde_json::from_str(&breakdown).unwrap();
        assert!(json["requests"].is_u64(), "{breakdown}");
        let requests = std::fs::read_to_string(out.join("requests.csv")).unwrap();
        assert!(requests.starts_with("request_id,"), "{requests}");
    }
}

/// Records the fixture, sends `signal` once attached, and checks the session ended cleanly.
fn stops_cleanly_on(signal: Signal) {
    let setup = Setup::new();
    let mut tracer = Background::spawn(&setup.args(&[]));
    tracer.wait_ready(READY);
    std::thread::sleep(Duration::from_millis(500));
    tracer.signal(signal);
    let (status, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed ({status}):\n{stderr}");
    assert!(
        stderr.contains(&format!("stopped (signal {})", signal.as_raw())),
        "{stderr}"
    );
    setup.assert_outputs(&stderr);
    assert_detached(&stderr, &[&setup.me]);
}

#[test]
fn item5_sigterm_mid_session_writes_the_outputs_and_detaches() {
    if require_root() {
        stops_cleanly_on(Signal::TERM);
    }
}

#[test]
fn item5_sighup_mid_session_writes_the_outputs_and_detaches() {
    if require_root() {
        stops_cleanly_on(Signal::HUP);
    }
}

#[test]
fn item5_a_second_sigint_exits_at_once_writing_nothing() {
    if !require_root() {
        return;
    }
    let setup = Setup::new();
    let mut tracer = Background::spawn(&setup.args(&[]));
    tracer.wait_ready(READY);
    std::thread::sleep(Duration::from_millis(300));
    tracer.signal(Signal::INT);
    // Only once the first is handled: two pending SIGINTs would merge into one.
    tracer.wait_for_prefix("tracer: stopping (signal 2)", READY);
    tracer.signal(Signal::INT);
    let (status, seen) = tracer.finish();
    assert_eq!(status.code(), Some(130), "{status}:\n{seen}");
    assert!(
        !setup.out.path().join("breakdown.json").exists(),
        "an interrupted stop writes no breakdown:\n{seen}"
    );
}

#[test]
fn item5_a_closed_stderr_does_not_stop_the_session() {
    if !require_root() {
        return;
    }
    let setup = Setup::new();
    // Progress lines come every second: the ones after the ready line hit a closed pipe.
    let mut tracer = setup.spawn_tracer(&["--duration", "3"]);
    let mut seen = String::new();
    for line in BufReader::new(tracer.take_stderr().unwrap()).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with("tracer: program ids ") {
            break;
        }
    }
    // The reader is dropped here: every later write to stderr fails with EPIPE.
    let status = tracer.wait().unwrap();
    assert!(status.success(), "tracer failed ({status}):\n{seen}");
    setup.assert_outputs(&seen);
}

/// `sh -c RUN` with the tracer's path as `$1`, in a mount namespace of its own where tracefs is
/// not mounted (the host's mounts are not touched). Exit 99: tracefs was still mounted after
/// RUN; otherwise RUN's exit status.
fn without_tracefs(run: &str) -> Command {
    let script = format!(
        "if grep -q ' /sys/kernel/tracing tracefs ' /proc/self/mounts; then \
           umount /sys/kernel/tracing || exit 98; fi
{run}; rc=$?
grep -q ' /sys/kernel/tracing tracefs ' /proc/self/mounts && exit 99
exit $rc"
    );
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .arg(env!("CARGO_BIN_EXE_tracer"));
    command
}

/// In a mount namespace of its own where tracefs is not mounted, the tracer mounts it, and
/// unmounts it when done.
#[test]
fn item5_tracefs_the_tracer_mounted_is_unmounted() {
    if !require_root() {
        return;
    }
    let setup = Setup::new();
    let output = without_tracefs(r#""$@""#)
        .args(setup.args(&["--duration", "1"]))
        .output()
        .expect("running unshare");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}:\n{stderr}", output.status);
    assert!(stderr.contains("tracer: mounted tracefs"), "{stderr}");
    assert!(stderr.contains("tracer: unmounted tracefs"), "{stderr}");
    setup.assert_outputs(&stderr);
}

/// A second Ctrl-C exits at once, and still unmounts tracefs the tracer mounted (in a mount
/// namespace of its own, as above).
#[test]
fn item5_a_second_sigint_still_unmounts_tracefs_the_tracer_mounted() {
    if !require_root() {
        return;
    }
    let setup = Setup::new();
    // The inner sh names the tracer's pid, then becomes the tracer, in the foreground (a
    // background job would ignore SIGINT).
    let mut child = without_tracefs(r#"sh -c 'echo "tracer pid $$" >&2; exec "$@"' sh "$@""#)
        .args(setup.args(&[]))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running unshare");
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
        if let Some(rest) = line.strip_prefix(prefix) {
            break rest.to_owned();
        }
    };
    let pid: i32 = wait_for("tracer pid ").parse().unwrap();
    wait_for("tracer: mounted tracefs");
    wait_for("tracer: program ids ");
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: the tracer is the shell's child, not reaped until the shell has waited for it.
    unsafe { libc::kill(pid, libc::SIGINT) };
    wait_for("tracer: stopping (signal 2)");
    // SAFETY: as above; the shell is still waiting for it.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert_ne!(status.code(), Some(99), "tracefs is still mounted:\n{seen}");
    assert_eq!(status.code(), Some(130), "{status}:\n{seen}");
}
