//! From records to the numbers a run is judged by: HDR percentiles of the measured window,
//! the achieved rate, errors by kind, and the drift between the window's first and last thirds.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::run::{Load, Record, RunOutput};

#[derive(Clone, Debug, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// `open` or `closed`.
    pub mode: &'static str,
    pub url: String,
    pub direct: bool,
    /// Open loop only.
    pub requested_rate: Option<f64>,
    /// Closed loop only.
    pub concurrency: Option<usize>,
    pub connections: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub first_request_id: Option<u64>,
    pub last_request_id: Option<u64>,
    /// Requests sent, warm-up included (the rows of `--requests-out`).
    pub sent: u64,
    /// Requests of the measured window (after warm-up), unsent ones included.
    pub measured: u64,
    /// 2xx responses in the measured window.
    pub ok: u64,
    /// `ok` per second, from the window's start to its last 2xx response.
    pub achieved_rate: f64,
    /// Non-2xx outcomes of the measured window by HTTP status, `transport`, `timeout` or
    /// `unsent` (open loop: still queued when the drain ended).
    pub errors: BTreeMap<String, u64>,
    /// `scheduled` (open loop: no coordinated omission) or `sent` (closed loop).
    pub latency_from: &'static str,
    /// 2xx responses of the measured window, in µs.
    pub latency_us: Percentiles,
    /// Open loop: how late each request of the window was sent after its scheduled time, in
    /// µs: loadgen's own dispatch delay, plus any wait for a free connection while every
    /// connection was in flight at the server. Already inside `latency_us`.
    pub send_lag_us: Option<Percentiles>,
    /// p50 of the window's first and last thirds, in µs: a drift check.
    pub p50_first_third_us: Option<f64>,
    pub p50_last_third_us: Option<f64>,
}

impl Summary {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn print_table(&self) {
        let shape = match (self.requested_rate, self.concurrency) {
            (Some(rate), _) => format!(
                "open loop at {rate:.1} req/s over {} connections",
                self.connections
            ),
            (_, Some(c)) => format!("closed loop at concurrency {c}"),
            _ => self.mode.to_owned(),
        };
        println!(
            "loadgen: {shape}, {:.1} s after {:.1} s warm-up, {}{}",
            self.duration_s,
            self.warmup_s,
            self.url,
            if self.direct { " (direct)" } else { "" }
        );
        let requested = self
            .requested_rate
            .map_or_else(|| "-".to_owned(), |rate| format!("{rate:.1}"));
        println!(
            "  requested {requested} req/s   achieved {:.1} req/s   sent {}   ok {}   errors {}",
            self.achieved_rate,
            self.sent,
            self.ok,
            self.error_count()
        );
        for (kind, count) in &self.errors {
            println!("  error {kind}: {count}");
        }
        let l = &self.latency_us;
        println!("  latency from the {} time, µs (HDR):", self.latency_from);
        println!(
            "  {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "p50", "p90", "p99", "p99.9", "max", "mean"
        );
        println!(
            "  {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            l.p50, l.p90, l.p99, l.p999, l.max, l.mean
        );
        if let Some(lag) = &self.send_lag_us {
            println!(
                "  send lag after the scheduled time, µs: p50 {:.1}  p99 {:.1}  max {:.1}",
                lag.p50, lag.p99, lag.max
            );
        }
        if let (Some(first), Some(last)) = (self.p50_first_third_us, self.p50_last_third_us) {
            println!("  p50 first third {first:.1} µs, last third {last:.1} µs");
        }
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
/// `transport` or `timeout`.
pub fn write_requests_csv(path: &std::path::Path, records: &[Record]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let file = std::fs::File::create(path)?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(
        out,
        "request_id,scheduled_ns,sent_ns,received_ns,status,error,warmup"
    )?;
    for r in records {
        let (status, error) = match r.outcome {
            crate::conn::Outcome::Status(status) => (status, ""),
            crate::conn::Outcome::Transport => (0, "transport"),
            crate::conn::Outcome::Timeout => (0, "timeout"),
        };
        writeln!(
            out,
            "{},{},{},{},{status},{error},{}",
            r.id, r.scheduled_ns, r.sent_ns, r.received_ns, r.warmup as u8
        )?;
    }
    out.flush()?;
    Ok(())
}
