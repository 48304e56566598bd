//! `mock-upstream --listen ADDR [--delay-ms D|MIN-MAX] [--workers N] [--log-ids FILE]
//! [--log-requests FILE]`: the keep-alive JSON echo upstream.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use gateway::mock_upstream::{Delay, IdLog, Logs, RequestLog};

#[derive(Parser)]
#[command(about = "Keep-alive JSON echo server with a per-request delay")]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:9000 (port 0 picks a free port).
    #[arg(long)]
    listen: String,
    /// Delay before each answer, in milliseconds (fractions allowed): one figure for every
    /// request, or MIN-MAX to draw each request's uniformly from that range.
    #[arg(long, default_value = "0", value_parser = Delay::parse)]
    delay_ms: Delay,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Append the `id` field of every JSON body received to FILE, one per line.
    #[arg(long, value_name = "FILE")]
    log_ids: Option<PathBuf>,
    /// Write a CSV line per answered request to FILE: its body's `params.request_id`, when it
    /// arrived and was answered (CLOCK_MONOTONIC ns), and the delay drawn (µs).
    #[arg(long, value_name = "FILE")]
    log_requests: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.workers >= 1, "--workers must be at least 1");
    let ids = open_log(args.log_ids.as_deref(), IdLog::create)?;
    let requests = open_log(args.log_requests.as_deref(), RequestLog::create)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        gateway::mock_upstream::run(listener, args.delay_ms, Logs { ids, requests })
            .await
            .context("serving")
    })
}

fn open_log<T>(
    path: Option<&Path>,
    create: impl Fn(&Path) -> std::io::Result<T>,
) -> anyhow::Result<Option<Arc<T>>> {
    path.map(|path| {
        create(path)
            .map(Arc::new)
            .with_context(|| format!("creating {}", path.display()))
    })
    .transpose()
}
