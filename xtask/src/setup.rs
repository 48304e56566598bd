//! `cargo xtask setup`: the eBPF toolchain and cargo-fuzz, installed idempotently. Each step
//! says what it checks and is skipped when already satisfied. Other commands call [`ensure`]
//! (and [`ensure_fuzz`]).
//!
//! An install prints one line (what, roughly how long, where its log is); rustup's, apt's and
//! cargo's own output goes to that log, quoted only when the step fails
//! ([`harness::install`]).

use std::{
    env,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use harness::install::{apt_install, find_in_path, quiet_step};

const LLVM: &str = "/usr/lib/llvm-22";

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    check(true)?;
    cargo_fuzz(true)
}

/// Installs whatever of nightly + rust-src, llvm-22-dev and bpf-linker is missing. Quiet when
/// nothing is: the commands that call it print their own first lines.
pub fn ensure() -> anyhow::Result<()> {
    check(false)
}

/// What `cargo xtask test` and `cargo xtask fuzz` also need: cargo-fuzz (its targets build
/// with the nightly toolchain [`ensure`] installs).
pub fn ensure_fuzz() -> anyhow::Result<()> {
    cargo_fuzz(false)
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

fn cargo_fuzz(verbose: bool) -> anyhow::Result<()> {
    if let Some(path) = find_in_path("cargo-fuzz") {
        if verbose {
            println!("setup: cargo-fuzz: {}", path.display());
        }
        return Ok(());
    }
    quiet_step(
        "cargo-fuzz (cargo install, ~2 min)",
        "cargo-fuzz",
        Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]),
    )
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

pub fn run_checked(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}
