//! `cargo xtask setup`: the eBPF toolchain, installed idempotently. Each step says what it
//! checks and is skipped when already satisfied. Other commands call [`ensure`].

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

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
        println!("setup: nightly toolchain: missing, installing");
        run_checked(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
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
        println!("setup: nightly rust-src: missing, installing");
        run_checked(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
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
    println!("setup: llvm-22-dev: {LLVM} missing, installing with apt-get");
    apt_install(&["llvm-22-dev"], true)
        .context("installing llvm-22-dev (is the LLVM apt repository configured?)")
}

/// `apt-get install -y PACKAGES` (with `--no-install-recommends` unless `recommends`); runs
/// `apt-get update` and retries once when it fails: a fresh image often has no package lists.
pub fn apt_install(packages: &[&str], recommends: bool) -> anyhow::Result<()> {
    let install = || {
        let mut command = Command::new("apt-get");
        command.args(["install", "-y"]);
        if !recommends {
            command.arg("--no-install-recommends");
        }
        command
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get (needs root)")
    };
    if !install()?.success() {
        println!("setup: apt-get install failed; running apt-get update and retrying");
        run_checked(Command::new("apt-get").arg("update"))?;
        if !install()?.success() {
            bail!("apt-get install -y {} failed", packages.join(" "));
        }
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
    println!("setup: bpf-linker: missing, building it against {LLVM}");
    let path = format!("{LLVM}/bin:{}", env::var("PATH").unwrap_or_default());
    run_checked(
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

pub fn run_checked(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}
