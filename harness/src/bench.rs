//! `cargo xtask bench`: the Phase 0 overhead matrix, out of process.
//!
//! Per upstream delay (0 and 5 ms): a demo ledger is initialised, the gateway's max rate is
//! found with `loadgen --find-max` against it (which also pre-fills that ledger), and then
//! every row runs on a fresh copy of that same ledger, so all rows start from a ledger of the
//! same size. Each gateway row is followed by the same load sent straight to mock-upstream;
//! added latency per percentile = gateway − direct. Raw fdatasync on the ledger's filesystem
//! is measured before and after the matrix: the physical floor of a durable receipt.
//!
//! With `--baseline REV`, every row also runs the gateway built from REV, on a copy of the
//! same ledger at the same rates, between this gateway's run and the direct one: a before /
//! after pair from one run on one host.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
mod results_md;

use session::bench::{
    Added, BaselineRev, BaselineRow, FsyncProbe, FsyncStats, Gate, MaxRate, Pinning, Results, Row,
    Side,
};
use session::targets::GATE_P99_ADDED_US;

use crate::baseline;
use crate::machine::{filesystem_of, load_average};
use crate::procs::{
    Binaries, Listener, init_demo_db, run_loadgen, start_gateway, start_mock_upstream,
};
use crate::procstat;

const DELAYS_MS: [u64; 2] = [0, 5];
const CLOSED_CONCURRENCY: [usize; 3] = [1, 16, 64];
const OPEN_FRACTIONS: [f64; 3] = [0.25, 0.50, 0.75];
/// Open loop connections: enough that at 75% of max with a 5 ms upstream no request queues
/// in loadgen for want of a connection. 128 could not: ~20,700 req/s × 5.2-6.4 ms is 110-130
/// in flight before the gateway queues at all, and both sides of that row fell behind (in a 3 s
/// check, 256 held the rate on both sides and 128 did not).
const OPEN_CONNECTIONS: usize = 256;
const LEDGER_FILE: &str = "ledger.db";

#[derive(clap::Args)]
pub struct Args {
    /// Short rows (2 s each) to try the bench out; about 2 minutes in all.
    #[arg(long)]
    quick: bool,
    /// The gateway's tokio worker threads.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// CPUs for the gateway (a `taskset -c` list).
    #[arg(long, default_value = "0")]
    gateway_cpus: String,
    /// CPUs for loadgen and mock-upstream (a `taskset -c` list).
    #[arg(long, default_value = "1")]
    load_cpus: String,
    /// Measured seconds per row (default 20, or 2 with --quick).
    #[arg(long)]
    duration: Option<f64>,
    #[command(flatten)]
    output: crate::flags::Output,
    /// Also run every row against the gateway of git revision REV (a commit, tag or `HEAD~3`),
    /// built under target/baseline/, on a copy of the same ledger at the same rates. REV's
    /// gateway must read this ledger's schema (`gateway verify` checks every row's).
    #[arg(long, value_name = "REV")]
    baseline: Option<String>,
    /// Run nothing: re-judge the rows of DIR/results.json and rewrite DIR/RESULTS.md from it
    /// (after a change to the report's text or its rules; the measured figures stay those of
    /// the run).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["quick", "duration", "out", "overwrite"])]
    render: Option<PathBuf>,
}

struct Timing {
    row: f64,
    warmup: f64,
    step: f64,
    step_warmup: f64,
}

