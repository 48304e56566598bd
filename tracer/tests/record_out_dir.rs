//! Root only: `tracer record` as root does not write through a link planted in its --out, nor
//! create a path the user who ran sudo could not.

mod attach_common;

use attach_common::*;

/// The fixture's body when re-executed by the test below; a no-op in a normal test run.
#[test]
fn fixture_child() {
    if let Ok(secs) = std::env::var(FIXTURE_ENV) {
        fixture_main(secs.parse().unwrap());
    }
}

/// A new directory `name` in `parent`, mode 0755 whatever the umask: a group-writable one
/// would be refused for that reason instead.
fn dir_0755(parent: &std::path::Path, name: &str) -> std::path::PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir(&dir).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&dir, mode).unwrap();
    dir
}

/// The tracer with `args` as if run by `sudo` for uid and gid 65534 (nobody).
fn run_tracer_under_sudo(args: &[String]) -> std::process::Output {
    tracer()
        .args(args)
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .output()
        .unwrap()
}

#[test]
fn item1_a_link_planted_at_requests_csv_is_never_followed() {
    if !require_root() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let victim = temp.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let out = dir_0755(temp.path(), "session");
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

/// `sudo tracer record --raw-events /etc/ld.so.preload`: a root-owned directory stands for
/// /etc, SUDO_UID=65534 for the user who ran sudo. Neither dump is made there.
#[test]
fn raw_outputs_do_not_create_any_path_as_root_under_sudo() {
    if !require_root() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let etc = dir_0755(temp.path(), "etc");
    let preload = etc.join("ld.so.preload");
    let preload_arg = preload.to_str().unwrap();
    // The user's own directory: --out is made in it.
    let home = dir_0755(temp.path(), "home");
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let out = home.join("session");

    let me = std::env::current_exe().unwrap();
    let fixture = spawn_fixture(&me, 600.0);
    for flag in ["--raw-events", "--raw-data"] {
        let extra = ["--no-calibrate", "--duration", "1", "--overwrite"];
        let args = record_args(
            fixture.pid(),
            &out,
            &[&extra[..], &[flag, preload_arg]].concat(),
        );
        let stderr = testproc::failed_stderr(&run_tracer_under_sudo(&args));
        assert!(
            stderr.contains(flag) && stderr.contains("owned by uid 0, not by uid 65534"),
            "{stderr}"
        );
        assert!(!preload.exists(), "{flag} made {}", preload.display());
    }
}

/// `sudo tracer record --out /etc/systemd/system/ssh.service.d` made the user a directory that
/// systemd reads drop-ins from as root. A root-owned directory stands for /etc/systemd/system,
/// SUDO_UID=65534 for the user who ran sudo.
#[test]
fn under_sudo_a_missing_out_is_not_created_in_a_root_owned_directory() {
    if !require_root() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let drop_in = dir_0755(temp.path(), "system").join("ssh.service.d");

    let me = std::env::current_exe().unwrap();
    let fixture = spawn_fixture(&me, 600.0);
    let args = record_args(
        fixture.pid(),
        &drop_in,
        &["--no-calibrate", "--duration", "1"],
    );
    let output = run_tracer_under_sudo(&args);
    drop(fixture);
    let stderr = testproc::failed_stderr(&output);
    assert!(
        stderr.contains("it does not exist") && stderr.contains("owned by uid 0, not by uid 65534"),
        "{stderr}"
    );
    assert!(!drop_in.exists(), "made {}", drop_in.display());
}
