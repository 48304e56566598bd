use std::process::Command;

use anyhow::{Context as _, bail};

#[derive(clap::Args)]
pub struct Args {
    /// Extra arguments passed to `cargo test` (after `--`).
    #[arg(trailing_var_arg = true)]
    rest: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let status = Command::new(env!("CARGO"))
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(&args.rest)
        .status()
        .context("running cargo test")?;
    if !status.success() {
        bail!("cargo test failed ({status})");
    }
    Ok(())
}
