//! Root only: attach the tracer to a fixture with every probe site, check that every kind of
//! event arrives, and that nothing of ours stays in the kernel afterwards.

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
    let mut fixture = spawn_fixture(&me, 20.0);
    let out = tempfile::tempdir().unwrap();
    let pid = fixture.id().to_string();
    let output = run_tracer(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "3",
        "--out",
        out.path().to_str().unwrap(),
        "--offcpu-stacks",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    fixture.kill().unwrap();
    fixture.wait().unwrap();
    assert!(output.status.success(), "tracer failed:\n{stderr}");
    eprintln!("{stderr}");

    for (group, mode) in [
        ("sched", "tracepoint"),
        ("syscalls", "tracepoint"),
        ("sockets", "tracepoint"),
        ("sites", "uprobe"),
        ("samples", "perf_event"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("tracer: attach {group} ")));
        let line = line.unwrap_or_else(|| panic!("no attach line for {group}:\n{stderr}"));
        assert!(line.contains(mode), "{line}");
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
    let mut fixture = spawn_fixture(&me, 2.0);
    let out = tempfile::tempdir().unwrap();
    let pid = fixture.id().to_string();
    let started = std::time::Instant::now();
    let output = run_tracer(&[
        "record",
        "--pid",
        &pid,
        "--out",
        out.path().to_str().unwrap(),
        // The fixture lives 2 s: calibrating first could outlast it.
        "--no-calibrate",
    ]);
    fixture.wait().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "tracer failed:\n{stderr}");
    assert!(
        stderr.contains(&format!("stopped (pid {pid} exited)")),
        "{stderr}"
    );
    // Bounded: the tracer must not wait for anything once the target is gone.
    assert!(started.elapsed() < Duration::from_secs(30));
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
    let mut fixture = spawn_fixture(&me, 20.0);
    let out = tempfile::tempdir().unwrap();
    let pid = fixture.id().to_string();
    let child = tracer()
        .args([
            "record",
            "--pid",
            &pid,
            "--out",
            out.path().to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let output = child.wait_with_output().unwrap();
    fixture.kill().unwrap();
    fixture.wait().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "tracer failed:\n{stderr}");
    assert!(stderr.contains("stopped (signal 2)"), "{stderr}");
    assert_eq!(still_loaded(&program_ids(&stderr)), Vec::<u32>::new());
}
