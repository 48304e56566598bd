//! Root only: `tracer record` as root does not write through a link planted in its --out.

mod attach_common;

use attach_common::*;

/// The fixture's body when re-executed by the test below; a no-op in a normal test run.
#[test]
fn fixture_child() {
    if let Ok(secs) = std::env::var(FIXTURE_ENV) {
        fixture_main(secs.parse().unwrap());
    }
}

#[test]
fn item1_a_link_planted_at_requests_csv_is_never_followed() {
    if !require_root() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let victim = temp.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let out = temp.path().join("session");
    std::fs::create_dir(&out).unwrap();
    // Whatever the umask: a group-writable --out would be refused for that reason instead.
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&out, mode).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("requests.csv")).unwrap();

    let me = std::env::current_exe().unwrap();
    let fixture = spawn_fixture(&me, 600.0);
    let args = record_args(fixture.pid(), &out, &["--no-calibrate", "--duration", "1"]);
    let stderr = testproc::failed_stderr(&run_tracer(&args));
    assert!(
        stderr.contains("is not empty") && stderr.contains("--overwrite"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

    // --overwrite replaces the link itself with the session's file.
    let mut again = args.clone();
    again.push("--overwrite".to_owned());
    let recorded = run_tracer(&again);
    drop(fixture);
    let stderr = String::from_utf8_lossy(&recorded.stderr);
    assert!(recorded.status.success(), "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!out.join("requests.csv").is_symlink());
    assert!(
        std::fs::read_to_string(out.join("requests.csv"))
            .unwrap()
            .starts_with("request_id,")
    );
}
