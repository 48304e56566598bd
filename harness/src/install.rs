//! Installing what a command needs, quietly: an install prints one line (what, roughly how
//! long, where its log is); the installer's own output goes to that log, quoted only when the
//! step fails.

use std::{
    env,
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::workspace::{log_dir, log_tail};

/// `apt-get install -y PACKAGES` (with `--no-install-recommends` unless `recommends`); runs
/// `apt-get update` and retries once when it fails: a fresh image often has no package lists.
pub fn apt_install(packages: &[&str], recommends: bool) -> anyhow::Result<()> {
    let list = packages.join(" ");
    let runner = crate::privilege::Runner::detect();
    // `env` sets the variable after sudo, whose env_reset would drop it.
    let apt_get = |args: &[&str]| {
        let mut command = runner.command("env");
        command
            .args(["DEBIAN_FRONTEND=noninteractive", "apt-get"])
            .args(args);
        command
    };
    let install = || {
        let mut command = apt_get(&["install", "-y"]);
        if !recommends {
            command.arg("--no-install-recommends");
        }
        command.args(packages);
        command
    };
    let what = format!("{list} (apt-get, ~2 min)");
    if quiet_step(&what, "apt-get", &mut install()).is_err() {
        quiet_step(
            "apt package lists (apt-get update, ~30 s)",
            "apt-get-update",
            &mut apt_get(&["update"]),
        )?;
        quiet_step(&what, "apt-get", &mut install())?;
    }
    Ok(())
}

/// `name` in PATH or in ~/.cargo/bin (where cargo install puts it).
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let cargo_bin = env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo/bin"));
    env::var_os("PATH")
        .map(|path| env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(cargo_bin)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Runs one install step quietly: prints `setup: installing WHAT; log: PATH`, sends the
/// child's stdout and stderr to `log_dir()/LOG.log`, and on failure returns an error that
/// quotes the log's last lines.
pub fn quiet_step(what: &str, log: &str, command: &mut Command) -> anyhow::Result<()> {
    let log = log_dir()?.join(format!("{log}.log"));
    println!("setup: installing {what}; log: {}", log.display());
    run_logged(command, &log)
}

/// How many of a failed step's last log lines an error quotes.
const TAIL_LINES: usize = 20;

/// Runs `command` with stdout and stderr in `log` (replaced); an error on failure quotes the
/// log's last [`TAIL_LINES`] lines.
pub fn run_logged(command: &mut Command, log: &Path) -> anyhow::Result<()> {
    let file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let status = command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!(
            "{command:?} failed ({status}); the end of {}:\n{}",
            log.display(),
            log_tail(log, TAIL_LINES)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_step_keeps_its_output_in_the_log_and_quotes_it_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("step.log");
        run_logged(
            Command::new("sh").args(["-c", "echo to-stdout; echo to-stderr >&2"]),
            &log,
        )
        .unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("to-stdout") && text.contains("to-stderr"),
            "{text}"
        );

        let script = "for i in $(seq 1 30); do echo line$i; done; echo broken >&2; exit 1";
        let err = run_logged(Command::new("sh").args(["-c", script]), &log).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("exit status: 1"), "{text}");
        assert!(text.contains(&log.display().to_string()), "{text}");
        assert!(text.contains("line30") && text.contains("broken"), "{text}");
        assert!(!text.contains("line5\n"), "only the tail is quoted: {text}");
        let kept = std::fs::read_to_string(&log).unwrap();
        assert!(kept.contains("line1\n"), "the log keeps everything: {kept}");
    }
}
