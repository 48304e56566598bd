use clap::Parser as _;
use tracer::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Record(args) => tracer::record::run(&args),
    }
}