/// loadgen's `--out` summary of one side.
fn read_side(path: &Path) -> anyhow::Result<Side> {
    let load: session::loadgen::Summary = crate::workspace::read_json(path)?;
    let latency = &load.latency_us;
    Ok(Side {
        achieved_rate: load.achieved_rate,
        sent: load.sent,
        ok: load.ok,
        errors: load.errors,
        p50_us: latency.p50,
        p90_us: latency.p90,
        p99_us: latency.p99,
        p999_us: latency.p999,
        max_us: latency.max,
        p50_first_third_us: load.p50_first_third_us,
        p50_last_third_us: load.p50_last_third_us,
        send_lag_p99_us: load.send_lag_us.map(|lag| lag.p99),
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(dir) = &args.render {
        return render_dir(dir);
    }
    ensure!(args.workers >= 1, "--workers must be at least 1");
    let started = Instant::now();
    let timing = Timing::of(&args);
    ensure!(timing.row > 0.0, "--duration must be positive");
    let machine = crate::machine::collect();
    let out_dir = (args.output).prepare(if args.quick { "bench-quick" } else { "bench" })?;
    let bins = Binaries::build()?;
    let baseline = args.baseline.as_deref().map(baseline::build).transpose()?;
    let baseline_bins = baseline.as_ref().map(|b| Binaries {
        gateway: b.gateway.clone(),
        ..bins.clone()
    });
    let scratch = tempfile::Builder::new()
        .prefix("xtask-bench-")
        .tempdir()
        .context("creating a temp dir")?;
    let work = scratch.path();
    let ledger_filesystem = filesystem_of(work);
    let load_cpus = Some(args.load_cpus.as_str());
    let rows_total = DELAYS_MS.len() * (CLOSED_CONCURRENCY.len() + OPEN_FRACTIONS.len());
    eprintln!(
        "bench: gateway on CPU {} ({} worker{}), loadgen + mock-upstream on CPU {}; {rows_total} rows of {:.0} s (+{:.1} s warm-up), each run twice (gateway, direct); scratch {} on {ledger_filesystem}",
        args.gateway_cpus,
        args.workers,
        if args.workers == 1 { "" } else { "s" },
        args.load_cpus,
        timing.row,
        timing.warmup,
        work.display()
    );

    let fdatasync_before = measure_fdatasync(work)?;
    log_fdatasync("before", &fdatasync_before);

    let mut rows = Vec::new();
    let mut max_rates = Vec::new();
    let mut pinning = None;
    for delay_ms in DELAYS_MS {
        let delay_dir = work.join(format!("delay-{delay_ms}ms"));
        std::fs::create_dir_all(&delay_dir)?;
        let mock = start_mock_upstream(&bins, load_cpus, delay_ms, &delay_dir)?;
        let template = delay_dir.join("template");
        std::fs::create_dir_all(&template)?;
        let key = init_demo_db(&bins.gateway, &template.join(LEDGER_FILE), &mock.url)?;

        // Max rate, on the template ledger: this also pre-fills it for every row.
        let search = MaxSearch {
            bins: &bins,
            args: &args,
            timing: &timing,
            template: &template,
            key: &key,
            dir: &delay_dir,
        };
        let (max, pins) = search.run(delay_ms, &mock)?;
        pinning.get_or_insert(pins);
        let (max_rate, receipts_in_template) = (max.max_rate, max.receipts_in_template);
        max_rates.push(max);

        let loads = CLOSED_CONCURRENCY
            .iter()
            .map(|&c| Shape::Closed(c))
            .chain(OPEN_FRACTIONS.iter().map(|&f| Shape::Open(f, f * max_rate)));
        for shape in loads {
            let index = rows.len() + 1;
            eprint!(
                "bench: [{index:>2}/{rows_total}] delay {delay_ms} ms, {} ... ",
                shape.describe()
            );
            let _ = std::io::stderr().flush();
            let row_dir = delay_dir.join(format!("row-{index}"));
            let loadgen_timeout = Duration::from_secs_f64(timing.row + timing.warmup + 60.0);
            let this = GatewayRun {
                bins: &bins,
                args: &args,
                template: &template,
                key: &key,
                timing: &timing,
                timeout: loadgen_timeout,
            };
            let direct = DirectRun {
                bins: &bins,
                url: &mock.url,
                key: &key,
                load_cpus,
                timing: &timing,
                timeout: loadgen_timeout,
            };
            let sides = RowSides {
                this,
                baseline: baseline_bins.as_ref(),
                direct,
            };
            let row = sides.measure(shape, delay_ms, receipts_in_template, &row_dir)?;
            log_row(&row);
            rows.push(row);
            std::fs::remove_dir_all(&row_dir)?;
        }
        drop(mock);
    }

    let fdatasync_after = measure_fdatasync(work)?;
    log_fdatasync("after", &fdatasync_after);
    let results = Results {
        machine,
        pinning: pinning.context("no row ran")?,
        ledger_filesystem,
        quick: args.quick,
        row_duration_s: timing.row,
        row_warmup_s: timing.warmup,
        gate_p99_added_us: GATE_P99_ADDED_US.limit(),
        open_connections: OPEN_CONNECTIONS,
        fdatasync_before,
        fdatasync_after,
        max_rates,
        baseline: baseline.map(|b| BaselineRev {
            rev: b.rev,
            commit: b.commit,
        }),
        rows,
        wall_time_s: started.elapsed().as_secs_f64(),
        load_average_at_end: load_average(),
    };
    std::fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&results)? + "\n",
    )?;
    std::fs::write(out_dir.join("RESULTS.md"), results_md::render(&results))?;
    eprintln!(
        "bench: done in {:.0} s; wrote {}/RESULTS.md and results.json",
        results.wall_time_s,
        out_dir.display()
    );
    Ok(())
}

