//! From records to the numbers a run is judged by: HDR percentiles of the measured window,
//! the achieved rate, errors by kind, and the drift between the window's first and last thirds.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::run::{Load, Record, RunOutput};

/// loadgen.json's types live in the model, so its readers parse what this writes.
pub use session::loadgen::{Percentiles, Summary};

/// The run's figures on stdout.
pub fn print_table(summary: &Summary) {
    let shape = match (summary.requested_rate, summary.concurrency) {
        (Some(rate), _) => format!(
            "open loop at {rate:.1} req/s over {} connections",
            summary.connections
        ),
        (_, Some(c)) => format!("closed loop at concurrency {c}"),
        _ => summary.mode.to_owned(),
    };
    println!(
        "loadgen: {shape}, {:.1} s after {:.1} s warm-up, {}{}",
        summary.duration_s,
        summary.warmup_s,
        summary.url,
        if summary.direct { " (direct)" } else { "" }
    );
    let requested = summary
        .requested_rate
        .map_or_else(|| "-".to_owned(), |rate| format!("{rate:.1}"));
    println!(
        "  requested {requested} req/s   achieved {:.1} req/s   sent {}   ok {}   errors {}",
        summary.achieved_rate,
        summary.sent,
        summary.ok,
        summary.error_count()
    );
    for (kind, count) in &summary.errors {
        println!("  error {kind}: {count}");
    }
    let l = &summary.latency_us;
    println!(
        "  latency from the {} time, µs (HDR):",
        summary.latency_from
    );
    println!(
        "  {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "p50", "p90", "p99", "p99.9", "max", "mean"
    );
    println!(
        "  {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
        l.p50, l.p90, l.p99, l.p999, l.max, l.mean
    );
    if let Some(lag) = &summary.send_lag_us {
        println!(
            "  send lag after the scheduled time, µs: p50 {:.1}  p99 {:.1}  max {:.1}",
            lag.p50, lag.p99, lag.max
        );
    }
    if let (Some(first), Some(last)) = (summary.p50_first_third_us, summary.p50_last_third_us) {
        println!("  p50 first third {first:.1} µs, last third {last:.1} µs");
    }
}

pub fn histogram() -> Histogram<u64> {
    // 1 ns to 1 h at 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

pub fn percentiles(hist: &Histogram<u64>) -> Percentiles {
    let us = |ns: u64| ns as f64 / 1e3;
    if hist.is_empty() {
        return Percentiles {
            count: 0,
            p50: 0.0,
            p90: 0.0,
            p99: 0.0,
            p999: 0.0,
            max: 0.0,
            mean: 0.0,
        };
    }
    Percentiles {
        count: hist.len(),
        p50: us(hist.value_at_quantile(0.50)),
        p90: us(hist.value_at_quantile(0.90)),
        p99: us(hist.value_at_quantile(0.99)),
        p999: us(hist.value_at_quantile(0.999)),
        max: us(hist.max()),
        mean: hist.mean() / 1e3,
    }
}

pub fn summarize(output: &RunOutput, url: &str, direct: bool, warmup_s: f64) -> Summary {
    let measured: Vec<&Record> = output.records.iter().filter(|r| !r.warmup).collect();
    let mut errors = BTreeMap::new();
    let mut all = histogram();
    let mut send_lag = histogram();
    let (mut first_third, mut last_third) = (histogram(), histogram());
    let third_ns = output.window_ns / 3;
    let mut last_ok_ns = None;
    for record in &measured {
        send_lag.saturating_record(record.sent_ns.saturating_sub(record.scheduled_ns));
        match record.outcome.error_key() {
            Some(kind) => *errors.entry(kind).or_insert(0) += 1,
            None => {
                let latency = record.latency_ns();
                all.saturating_record(latency);
                let offset = record.scheduled_ns.saturating_sub(output.window_start_ns);
                if offset < third_ns {
                    first_third.saturating_record(latency);
                } else if offset >= 2 * third_ns {
                    last_third.saturating_record(latency);
                }
                last_ok_ns = last_ok_ns.max(Some(record.received_ns));
            }
        }
    }
    if output.unsent > 0 {
        errors.insert("unsent".to_owned(), output.unsent);
    }
    let ok = all.len();
    let achieved_rate = match last_ok_ns {
        Some(last) if last > output.window_start_ns => {
            ok as f64 / ((last - output.window_start_ns) as f64 / 1e9)
        }
        _ => 0.0,
    };
    let p50 = |hist: &Histogram<u64>| {
        (!hist.is_empty()).then(|| hist.value_at_quantile(0.5) as f64 / 1e3)
    };
    let (mode, requested_rate, concurrency, connections, latency_from) = match output.load {
        Load::Open { rate, connections } => ("open", Some(rate), None, connections, "scheduled"),
        Load::Closed { concurrency } => ("closed", None, Some(concurrency), concurrency, "sent"),
    };
    let (mode, latency_from) = (mode.to_owned(), latency_from.to_owned());
    Summary {
        mode,
        url: url.to_owned(),
        direct,
        requested_rate,
        concurrency,
        connections,
        duration_s: output.window_ns as f64 / 1e9,
        warmup_s,
        first_request_id: output.records.first().map(|r| r.id),
        last_request_id: output.records.last().map(|r| r.id),
        sent: output.records.len() as u64,
        measured: measured.len() as u64 + output.unsent,
        ok,
        achieved_rate,
        errors,
        latency_from,
        latency_us: percentiles(&all),
        send_lag_us: matches!(output.load, Load::Open { .. }).then(|| percentiles(&send_lag)),
        p50_first_third_us: p50(&first_third),
        p50_last_third_us: p50(&last_third),
    }
}

/// One CSV row per request sent: `status` is the HTTP status, or 0 with `error` set to
/// `transport` or `timeout`; `local_port` is its connection's (0: it never connected).
pub fn write_requests_csv(path: &std::path::Path, records: &[Record]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let file = std::fs::File::create(path)?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(
        out,
        "request_id,scheduled_ns,sent_ns,received_ns,status,error,warmup,local_port"
    )?;
    for r in records {
        let (status, error) = match r.outcome {
            crate::conn::Outcome::Status(status) => (status, ""),
            crate::conn::Outcome::Transport => (0, "transport"),
            crate::conn::Outcome::Timeout => (0, "timeout"),
        };
        writeln!(
            out,
            "{},{},{},{},{status},{error},{},{}",
            r.id, r.scheduled_ns, r.sent_ns, r.received_ns, r.warmup as u8, r.local_port
        )?;
    }
    out.flush()?;
    Ok(())
}
