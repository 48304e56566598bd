//! Bad input to `tracer record` gets a clear error naming the problem (no root needed: these
//! fail before anything is loaded).

mod attach_common;

use std::process::Command;

use attach_common::run_tracer;

fn stderr_of(args: &[&str]) -> String {
    let output = run_tracer(args);
    assert!(!output.status.success(), "tracer {args:?} should fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn missing_pid() {
    // A pid that existed and is gone: reaped, and not reused this fast on a quiet machine.
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id().to_string();
    child.wait().unwrap();
    let stderr = stderr_of(&["record", "--pid", &pid]);
    assert!(
        stderr.contains(&format!("no process with pid {pid}")),
        "{stderr}"
    );
}

#[test]
fn binary_without_probe_sites_names_them() {
    let mut sleep = Command::new("sleep").arg("30").spawn().unwrap();
    let stderr = stderr_of(&["record", "--pid", &sleep.id().to_string()]);
    sleep.kill().unwrap();
    sleep.wait().unwrap();
    assert!(stderr.contains("lacks 13 of 13 probe sites"), "{stderr}");
    for site in tracer_ebpf::sites::Site::ALL {
        assert!(
            stderr.contains(site.symbol()),
            "{} not named:\n{stderr}",
            site.symbol()
        );
    }
}

#[test]
fn invalid_duration() {
    for bad in ["abc", "0", "-3"] {
        let stderr = stderr_of(&["record", "--pid", "1", "--duration", bad]);
        assert!(stderr.contains("--duration"), "{bad}: {stderr}");
    }
}

#[test]
fn invalid_ring_size() {
    let stderr = stderr_of(&["record", "--pid", "1", "--ring-mib", "3"]);
    assert!(stderr.contains("power of two"), "{stderr}");
}
