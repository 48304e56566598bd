//! `mock-upstream --listen ADDR [--delay-ms D] [--workers N] [--log-ids FILE]`: the keep-alive
//! JSON echo upstream.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Keep-alive JSON echo server with a fixed per-request delay")]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:9000 (port 0 picks a free port).
    #[arg(long)]
    listen: String,
    /// Delay applied to every request before answering, in milliseconds (fractions allowed).
    #[arg(long, default_value_t = 0.0, value_parser = delay_ms)]
    delay_ms: f64,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Append the `id` field of every JSON body received to FILE, one per line.
    #[arg(long, value_name = "FILE")]
    log_ids: Option<PathBuf>,
}

fn delay_ms(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ms) if (0.0..=3_600_000.0).contains(&ms) => Ok(ms),
        _ => Err(format!("expected milliseconds in [0, 3600000], got {text}")),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.workers >= 1, "--workers must be at least 1");
    let ids = args
        .log_ids
        .as_deref()
        .map(|path| {
            gateway::mock_upstream::IdLog::create(path)
                .map(Arc::new)
                .with_context(|| format!("creating {}", path.display()))
        })
        .transpose()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let delay = Duration::from_secs_f64(args.delay_ms / 1e3);
        gateway::mock_upstream::run(listener, delay, ids)
            .await
            .context("serving")
    })
}
