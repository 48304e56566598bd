//! Root only: attach the tracer to a fixture with every probe site, check that every kind of
//! event arrives, and that nothing of ours stays in the kernel afterwards. `TRACER_ATTACH` is
//! passed on as `--attach`; the attach lines must show the mode detection picks for it.

mod attach_common;

use std::time::Duration;

use attach_common::*;

/// The fixture's body when re-executed by the tests below; a no-op in a normal test run.
#[test]
fn fixture_child() {
    if let Ok(secs) = std::env::var(FIXTURE_ENV) {
        fixture_main(secs.parse().unwrap());
    }
}

#[test]
fn every_event_kind_arrives_and_detach_is_clean() {
    if !require_root("every_event_kind_arrives_and_detach_is_clean") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let stderr = record_fixture(&me, &["--duration", "3", "--offcpu-stacks"]);
    eprintln!("{stderr}");

    let (syscalls, sockets) = expected_kinds();
    for (group, mode) in [
        ("sched", "tracepoint"),
        ("syscalls", syscalls.as_str()),
        ("sockets", sockets.as_str()),
        ("sites", "uprobe"),
        ("samples", "perf_event"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("tracer: attach {group} ")));
        let line = line.unwrap_or_else(|| panic!("no attach line for {group}:\n{stderr}"));
        let shown = line.split_whitespace().nth(3);
        assert_eq!(shown, Some(mode), "{line}");
    }
    let counts = event_counts(&stderr);
    assert_eq!(counts.len(), 10, "{stderr}");
    // A task name is sent only when a process outside the target takes its CPU.
    for (name, count) in counts.iter().filter(|(name, _)| name != "task_name") {
        assert!(*count > 0, "no {name} events:\n{stderr}");
    }
    assert!(stderr.contains("stopped (duration reached)"), "{stderr}");
    assert!(stderr.contains("(0 lost"), "{stderr}");

    let ids = program_ids(&stderr);
    assert!(ids.len() > 30, "program ids missing:\n{stderr}");
    assert_eq!(
        still_loaded(&ids),
        Vec::<u32>::new(),
        "programs outlived the tracer"
    );
    assert_eq!(leftover_uprobes(&me), Vec::<String>::new());
}

#[test]
fn stops_when_the_target_exits() {
    if !require_root("stops_when_the_target_exits") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    // Lives long enough for any machine to attach; killed once traced for a moment.
    let mut fixture = spawn_fixture(&me, 600.0);
    let out = tempfile::tempdir().unwrap();
    let pid = fixture.pid().to_string();
    let mut tracer =
        Background::spawn(&record_args(fixture.pid(), out.path(), &["--no-calibrate"]));
    tracer.wait_ready(Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(500));
    fixture.kill().unwrap();
    let exited = std::time::Instant::now();
    let (status, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed:\n{stderr}");
    assert!(
        stderr.contains(&format!("stopped (pid {pid} exited)")),
        "{stderr}"
    );
    // Bounded: the tracer must not wait for anything once the target is gone.
    assert!(exited.elapsed() < Duration::from_secs(30));
    let counts = event_counts(&stderr);
    assert!(
        counts.iter().any(|(name, n)| name == "site" && *n > 0),
        "{stderr}"
    );
    assert_eq!(still_loaded(&program_ids(&stderr)), Vec::<u32>::new());
    assert_eq!(leftover_uprobes(&me), Vec::<String>::new());
}

#[test]
fn sigint_detaches() {
    if !require_root("sigint_detaches") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    // Killed when done: long enough for a slow (emulated) machine to calibrate and attach.
    let fixture = spawn_fixture(&me, 600.0);
    let out = tempfile::tempdir().unwrap();
    let mut tracer = Background::spawn(&record_args(fixture.pid(), out.path(), &[]));
    tracer.wait_ready(Duration::from_secs(120));
    tracer.signal(Signal::INT);
    let (status, stderr) = tracer.finish();
    drop(fixture);
    assert!(status.success(), "tracer failed:\n{stderr}");
    assert!(stderr.contains("stopped (signal 2)"), "{stderr}");
    assert_eq!(still_loaded(&program_ids(&stderr)), Vec::<u32>::new());
}

/// `--empty-programs` (validate's "hooks only" floor row) must cost what the hooks cost: every
/// group attached as in a normal session, while the fixture keeps hitting its sites and
/// syscalls, and not one event written.
#[test]
fn empty_programs_attach_every_hook_and_record_nothing() {
    if !require_root("empty_programs_attach_every_hook_and_record_nothing") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let stderr = record_fixture(
        &me,
        &["--duration", "2", "--no-calibrate", "--empty-programs"],
    );
    assert!(stderr.contains("+ empty programs"), "{stderr}");
    for group in ["sched", "syscalls", "sockets", "sites", "samples"] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("tracer: attach {group} "))),
            "no attach line for {group}:\n{stderr}"
        );
    }
    let counts = event_counts(&stderr);
    assert_eq!(counts.len(), 10, "{stderr}");
    assert!(counts.iter().all(|(_, n)| *n == 0), "{stderr}");
    assert_eq!(still_loaded(&program_ids(&stderr)), Vec::<u32>::new());
    assert_eq!(leftover_uprobes(&me), Vec::<String>::new());
}

/// Issue 21 item 7: a thread that exits leaves TIDS for good. Its last switch-out, after
/// sched_process_exit removed it, used to add it back: here the fixture's two threads stayed in
/// the map after the process had exited.
#[test]
fn item7_tids_not_readded_at_exit() {
    use tracer::attach::{
        Group, Options, Session,
        detect::{Choice, Plan},
        target::Target,
    };
    if !require_root("item7_tids_not_readded_at_exit") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    // Ends on its own (its client thread first) some seconds after listening.
    let mut fixture = spawn_fixture(&me, 10.0);
    let target = Target::open(fixture.pid()).unwrap();
    let options = Options {
        sample_hz: 0,
        ring_bytes: 1 << 20,
        offcpu_stacks: false,
        phases: false,
        skip: vec![
            Group::Syscalls,
            Group::Sockets,
            Group::Sites,
            Group::Samples,
        ],
        empty_programs: false,
    };
    let session = Session::attach(&target, &options, &Plan::new(Choice::Tracepoint).unwrap())
        .expect("attaching the sched group");
    assert!(
        !session.target_tids().unwrap().is_empty(),
        "threads seeded from /proc"
    );
    // Threads seeded before sched_process_exit was attached and gone since would stay: the
    // check below needs the fixture to exit while everything is attached.
    assert!(
        fixture.try_wait().unwrap().is_none(),
        "the fixture exited while the tracer attached (machine too slow for this test)"
    );
    fixture.wait().unwrap();
    // The parent can be woken between a thread's exit_notify and its last switch-out: give
    // that switch a moment, so the check below sees it happen (it asserts no time).
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(session.target_tids().unwrap(), Vec::<u32>::new());
    session.detach();
}
