//! `cargo xtask setup`: the eBPF toolchain, installed idempotently. Each step says what it
//! checks and is skipped when already satisfied. Other commands call [`ensure`].
//!
//! An install prints one line (what, roughly how long, where its log is); rustup's, apt's and
//! cargo's own output goes to that log, quoted only when the step fails.

use std::{
    env,
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::workspace::{log_dir, log_tail};

const LLVM: &str = "/usr/lib/llvm-22";

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    check(true)
}

/// Installs whatever of nightly + rust-src, llvm-22-dev and bpf-linker is missing. Quiet when
/// nothing is: the commands that call it print their own first lines.
pub fn ensure() -> anyhow::Result<()> {
    check(false)
}

/// `verbose`: also say what is already there (`cargo xtask setup`).
fn check(verbose: bool) -> anyhow::Result<()> {
    nightly_rust_src(verbose)?;
    llvm_dev(verbose)?;
    bpf_linker(verbose)?;
    Ok(())
}

fn nightly_rust_src(verbose: bool) -> anyhow::Result<()> {
    let installed = output("rustup", &["toolchain", "list"])?;
    if installed.lines().any(|line| line.starts_with("nightly")) {
        if verbose {
            println!("setup: nightly toolchain: installed");
        }
    } else {
        quiet_step(
            "nightly toolchain (rustup, ~1 min)",
            "rustup-nightly",
            Command::new("rustup").args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
            ]),
        )?;
    }
    let components = output(
        "rustup",
        &["component", "list", "--installed", "--toolchain", "nightly"],
    )?;
    if components.lines().any(|line| line.trim() == "rust-src") {
        if verbose {
            println!("setup: nightly rust-src: installed");
        }
    } else {
        quiet_step(
            "nightly rust-src (rustup, ~30 s)",
            "rustup-rust-src",
            Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
        )?;
    }
    Ok(())
}

fn llvm_dev(verbose: bool) -> anyhow::Result<()> {
    if Path::new(LLVM).join("lib").is_dir() {
        if verbose {
            println!("setup: llvm-22-dev: {LLVM} present");
        }
        return Ok(());
    }
    apt_install(&["llvm-22-dev"], true)
        .context("installing llvm-22-dev (is the LLVM apt repository configured?)")
}

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

fn bpf_linker(verbose: bool) -> anyhow::Result<()> {
    if let Some(path) = find_in_path("bpf-linker") {
        if verbose {
            println!("setup: bpf-linker: {}", path.display());
        }
        return Ok(());
    }
    let path = format!("{LLVM}/bin:{}", env::var("PATH").unwrap_or_default());
    quiet_step(
        &format!("bpf-linker (cargo install against {LLVM}, ~4 min)"),
        "bpf-linker",
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("PATH", path),
    )
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

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {program} (is rustup installed?)"))?;
    if !out.status.success() {
        bail!("{program} {} failed ({})", args.join(" "), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs one install step quietly: prints `setup: installing WHAT; log: PATH`, sends the
/// child's stdout and stderr to `log_dir()/LOG.log`, and on failure returns an error that
/// quotes the log's last lines.
fn quiet_step(what: &str, log: &str, command: &mut Command) -> anyhow::Result<()> {
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

pub fn run_checked(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
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
