use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

const LONG: Duration = Duration::from_secs(20);

fn sh(name: &str, script: &str) -> Spawn {
    Spawn::new(name, "/bin/sh").args(["-c", script])
}

/// [`sh`], started.
fn started_sh(name: &str, script: &str) -> Proc {
    sh(name, script).start().unwrap()
}

/// Whether `pid` is still a process named `comm`, a zombie included: false once reaped (or
/// the pid reused by some other program).
fn present(pid: u32, comm: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.contains(&format!("({comm})")))
}

/// Whether `pid` ends within a generous bound (something else reaps it).
fn ends(pid: u32, comm: &str) -> bool {
    let deadline = Instant::now() + LONG;
    while present(pid, comm) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn the_ready_line_is_found_on_either_stream() {
    let mut proc = sh(
        "server",
        "echo noise; echo '  listening on 127.0.0.1:5 ' >&2; sleep 30",
    )
    .start()
    .unwrap();
    assert_eq!(
        proc.wait_for_prefix("listening on ", LONG).unwrap(),
        "127.0.0.1:5"
    );
    assert_eq!(
        proc.wait_for("the noise", LONG, |line| (line == "noise").then_some(()))
            .unwrap(),
        (),
        "every wait looks from the first line"
    );
    assert_eq!(
        proc.output_of(Stream::Stderr),
        "  listening on 127.0.0.1:5 \n"
    );
    assert_eq!(proc.output_of(Stream::Stdout), "noise\n");
}

#[test]
fn a_ready_line_that_does_not_come_is_an_error_with_the_output() {
    let mut proc = started_sh("slow", "echo starting up; echo warming >&2; sleep 30");
    proc.wait_for_prefix("warming", LONG).unwrap();
    let err = proc
        .wait_for_prefix("listening on ", Duration::from_millis(200))
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("slow did not print `listening on…`"),
        "{text}"
    );
    // The two streams are read apart: their lines interleave in any order.
    assert!(text.contains("\n    starting up"), "{text}");
    assert!(text.contains("\n    warming"), "{text}");
}

#[test]
fn a_child_that_exits_before_its_ready_line_is_an_error_with_its_status_and_output() {
    let mut proc = started_sh("tracer", "echo 'no probe sites' >&2; exit 3");
    let text = format!("{:#}", proc.wait_for_prefix("ready", LONG).unwrap_err());
    assert!(text.contains("tracer exited (exit status: 3)"), "{text}");
    assert!(text.contains("no probe sites"), "{text}");
}

#[test]
fn a_child_whose_grandchild_holds_its_pipes_is_seen_to_exit() {
    // The background sleep keeps stdout open after the shell exits.
    let mut proc = sh("launcher", "sleep 5 & exit 4").start().unwrap();
    let text = format!("{:#}", proc.wait_for_prefix("ready", LONG).unwrap_err());
    assert!(text.contains("launcher exited (exit status: 4)"), "{text}");
}

#[test]
fn a_dropped_child_is_terminated_first_then_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("terminated");
    let script = format!(
        "trap 'echo yes > {}; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
        marker.display()
    );
    let mut proc = sh("polite", &script).start().unwrap();
    proc.wait_for_prefix("ready", LONG).unwrap();
    let pid = proc.pid();
    drop(proc);
    assert!(!present(pid, "sh"), "reaped, not a zombie");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "yes\n");
}

#[test]
fn a_dropped_child_that_ignores_sigterm_is_killed_and_reaped() {
    let mut proc = sh(
        "stubborn",
        "trap '' TERM; echo ready; while :; do sleep 0.05; done",
    )
    .grace(Duration::from_millis(200))
    .start()
    .unwrap();
    proc.wait_for_prefix("ready", LONG).unwrap();
    let pid = proc.pid();
    drop(proc);
    assert!(!present(pid, "sh"));
}

#[test]
fn stop_reports_how_the_child_ended() {
    let mut proc = Spawn::new("sleep", "sleep").arg("30").start().unwrap();
    let (status, how) = proc.stop().unwrap();
    assert_eq!(how, Stopped::Terminated);
    assert!(!status.success());
    assert_eq!(proc.stop().unwrap().1, Stopped::Before);
    assert!(
        proc.signal(Signal::TERM).is_err(),
        "reaped: no pid to signal"
    );
}