/// The sides of one row: this gateway, the `--baseline` one if any, and the direct run.
struct RowSides<'a> {
    this: GatewayRun<'a>,
    baseline: Option<&'a Binaries>,
    direct: DirectRun<'a>,
}

/// loadgen straight to the mock upstream: what the load side alone costs.
struct DirectRun<'a> {
    bins: &'a Binaries,
    url: &'a str,
    key: &'a str,
    load_cpus: Option<&'a str>,
    timing: &'a Timing,
    timeout: Duration,
}

impl RowSides<'_> {
    /// Runs the row's sides in `row_dir` and judges it.
    fn measure(
        self,
        shape: Shape,
        delay_ms: u64,
        receipts_in_template: u64,
        row_dir: &Path,
    ) -> anyhow::Result<Row> {
        let this = self.this;
        let current = this.run(shape, &row_dir.join("gateway"))?;
        let baseline_run = self
            .baseline
            .map(|bins| GatewayRun { bins, ..this }.run(shape, &row_dir.join("baseline")))
            .transpose()?;

        let d = &self.direct;
        let direct_json = row_dir.join("direct.json");
        let mut direct_run = loadgen_args(d.url, Some(d.key), true);
        direct_run.extend(shape.flags(d.timing, &direct_json));
        run_loadgen(d.bins, d.load_cpus, &direct_run, d.timeout, row_dir)?;

        let direct_side = read_side(&direct_json)?;
        let baseline_row = baseline_run.map(|b| {
            let b_added = Added::between(&b.side, &direct_side);
            BaselineRow {
                gate: Gate::judge(&b.side, &b_added),
                added: Some(b_added),
                gateway: b.side,
                gateway_cpu_us_per_request: b.cpu_us_per_request,
                receipts_at_end: b.receipts_at_end,
                invalid_reason: None,
            }
        });
        let this_added = Added::between(&current.side, &direct_side);
        let gate = Gate::judge(&current.side, &this_added);
        let mut row = Row {
            mode: shape.mode().to_owned(),
            load: shape.label(),
            delay_ms,
            concurrency: shape.concurrency(),
            fraction_of_max: shape.fraction(),
            target_rate: shape.rate(),
            gateway: current.side,
            direct: direct_side,
            added: Some(this_added),
            receipts_at_start: receipts_in_template,
            receipts_at_end: current.receipts_at_end,
            wal_bytes_after: current.wal_bytes_after,
            gateway_cpu_us_per_request: current.cpu_us_per_request,
            gate,
            invalid_reason: None,
            baseline: baseline_row,
        };
        row.judge();
        Ok(row)
    }
}

/// One line of progress per row (and one for its baseline side).
fn log_row(row: &Row) {
    let (g, d) = (&row.gateway, &row.direct);
    match (&row.added, &row.invalid_reason) {
        (Some(added), _) => eprintln!(
            "{:.0} req/s, p99 {:.0} µs (direct {:.0} µs), added p99 {:.0} µs, {} errors: {}",
            g.achieved_rate,
            g.p99_us,
            d.p99_us,
            added.p99_us,
            g.error_count(),
            row.gate
        ),
        (None, reason) => eprintln!(
            "{:.0} req/s (direct {:.0} req/s): INVALID, {}",
            g.achieved_rate,
            d.achieved_rate,
            reason.as_deref().unwrap_or_default()
        ),
    }
    if let Some(b) = &row.baseline {
        eprintln!(
            "bench:         baseline: {:.0} req/s, added p99 {} µs, {} µs CPU/request: {}",
            b.gateway.achieved_rate,
            b.added
                .as_ref()
                .map_or_else(|| "—".to_owned(), |a| format!("{:.0}", a.p99_us)),
            b.gateway_cpu_us_per_request
                .map_or_else(|| "—".to_owned(), |us| format!("{us:.1}")),
            b.gate
        );
    }
}

