//! `tracer-validate accuracy|ab`: the analyses of `cargo xtask validate`, on files, as JSON
//! on stdout. (xtask does not link the tracer library: it must build before the eBPF toolchain
//! exists.)
//!
//! - `accuracy --client loadgen-requests.csv --tracer DIR`: join by request id.
//! - `ab --windows windows.json`: windows = `[{"arm": "traced"|"untraced", "p50_us", "p99_us",
//!   "p999_us", "gateway_cpu_us_per_request", "cpu0_busy"}, ...]`.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use tracer::report::{INCOMPLETE_CSV, REQUESTS_CSV};
use tracer::validate::{ab, accuracy};

#[derive(Parser)]
#[command(about = "Analyses behind `cargo xtask validate`, printed as JSON")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join the tracer's requests.csv and incomplete.csv with loadgen's --requests-out.
    Accuracy {
        /// loadgen's --requests-out CSV.
        #[arg(long)]
        client: PathBuf,
        /// The tracer's output directory (requests.csv, incomplete.csv).
        #[arg(long)]
        tracer: PathBuf,
    },
    /// Traced/untraced ratios and their spread over interleaved windows.
    Ab {
        /// JSON array of windows.
        #[arg(long)]
        windows: PathBuf,
    },
}

fn open(path: &Path) -> anyhow::Result<BufReader<File>> {
    Ok(BufReader::new(
        File::open(path).with_context(|| format!("opening {}", path.display()))?,
    ))
}

fn window(v: &serde_json::Value, i: usize) -> anyhow::Result<ab::Window> {
    let num = |key: &str| {
        v[key]
            .as_f64()
            .with_context(|| format!("window {i}: `{key}` is missing or not a number"))
    };
    let arm = v["arm"].as_str().and_then(ab::Arm::parse);
    let Some(arm) = arm else {
        bail!("window {i}: `arm` must be \"traced\" or \"untraced\"");
    };
    Ok(ab::Window {
        arm,
        p50_us: num("p50_us")?,
        p99_us: num("p99_us")?,
        p999_us: num("p999_us")?,
        gateway_cpu_us_per_request: num("gateway_cpu_us_per_request")?,
        cpu0_busy: num("cpu0_busy")?,
    })
}

fn main() -> anyhow::Result<()> {
    let json = match Cli::parse().command {
        Command::Accuracy { client, tracer } => {
            let client_rows = accuracy::read_client_csv(open(&client)?)?;
            let traced = accuracy::read_traced_csv(open(&tracer.join(REQUESTS_CSV))?)?;
            let incomplete = accuracy::read_incomplete_csv(open(&tracer.join(INCOMPLETE_CSV))?)?;
            accuracy::join(&client_rows, &traced, &incomplete).to_json()
        }
        Command::Ab { windows } => {
            let text = std::fs::read_to_string(&windows)
                .with_context(|| format!("reading {}", windows.display()))?;
            let list: Vec<serde_json::Value> = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a JSON array", windows.display()))?;
            let windows = list
                .iter()
                .enumerate()
                .map(|(i, v)| window(v, i))
                .collect::<anyhow::Result<Vec<_>>>()?;
            ab::compare(&windows).to_json()
        }
    };
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(())
}
