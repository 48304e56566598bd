//! Bad input to `tracer record` gets a clear error naming the problem. These fail before
//! anything is loaded; those about the target need root only because privileges are checked
//! first.

mod attach_common;

use std::process::Command;

use attach_common::{is_root, require_root, run_tracer, tracer};

fn stderr_of(args: &[&str]) -> String {
    testproc::failed_stderr(&run_tracer(args))
}

#[test]
fn missing_pid() {
    if !require_root() {
        return;
    }
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

/// A binary without the sites that is no server either (no listening port) is refused: the
/// exact mode needs the sites, which it names, and the kernel-only mode (issue 20) an HTTP
/// server to follow.
#[test]
fn binary_without_probe_sites_or_a_port_is_refused_naming_the_sites() {
    if !require_root() {
        return;
    }
    let sleep = testproc::Spawn::new("sleep", "sleep")
        .arg("30")
        .start()
        .unwrap();
    let pid = sleep.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let output = run_tracer(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "0.5",
        "--sample-hz",
        "0",
        "--out",
        &dir.path().join("out").to_string_lossy(),
    ]);
    drop(sleep);
    let stderr = testproc::failed_stderr(&output);
    assert!(
        stderr.contains(&format!("kernel-only mode (pid {pid} runs ")),
        "{stderr}"
    );
    assert!(
        stderr.contains("which has no probe sites) follows HTTP/1.1 servers and proxies")
            && stderr.contains("listen on no TCP port"),
        "{stderr}"
    );
    let n = tracer_ebpf::sites::Site::ALL.len();
    assert!(
        stderr.contains(&format!("lacks {n} of {n} probe sites")),
        "{stderr}"
    );
    // It says where it looked: USDT notes first, then symbols.
    assert!(
        stderr.contains("stapsdt notes") && stderr.contains("symbols"),
        "{stderr}"
    );
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

/// Without privileges the tracer says what it needs before it touches the target. As root the
/// test drops to nobody (uid 65534, which also clears every capability) with `setpriv`.
#[test]
fn without_privileges_it_names_what_it_needs() {
    let mut command = if is_root() {
        let mut setpriv = Command::new("setpriv");
        setpriv
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_tracer"));
        setpriv
    } else {
        tracer()
    };
    let output = match command.args(["record", "--pid", "1"]).output() {
        Ok(output) => output,
        Err(err) => {
            eprintln!("SKIPPED without_privileges_it_names_what_it_needs: setpriv: {err}");
            return;
        }
    };
    let stderr = testproc::failed_stderr(&output);
    for needed in ["root", "CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "sudo"] {
        assert!(stderr.contains(needed), "{needed} not named:\n{stderr}");
    }
    assert!(!stderr.contains("/proc/1/exe"), "{stderr}");
}

/// Issue 21 item 2: a tracer whose /proc shows another PID namespace than the kernel's initial
/// one would filter on pids the kernel programs never see and record nothing; it refuses.
#[test]
fn item2_tracer_in_a_child_pid_namespace_refuses() {
    if !require_root() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    // Pid 1 in the new namespace is the tracer itself (exec'd by unshare's child).
    let output = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_tracer"))
        .args(["record", "--pid", "1", "--out"])
        .arg(out.path())
        .output()
        .expect("running unshare (util-linux)");
    let stderr = testproc::failed_stderr(&output);
    assert!(
        stderr.contains("PID namespace other than the initial one"),
        "{stderr}"
    );
}
