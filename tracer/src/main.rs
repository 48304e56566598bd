use clap::Parser as _;
use tracer::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Record(args) => {
            // Privileges first: without them the first failure is an unreadable
            // /proc/PID/exe, which does not say what to do.
            tracer::attach::preflight::check()?;
            tracer::record::run(&args)
        }
    }
}