#[test]
fn a_panic_in_a_test_leaves_no_process() {
    let pid = AtomicU32::new(0);
    let panicked = std::panic::catch_unwind(|| {
        let proc = Spawn::new("sleep", "sleep").arg("30").start().unwrap();
        pid.store(proc.pid(), Ordering::SeqCst);
        assert_eq!(1, 2, "a failing assertion");
    });
    assert!(panicked.is_err());
    let pid = pid.load(Ordering::SeqCst);
    assert_ne!(pid, 0);
    assert!(!present(pid, "sleep"));
}

/// Set in the copy of this test binary that [`an_aborted_parent_leaves_no_process`] runs.
const ABORT_ENV: &str = "TESTPROC_ABORT_WITH_A_CHILD";

/// In the copy: starts a sleeper, says its pid, and aborts (no unwinding, no drop).
#[test]
fn aborting_parent() {
    if std::env::var_os(ABORT_ENV).is_none() {
        return;
    }
    // No core file in the crate directory, whatever `ulimit -c` says.
    let core = rustix::process::getrlimit(rustix::process::Resource::Core);
    let none = rustix::process::Rlimit {
        current: Some(0),
        maximum: core.maximum,
    };
    rustix::process::setrlimit(rustix::process::Resource::Core, none).unwrap();
    let proc = Spawn::new("sleep", "sleep").arg("30").start().unwrap();
    println!("sleeper {}", proc.pid());
    std::io::stdout().flush().unwrap();
    std::process::abort();
}

#[test]
fn an_aborted_parent_leaves_no_process() {
    let me = std::env::current_exe().unwrap();
    let mut parent = Spawn::new("aborting parent", me)
        .args(["--exact", "tests::aborting_parent", "--nocapture"])
        .env(ABORT_ENV, "1")
        .start()
        .unwrap();
    // libtest may print `test tests::aborting_parent ... ` first on the same line.
    let sleeper: u32 = parent
        .wait_for("the sleeper's pid", LONG, |line| {
            line.split_once("sleeper ")?.1.trim().parse().ok()
        })
        .unwrap();
    let status = parent.wait_timeout(LONG).unwrap();
    assert!(!status.success(), "{status}");
    assert!(ends(sleeper, "sleep"), "pid {sleeper} outlived its parent");
}

#[test]
fn wait_timeout_kills_a_child_that_runs_on() {
    let mut proc = started_sh("hanging", "echo still here; exec sleep 30");
    proc.wait_for_prefix("still here", LONG).unwrap();
    let text = format!(
        "{:#}",
        proc.wait_timeout(Duration::from_millis(100)).unwrap_err()
    );
    assert!(text.contains("hanging still running after"), "{text}");
    assert!(text.contains("still here"), "{text}");
    assert!(!present(proc.pid(), "sleep"));
}

#[test]
fn the_output_is_copied_to_the_log_and_named_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("child.log");
    let mut proc = sh("logged", "echo one; echo two >&2; exit 1")
        .log(&log)
        .start()
        .unwrap();
    assert!(!proc.wait_timeout(LONG).unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains("one\n") && text.contains("two\n"), "{text}");
    assert!(proc.tail().contains(&log.display().to_string()));
    assert_eq!(proc.log_path(), Some(log.as_path()));
}

#[test]
fn a_pinned_child_runs_on_its_cpus() {
    let proc = Spawn::new("sleep", "sleep")
        .arg("30")
        .cpus(Some("0"))
        .start()
        .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", proc.pid())).unwrap();
    let allowed = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .map(str::trim);
    assert_eq!(allowed, Some("0"));
    assert_eq!(proc.cpus(), Some("0"));
}

#[test]
fn cpu_lists() {
    let set = parse_cpu_list("0,2-3").unwrap();
    assert_eq!(set.count(), 3);
    assert!(set.is_set(0) && !set.is_set(1) && set.is_set(2) && set.is_set(3));
    assert!(parse_cpu_list("3-1").is_err());
    assert!(parse_cpu_list("one").is_err());
    assert!(parse_cpu_list("").is_err());
    let err = Spawn::new("x", "true")
        .cpus(Some("0-"))
        .start()
        .err()
        .expect("a bad list");
    assert!(format!("{err:#}").contains("x's CPUs"), "{err:#}");
}

#[test]
fn a_pipe_asked_for_is_handed_over() {
    let mut proc = sh("raw", "echo direct >&2")
        .stderr(Stdio::piped())
        .start()
        .unwrap();
    let mut text = String::new();
    proc.take_stderr()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "direct\n");
    assert!(proc.wait().unwrap().success());
    assert_eq!(proc.output(), "", "not captured");
}