fn log_fdatasync(when: &str, probe: &FsyncProbe) {
    eprintln!(
        "bench: raw fdatasync {when}: overwrite p50 {:.0} µs, p99 {:.0} µs; append p50 {:.0} µs, p99 {:.0} µs",
        probe.overwrite.p50_us, probe.overwrite.p99_us, probe.append.p50_us, probe.append.p99_us
    );
}

/// `--render DIR`: re-judge DIR/results.json's rows and rewrite it and RESULTS.md.
fn render_dir(dir: &Path) -> anyhow::Result<()> {
    let json = dir.join("results.json");
    let mut results: Results = crate::workspace::read_json(&json)?;
    // Older runs were judged without the rule: their results.json is rewritten too, so
    // no row keeps a verdict on figures from a run that did not run as asked.
    results.rows.iter_mut().for_each(Row::judge);
    std::fs::write(&json, serde_json::to_string_pretty(&results)? + "\n")
        .with_context(|| format!("writing {}", json.display()))?;
    std::fs::write(dir.join("RESULTS.md"), results_md::render(&results))?;
    eprintln!(
        "bench: re-judged {}/results.json and rewrote RESULTS.md from it",
        dir.display()
    );
    Ok(())
}

impl Timing {
    fn of(args: &Args) -> Timing {
        match (args.quick, args.duration) {
            (true, duration) => Timing {
                row: duration.unwrap_or(2.0),
                warmup: 0.5,
                step: 0.5,
                step_warmup: 0.2,
            },
            (false, duration) => Timing {
                row: duration.unwrap_or(20.0),
                warmup: 2.0,
                step: 2.0,
                step_warmup: 0.5,
            },
        }
    }
}

/// The max-rate search of one upstream delay, on its template ledger.
struct MaxSearch<'a> {
    bins: &'a Binaries,
    args: &'a Args,
    timing: &'a Timing,
    template: &'a Path,
    key: &'a str,
    dir: &'a Path,
}

impl MaxSearch<'_> {
    /// The search's max rate (which also pre-fills the template ledger for every row) and
    /// the pinning as applied.
    fn run(&self, delay_ms: u64, mock: &Listener) -> anyhow::Result<(MaxRate, Pinning)> {
        let (bins, args, timing, template, key, delay_dir) = (
            self.bins,
            self.args,
            self.timing,
            self.template,
            self.key,
            self.dir,
        );
        let load_cpus = Some(args.load_cpus.as_str());
        eprintln!("bench: delay {delay_ms} ms: searching the gateway's max rate");
        let mut gateway = start_gateway(
            bins,
            Some(&args.gateway_cpus),
            &template.join(LEDGER_FILE),
            args.workers,
            delay_dir,
        )?;
        let pinning = Pinning {
            gateway_cpus: gateway.proc.cpus.clone().unwrap_or_default(),
            gateway_cpus_allowed: gateway.proc.cpus_allowed()?,
            load_cpus: mock.proc.cpus.clone().unwrap_or_default(),
            mock_upstream_cpus_allowed: mock.proc.cpus_allowed()?,
            gateway_workers: args.workers,
        };
        let max_json = delay_dir.join("find-max.json");
        let mut find_max = loadgen_args(&gateway.url, Some(key), false);
        find_max.extend(strings(&[
            "--find-max",
            "--duration",
            &timing.step.to_string(),
            "--warmup",
            &timing.step_warmup.to_string(),
            "--max-concurrency",
            if args.quick { "64" } else { "256" },
            "--out",
        ]));
        find_max.push(max_json.display().to_string());
        run_loadgen(
            bins,
            load_cpus,
            &find_max,
            Duration::from_secs(600),
            delay_dir,
        )?;
        gateway.proc.stop()?;
        drop(gateway);
        let max: session::loadgen::FindMax = crate::workspace::read_json(&max_json)?;
        let max_rate = max.max_rate;
        let receipts_in_template = verify(bins, &template.join(LEDGER_FILE))?;
        eprintln!(
            "bench: delay {delay_ms} ms: max {max_rate:.0} req/s at c{}; template ledger holds {receipts_in_template} receipts",
            max.best_concurrency
        );
        let max = MaxRate {
            delay_ms,
            max_rate,
            best_concurrency: max.best_concurrency as u64,
            receipts_in_template,
        };
        Ok((max, pinning))
    }
}

