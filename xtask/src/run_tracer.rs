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
    /// More `tracer record` flags (--phases, --offcpu-stacks, --sample-hz, --ring-mib), after `--`.
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
    let tracer =
        crate::procs::cargo_build_release(&["-p", "tracer", "--bin", "tracer"])?.find("tracer")?;
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
