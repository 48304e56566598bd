//! `cargo xtask run-tracer --pid PID [--duration S] [--out DIR]`: build the tracer (release,
//! eBPF programs included) as the user, and run `tracer record` as root: directly when xtask
//! is root, through sudo otherwise, its files handed back to the user.

use std::{
    path::PathBuf,
    process::Command,
    sync::{Arc, atomic::AtomicBool},
};

use anyhow::{Context as _, bail};

use harness::privilege::Runner;

#[derive(clap::Args)]
pub struct Args {
    /// The target's pid: a gateway with probe sites, or any HTTP/1.1 proxy (kernel-only).
    #[arg(long)]
    pid: u32,
    /// Seconds to trace; default until Ctrl-C or the target exits.
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
    let runner = Runner::detect();
    runner.authorize("cargo xtask run-tracer")?;
    crate::setup::ensure()?;
    let tracer = harness::procs::cargo_build_release(&["-p", "tracer", "--bin", "tracer"])?
        .find("tracer")?;
    // The user's directory: the tracer (root) writes into it, and it is handed back after.
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut record = vec![
        "record".to_owned(),
        "--pid".to_owned(),
        args.pid.to_string(),
        "--out".to_owned(),
        args.out.display().to_string(),
    ];
    if let Some(duration) = &args.duration {
        record.extend(["--duration".to_owned(), duration.clone()]);
    }
    record.extend(args.rest.iter().cloned());
    // The build above can outlast sudo's credential cache; `sudo -n` below never prompts.
    runner.refresh()?;
    let (program, line) = runner.command_line(&tracer, &record);
    // Ctrl-C is the tracer's stop (it gets it from the terminal too): xtask stays to hand its
    // files back. A handler, unlike SIG_IGN, is not inherited across exec.
    signal_hook::flag::register(
        signal_hook::consts::SIGINT,
        Arc::new(AtomicBool::new(false)),
    )
    .context("installing the SIGINT handler")?;
    let status = Command::new(&program)
        .args(&line)
        .status()
        .with_context(|| format!("running {}", program.display()))?;
    runner.hand_back(&args.out)?;
    if !status.success() {
        bail!("tracer record failed ({status})");
    }
    Ok(())
}