/// One gateway's run of a row: a fresh copy of the template ledger, the load, the gateway's
/// CPU over it, then its ledger verified.
#[derive(Clone, Copy)]
struct GatewayRun<'a> {
    bins: &'a Binaries,
    args: &'a Args,
    template: &'a Path,
    key: &'a str,
    timing: &'a Timing,
    timeout: Duration,
}

struct GatewaySide {
    side: Side,
    cpu_us_per_request: Option<f64>,
    receipts_at_end: u64,
    wal_bytes_after: u64,
}

impl GatewayRun<'_> {
    fn run(self, shape: Shape, dir: &Path) -> anyhow::Result<GatewaySide> {
        copy_ledger(self.template, dir)?;
        let db = dir.join(LEDGER_FILE);
        let json = dir.join("gateway.json");
        let mut gateway = start_gateway(
            self.bins,
            Some(&self.args.gateway_cpus),
            &db,
            self.args.workers,
            dir,
        )?;
        let mut run = loadgen_args(&gateway.url, Some(self.key), false);
        run.extend(shape.flags(self.timing, &json));
        let cpu_before = procstat::cpu_seconds(gateway.proc.pid());
        run_loadgen(
            self.bins,
            Some(&self.args.load_cpus),
            &run,
            self.timeout,
            dir,
        )?;
        let cpu_s = procstat::cpu_seconds(gateway.proc.pid())
            .zip(cpu_before)
            .map(|(after, before)| after - before);
        // Before stopping: a clean shutdown may checkpoint and shrink the WAL.
        let wal_bytes_after = file_len(&dir.join(format!("{LEDGER_FILE}-wal")));
        gateway.proc.stop()?;
        drop(gateway);
        let side = read_side(&json)?;
        Ok(GatewaySide {
            cpu_us_per_request: cpu_s.map(|s| s * 1e6 / side.sent.max(1) as f64),
            side,
            receipts_at_end: verify(self.bins, &db)?,
            wal_bytes_after,
        })
    }
}

#[derive(Clone, Copy)]
enum Shape {
    Closed(usize),
    /// Fraction of max, and the rate it comes to.
    Open(f64, f64),
}

