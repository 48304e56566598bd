//! `cargo xtask test`: what CI runs. Installs the eBPF toolchain and cargo-fuzz when missing,
//! runs the quick bench (issue 3 wants it in the suite), the VM smoke test (`vmtest`: the e2e
//! test on a kernel with kprobes and fentry), each fuzz target briefly on its committed seeds,
//! then every test of the workspace. Root-only eBPF tests, the VM's included, run when this
//! runs as root and say SKIPPED otherwise.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{fuzz, setup};

#[derive(clap::Args)]
pub struct Args {
    /// Skip `cargo xtask bench --quick`.
    #[arg(long)]
    no_bench: bool,
    /// Skip `cargo xtask vmtest` (the e2e test in a QEMU guest; needs root, and the network
    /// once to fetch the guest kernel).
    #[arg(long)]
    no_vm: bool,
    /// Skip the fuzz targets' brief run (`fuzz/`, cargo-fuzz on nightly).
    #[arg(long)]
    no_fuzz: bool,
    /// Extra arguments for `cargo test` (after `--`), e.g. a test name filter.
    #[arg(last = true)]
    rest: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    setup::ensure()?;
    let mut failures = Vec::new();
    if !args.no_bench {
        let out = tempfile::tempdir().context("creating a temp dir for bench --quick")?;
        let status = Command::new(std::env::current_exe().context("locating xtask")?)
            .args(["bench", "--quick", "--out"])
            .arg(out.path())
            .status()
            .context("running xtask bench --quick")?;
        if !status.success() {
            failures.push("bench --quick");
        }
    }
    let root = rustix::process::geteuid().is_root();
    if args.no_vm {
        eprintln!("SKIPPED vmtest: --no-vm");
    } else if !root {
        eprintln!("SKIPPED vmtest: needs root (QEMU, virtiofs, eBPF); CI runs it as root");
    } else {
        let status = Command::new(std::env::current_exe().context("locating xtask")?)
            .arg("vmtest")
            .status()
            .context("running xtask vmtest")?;
        if !status.success() {
            failures.push("vmtest");
        }
    }
    if args.no_fuzz {
        eprintln!("SKIPPED fuzz: --no-fuzz");
    } else if let Err(e) = fuzz::ci_step() {
        eprintln!("fuzz: {e:#}");
        failures.push("fuzz");
    }
    // Last, so cargo's own summary closes the output.
    let status = Command::new(env!("CARGO"))
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(&args.rest)
        .status()
        .context("running cargo test")?;
    if !status.success() {
        failures.push("cargo test");
    }
    if !failures.is_empty() {
        bail!("failed: {}", failures.join(", "));
    }
    Ok(())
}
