//! Developer tasks: `cargo xtask <command>`.

//!
//! The measurement commands (bench, profile, profiles-index, validate) are the `harness`
//! crate's; xtask forwards them under the same names.

mod fuzz;
mod run_tracer;
mod setup;
mod test;
mod vmtest;

use clap::{Parser, Subcommand};
use harness::{bench, profile, profiles_index, validate};

#[derive(Parser)]
#[command(about = "Developer tasks for the gateway and its tracer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install the toolchain (nightly rust-src, llvm-22-dev, bpf-linker, cargo-fuzz); idempotent.
    Setup(setup::Args),
    /// Run every test, root-only eBPF integration tests included.
    Test(test::Args),
    /// The gateway's added latency over its upstream, out of process (no tracer); writes profiles/local/bench-<time>/ or --out.
    Bench(bench::Args),
    /// Build the tracer and attach it to a running gateway (as root: through sudo unless xtask is).
    RunTracer(run_tracer::Args),
    /// A whole tail session at a fraction of max load; writes profiles/local/<name>-<time>/ or --out.
    Profile(profile::Args),
    /// Write profiles/README.md, the index of the recorded runs, from their own files.
    ProfilesIndex(profiles_index::Args),
    /// Accuracy, probe effect, loss and cost of the tracer; writes profiles/local/validation-<time>/
    /// or --out.
    Validate(validate::Args),
    /// The tracer's root tests in a QEMU guest whose kernel has kprobes and fentry.
    Vmtest(vmtest::Args),
    /// Run the fuzz targets in fuzz/ (cargo-fuzz), each for --seconds; prints exec counts.
    Fuzz(fuzz::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup(args) => setup::run(args),
        Command::Test(args) => test::run(args),
        Command::Bench(args) => bench::run(args),
        Command::RunTracer(args) => run_tracer::run(args),
        Command::Profile(args) => profile::run(args, setup::ensure),
        Command::ProfilesIndex(args) => profiles_index::run(args),
        Command::Validate(args) => validate::run(args, setup::ensure),
        Command::Vmtest(args) => vmtest::run(args),
        Command::Fuzz(args) => fuzz::run(args),
    }
}