impl Shape {
    fn mode(self) -> &'static str {
        match self {
            Shape::Closed(_) => "closed",
            Shape::Open(..) => "open",
        }
    }

    fn label(self) -> String {
        match self {
            Shape::Closed(c) => format!("c{c}"),
            Shape::Open(fraction, _) => format!("{:.0}%", fraction * 100.0),
        }
    }

    fn describe(self) -> String {
        match self {
            Shape::Closed(c) => format!("closed loop c{c}"),
            Shape::Open(fraction, rate) => format!(
                "open loop {:.0}% of max = {rate:.0} req/s",
                fraction * 100.0
            ),
        }
    }

    fn concurrency(self) -> Option<usize> {
        match self {
            Shape::Closed(c) => Some(c),
            Shape::Open(..) => None,
        }
    }

    fn fraction(self) -> Option<f64> {
        match self {
            Shape::Closed(_) => None,
            Shape::Open(fraction, _) => Some(fraction),
        }
    }

    fn rate(self) -> Option<f64> {
        match self {
            Shape::Closed(_) => None,
            Shape::Open(_, rate) => Some(rate),
        }
    }

    fn flags(self, timing: &Timing, out: &Path) -> Vec<String> {
        let mut flags = match self {
            Shape::Closed(c) => strings(&["--concurrency", &c.to_string()]),
            Shape::Open(_, rate) => strings(&[
                "--rate",
                &format!("{rate:.3}"),
                "--connections",
                &OPEN_CONNECTIONS.to_string(),
            ]),
        };
        flags.extend(strings(&[
            "--duration",
            &timing.row.to_string(),
            "--warmup",
            &timing.warmup.to_string(),
            "--out",
        ]));
        flags.push(out.display().to_string());
        flags
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The same request either way; `--direct` sends it to mock-upstream's `/echo`.
fn loadgen_args(url: &str, key: Option<&str>, direct: bool) -> Vec<String> {
    let mut args = strings(&["--url", url]);
    if let Some(key) = key {
        args.extend(strings(&["--key", key]));
    }
    if direct {
        args.push("--direct".to_owned());
    }
    args
}

/// Copies a stopped gateway's ledger (database, WAL, key files; not the shared-memory index,
/// which SQLite rebuilds) into a fresh directory.
fn copy_ledger(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(LEDGER_FILE) && !name.ends_with("-shm") && entry.file_type()?.is_file()
        {
            std::fs::copy(entry.path(), to.join(&*name))
                .with_context(|| format!("copying {name}"))?;
        }
    }
    Ok(())
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

/// `gateway verify`: every hash, chain link and signature; returns the receipt count.
fn verify(bins: &Binaries, db: &Path) -> anyhow::Result<u64> {
    let output = Command::new(&bins.gateway)
        .arg("verify")
        .arg("--db")
        .arg(db)
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "gateway verify --db {} failed: {}{}",
            db.display(),
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    stdout
        .lines()
        .find_map(|line| {
            line.strip_prefix("ok: ")?
                .strip_suffix(" receipts")?
                .parse()
                .ok()
        })
        .with_context(|| format!("unexpected gateway verify output: {stdout:?}"))
}

const FSYNC_SAMPLES: usize = 1000;
const FSYNC_TIME_LIMIT: Duration = Duration::from_secs(5);
const BLOCK: usize = 4096;

fn measure_fdatasync(dir: &Path) -> anyhow::Result<FsyncProbe> {
    Ok(FsyncProbe {
        overwrite: fdatasync_loop(dir, false)?,
        append: fdatasync_loop(dir, true)?,
    })
}

/// Writes 4 KiB and fdatasyncs, up to 1000 times or 5 s: appending, or cycling over the
/// blocks of a file preallocated (and synced) beforehand.
fn fdatasync_loop(dir: &Path, append: bool) -> anyhow::Result<FsyncStats> {
    use std::os::unix::fs::FileExt as _;
    let path = dir.join("fdatasync-probe");
    let file = File::create(&path)?;
    let blocks = 256;
    if !append {
        file.write_all_at(&vec![0; BLOCK * blocks], 0)?;
        file.sync_all()?;
    }
    let block = [0x5a_u8; BLOCK];
    let mut samples = Vec::with_capacity(FSYNC_SAMPLES);
    let deadline = Instant::now() + FSYNC_TIME_LIMIT;
    while samples.len() < FSYNC_SAMPLES && Instant::now() < deadline {
        let offset = if append {
            samples.len()
        } else {
            samples.len() % blocks
        } * BLOCK;
        file.write_all_at(&block, offset as u64)?;
        let start = Instant::now();
        file.sync_data()?;
        samples.push(start.elapsed().as_nanos() as f64 / 1e3);
    }
    drop(file);
    std::fs::remove_file(&path)?;
    samples.sort_by(f64::total_cmp);
    let at =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    Ok(FsyncStats {
        samples: samples.len(),
        p50_us: at(0.50),
        p99_us: at(0.99),
        max_us: at(1.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_shortens_the_rows_and_a_duration_overrides_either() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let timing =
            |extra: &[&str]| Timing::of(&Cli::parse_from(["bench"].iter().chain(extra)).args);
        let full = timing(&[]);
        assert_eq!((full.row, full.warmup, full.step), (20.0, 2.0, 2.0));
        let quick = timing(&["--quick"]);
        assert_eq!((quick.row, quick.warmup, quick.step), (2.0, 0.5, 0.5));
        assert_eq!(timing(&["--quick", "--duration", "7"]).row, 7.0);
    }

    #[test]
    fn a_baseline_that_names_no_commit_is_refused() {
        let err = baseline::build("no-such-revision").err().unwrap();
        assert!(
            err.to_string().contains("not a commit of this repository"),
            "{err}"
        );
    }

    /// Golden: every committed bench run's RESULTS.md is what `--render` makes of its
    /// results.json (which re-judges the rows first).
    #[test]
    fn every_committed_bench_re_renders_byte_for_byte() {
        let profiles = crate::workspace::root().join("profiles");
        let dirs = session::runs_holding(&profiles, "results.json").unwrap();
        assert!(!dirs.is_empty(), "no profiles/*/results.json");
        for dir in &dirs {
            let mut results: Results =
                crate::workspace::read_json(&dir.join("results.json")).unwrap();
            results.rows.iter_mut().for_each(Row::judge);
            let committed = std::fs::read_to_string(dir.join("RESULTS.md")).unwrap();
            assert!(
                results_md::render(&results) == committed,
                "{} differs",
                dir.display()
            );
        }
    }
}
