//! Flags, and one run from flags to files.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::{ArgGroup, Parser};

use crate::find_max::{FindMax, Search, find_max};
use crate::progress::Progress;
use crate::run::{IdSource, Load, RunOutput, RunSpec, run};
use crate::summary::{Summary, print_table, summarize, write_requests_csv};
use crate::target::{ActBody, Target};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "loadgen",
    about = "Out-of-process HTTP load generator for the gateway's POST /v1/act",
    long_about = "Out-of-process HTTP load generator for the gateway's POST /v1/act.\n\n\
        Pick one load shape: --rate R (open loop: request i is scheduled at i/R and its \
        latency is measured from that scheduled time, so a stalled server is charged for the \
        requests it kept waiting), --concurrency C (closed loop) or --find-max (closed loop at \
        concurrency 1, 2, 4, ... until throughput stops growing; reports the max sustainable \
        rate). Every request carries a unique x-request-id and a demo /v1/act body. Timestamps \
        in --requests-out are CLOCK_MONOTONIC ns, the clock of bpf_ktime_get_ns.",
    group(ArgGroup::new("shape").required(true).args(["rate", "concurrency", "find_max"]))
)]
pub struct Args {
    /// Gateway URL, http://HOST:PORT[/PATH]; the path defaults to /v1/act (/echo with --direct).
    #[arg(long)]
    pub url: String,
    /// API key (ak_...) sent as `Authorization: Bearer KEY`; required unless --direct.
    #[arg(long, env = "LOADGEN_KEY")]
    pub key: Option<String>,
    /// Load mock-upstream directly (the no-gateway baseline): same request, path /echo.
    #[arg(long)]
    pub direct: bool,
    /// Open loop at this many requests per second.
    #[arg(long, value_parser = positive_f64)]
    pub rate: Option<f64>,
    /// Closed loop with this many requests in flight (one connection each).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: Option<u64>,
    /// Search the max sustainable rate (closed loop, doubling concurrency).
    #[arg(long)]
    pub find_max: bool,
    /// Measured seconds (per step with --find-max, where it defaults to 2).
    #[arg(long, value_parser = positive_f64)]
    pub duration: Option<f64>,
    /// Seconds of warm-up before the measured window, excluded from the summary.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative_f64)]
    pub warmup: f64,
    /// Open loop: keep-alive connections, one per in-flight request.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub connections: u64,
    /// --find-max: the highest concurrency tried.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_concurrency: u64,
    /// A request without a complete response after this long counts as `timeout`.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// The first x-request-id; ids then count up by one. Defaults to the wall clock in µs, so
    /// consecutive runs never reuse an id below a million requests per second.
    #[arg(long)]
    pub first_id: Option<u64>,
    /// Write the summary as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write one CSV row per request sent here (warm-up included, flagged).
    #[arg(long)]
    pub requests_out: Option<PathBuf>,
    /// The `service` of the /v1/act body.
    #[arg(long, default_value = "demo")]
    pub service: String,
    /// The `action` of the /v1/act body.
    #[arg(long, default_value = "echo")]
    pub action: String,
    /// The `on_behalf_of` of the /v1/act body.
    #[arg(long, default_value = "user-1")]
    pub on_behalf_of: String,
    /// Send no `x-request-id` header, as most real clients do (the id stays in the body's
    /// `params.request_id` and in --requests-out).
    #[arg(long)]
    pub no_request_id: bool,
    /// Put this many bytes of padding in the body's `params` before the id, so that the first
    /// BYTES of every body are the same.
    #[arg(long, default_value_t = 0, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    pub body_pad: u64,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

fn positive_f64(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err(format!("{text:?} is not a positive number")),
    }
}

fn non_negative_f64(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value),
        _ => Err(format!("{text:?} is not a number ≥ 0")),
    }
}

/// What a run produced, for callers that want more than the files.
pub enum Report {
    Run {
        summary: Box<Summary>,
        output: RunOutput,
    },
    FindMax {
        result: FindMax,
        outputs: Vec<RunOutput>,
    },
}

/// Runs the load the flags describe, prints the summary table, and writes `--out` and
/// `--requests-out`.
pub fn execute(args: &Args) -> anyhow::Result<Report> {
    let target = Arc::new(Target::new(
        &args.url,
        args.direct,
        args.key.as_deref(),
        &ActBody {
            service: &args.service,
            action: &args.action,
            on_behalf_of: &args.on_behalf_of,
            pad: args.body_pad as usize,
        },
        !args.no_request_id,
    )?);
    let first_id = args.first_id.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |now| now.as_micros() as u64)
    });
    let ids = Arc::new(IdSource::starting_at(first_id));
    let timeout = Duration::from_millis(args.timeout_ms);
    let warmup = Duration::from_secs_f64(args.warmup);
    // One thread: loadgen is pinned to one CPU, and a second thread would only compete with
    // the first (the open loop's send times are a timerfd in this runtime's reactor).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let report = runtime.block_on(async {
        if args.find_max {
            let search = Search {
                max_concurrency: args.max_concurrency as usize,
                step: Duration::from_secs_f64(args.duration.unwrap_or(2.0)),
                warmup,
                timeout,
            };
            let (result, outputs) =
                find_max(target.clone(), &search, &ids, args.direct, !args.quiet).await?;
            anyhow::Ok(Report::FindMax { result, outputs })
        } else {
            let load = match (args.rate, args.concurrency) {
                (Some(rate), _) => Load::Open {
                    rate,
                    connections: args.connections as usize,
                },
                (None, Some(concurrency)) => Load::Closed {
                    concurrency: concurrency as usize,
                },
                (None, None) => {
                    anyhow::bail!("one of --rate, --concurrency, --find-max is required")
                }
            };
            let spec = RunSpec {
                load,
                duration: Duration::from_secs_f64(args.duration.unwrap_or(10.0)),
                warmup,
                timeout,
            };
            let progress = (!args.quiet).then(|| Arc::new(Progress::default()));
            let ticker = progress.as_ref().map(|p| p.spawn_ticker(String::new()));
            let output = run(target.clone(), &spec, &ids, progress).await;
            if let Some(ticker) = ticker {
                ticker.abort();
            }
            let output = output?;
            let summary = summarize(&output, &target.url, args.direct, args.warmup);
            Ok(Report::Run {
                summary: Box::new(summary),
                output,
            })
        }
    })?;
    match &report {
        Report::Run { summary, output } => {
            print_table(summary);
            write_outputs(args, summary, std::slice::from_ref(output))?;
        }
        Report::FindMax { result, outputs } => {
            println!(
                "loadgen: max sustainable rate {:.1} req/s at concurrency {} ({})",
                result.max_rate, result.best_concurrency, result.url
            );
            write_outputs(args, result, outputs)?;
        }
    }
    Ok(report)
}

fn write_outputs(
    args: &Args,
    summary: &impl serde::Serialize,
    outputs: &[RunOutput],
) -> anyhow::Result<()> {
    if let Some(path) = &args.out {
        let json = serde_json::to_string_pretty(summary)?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("writing --out {}", path.display()))?;
    }
    if let Some(path) = &args.requests_out {
        let mut records: Vec<_> = outputs
            .iter()
            .flat_map(|o| o.records.iter().copied())
            .collect();
        records.sort_unstable_by_key(|r| r.id);
        write_requests_csv(path, &records)
            .with_context(|| format!("writing --requests-out {}", path.display()))?;
    }
    Ok(())
}
