//! `cargo xtask run-tracer --pid PID [--duration S] [--out DIR]`: build the tracer (release,
//! eBPF programs included) and run `tracer record` as root.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

#[derive(clap::Args)]
pub struct Args {
    /// The gateway's pid.
    #[arg(long)]
    pid: u32,
    /// Seconds to trace; default until Ctrl-C or the gateway exits.
    #[arg(long)]
    duration: Option<String>,
    /// Output directory for requests.csv and breakdown.json.
    #[arg(long, default_value = "tracer-out")]
    out: PathBuf,
    /// More `tracer record` flags (--sample-hz, --ring-mib, --offcpu-stacks), after `--`.
    #[arg(last = true)]
    rest: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "run-tracer loads eBPF programs and must run as root (try `sudo -E cargo xtask run-tracer ...`)"
        );
    }
    crate::setup::ensure()?;
    let tracer = build_tracer()?;
    let mut command = Command::new(&tracer);
    command
        .args(["record", "--pid", &args.pid.to_string(), "--out"])
        .arg(&args.out);
    if let Some(duration) = &args.duration {
        command.args(["--duration", duration]);
    }
    command.args(&args.rest);
    let status = command
        .status()
        .with_context(|| format!("running {}", tracer.display()))?;
    if !status.success() {
        bail!("tracer record failed ({status})");
    }
    Ok(())
}

/// Builds the release tracer and returns its path.
pub fn build_tracer() -> anyhow::Result<PathBuf> {
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--package",
            "tracer",
            "--bin",
            "tracer",
        ])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("building the tracer failed ({status})");
    }
    Ok(target_dir().join("release/tracer"))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}
