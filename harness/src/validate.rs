//! `cargo xtask validate`: prove the tracer's numbers on this machine (issue 6).
//!
//! One gateway (pinned to its CPUs) and one mock-upstream serve every part, in this order:
//! 1. max throughput untraced (`loadgen --find-max`);
//! 2. accuracy: an open loop at `load` × max with the tracer attached (and `--raw-events`),
//!    joined with loadgen's per-request log (`session::analysis::accuracy`), plus the
//!    independent fsync/run-queue cross-check of the raw dump (`session::analysis::crosscheck`);
//! 3. probe effect: `windows` traced and `windows` untraced windows at the same rate, in
//!    flipping pairs, with the gateway's CPU per request and CPU 0's busy share per window;
//!    then each other mode's cost, and the floor rows, in shorter A/Bs;
//! 4. max throughput traced, each search right after an untraced one (two rounds), and with
//!    the tracepoints alone;
//! 5. loss at 100% and 150% of the traced max, each after the same load untraced, and a
//!    forced-loss run with the smallest ring;
//! 6. a soak at `load` × max, sampling the tracer's RSS and CPU.
//!
//! Writes `profiles/validation-<date>/validation.json` and `README.md`.

mod readme;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::de::DeserializeOwned;
use session::analysis::ab::Arm;
use session::analysis::{accuracy, crosscheck};
use session::breakdown::{Breakdown, Calibration};
use session::loadgen::{FindMax, Summary};
use session::validation::{
    Ab, AccuracyRun, Cost, Hits, LoadSummary, LossRun, MaxRate, Minute, Mode, Pin, Search,
    Settings, Soak, SoakSample, TracedUntraced, TracerCounts, Untraced, VALIDATION_JSON,
    Validation, WindowRecord,
};

use crate::ab::{self as windows_ab, Traced, median};
use crate::flags;
use crate::procs::{self, Binaries, Listener, Served, run_loadgen, start_tracer};
use crate::procstat;

/// Untraced-then-traced max searches (step 4).
const MAX_SEARCH_ROUNDS: usize = 2;
/// Open-loop keep-alive connections (as `xtask profile`).
const CONNECTIONS: u64 = 32;
/// How often the soak samples the tracer's RSS and CPU.
const SOAK_SAMPLE: Duration = Duration::from_secs(10);

#[derive(clap::Args)]
pub struct Args {
    /// Fraction of the untraced max throughput for accuracy, A/B and soak (0 < load ≤ 1).
    #[arg(long, default_value_t = 0.25, value_parser = flags::fraction(1.0))]
    load: f64,
    /// Seconds of the traced accuracy run.
    #[arg(long, default_value_t = 20.0, value_parser = flags::seconds)]
    duration: f64,
    /// A/B windows per arm (at least 5).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(5..=50))]
    windows: u64,
    /// Seconds of each A/B window.
    #[arg(long, default_value_t = 10.0, value_parser = flags::seconds)]
    window: f64,
    /// A/B windows per arm for each of the other modes' cost (--phases, --offcpu-stacks,
    /// --sample-hz 999, --wait-for, all four as `profile` runs them, and the floor: the tracepoints
    /// alone and the sites alone, plus the traced max with the tracepoints alone); 0 skips
    /// them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=50))]
    mode_windows: u64,
    /// Seconds of each of those windows.
    #[arg(long, default_value_t = 5.0, value_parser = flags::seconds)]
    mode_window: f64,
    /// Seconds of each loss run (100% and 150% of the traced max, and the forced-loss run).
    #[arg(long, default_value_t = 5.0, value_parser = flags::seconds)]
    loss_duration: f64,
    /// Ring buffer of the forced-loss run, MiB (the tracer's smallest).
    #[arg(long, default_value_t = 1)]
    forced_ring_mib: u32,
    /// How long the forced-loss run stops the tracer (SIGSTOP) so its small ring overflows, s.
    #[arg(long, default_value_t = 1.0, value_parser = flags::seconds)]
    forced_stall: f64,
    /// Seconds of the soak at `load` × max (the issue asks for 5 minutes).
    #[arg(long, default_value_t = 300.0, value_parser = flags::seconds)]
    soak: f64,
    /// Shorten everything (accuracy 5 s, windows 3 s, loss 3 s, soak 30 s) to try it out.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    output: flags::Output,
    #[command(flatten)]
    placement: flags::Placement,
    /// Skip the untraced max search and use this rate (req/s).
    #[arg(long)]
    max_rate: Option<f64>,
    /// Only re-render DIR/README.md from DIR/validation.json (no run).
    #[arg(long, value_name = "DIR")]
    render: Option<PathBuf>,
}

fn build_tracer() -> anyhow::Result<PathBuf> {
    procs::cargo_build_release(&["-p", "tracer", "--bins"])?.find("tracer")
}

/// Everything the parts share.
struct Bench {
    bins: Binaries,
    tracer: PathBuf,
    gateway: Listener,
    _mock: Listener,
    key: String,
    work: PathBuf,
    load_cpus: String,
    /// The CPU whose busy share the A/B windows read.
    gateway_cpu: usize,
    runs: u64,
}

impl Bench {
    fn loadgen_flags(&self, extra: &[String]) -> Vec<String> {
        let mut all = strings(&["--url", &self.gateway.url, "--key", &self.key]);
        all.extend_from_slice(extra);
        all
    }

    /// Runs loadgen with `--out` and returns its summary (`Summary`, or `FindMax` with
    /// `--find-max`).
    fn loadgen<T: DeserializeOwned>(
        &mut self,
        extra: &[String],
        timeout: Duration,
    ) -> anyhow::Result<T> {
        self.runs += 1;
        let out = self.work.join(format!("loadgen-{}.json", self.runs));
        let mut flags = self.loadgen_flags(extra);
        flags.extend(strings(&["--out", &path_arg(&out)]));
        run_loadgen(
            &self.bins,
            Some(&self.load_cpus),
            &flags,
            timeout,
            &self.work,
        )?;
        crate::workspace::read_json(&out)
    }

    fn open_loop(&mut self, rate: f64, seconds: f64, extra: &[&str]) -> anyhow::Result<Summary> {
        let mut flags = strings(&[
            "--rate",
            &format!("{rate:.3}"),
            "--duration",
            &seconds.to_string(),
            "--connections",
            &CONNECTIONS.to_string(),
            "--warmup",
            "0",
        ]);
        flags.extend(strings(extra));
        self.loadgen(&flags, Duration::from_secs_f64(seconds + 60.0))
    }

    fn find_max(&mut self, step_s: f64) -> anyhow::Result<f64> {
        let found: FindMax = self.loadgen(
            &strings(&["--find-max", "--duration", &step_s.to_string()]),
            Duration::from_secs(600),
        )?;
        Some(found.max_rate)
            .filter(|r| *r > 0.0)
            .context("loadgen --find-max reported no max_rate")
    }

    /// The tracer's session in `dir` joined with loadgen's per-request log `client_csv`.
    fn accuracy(&self, client_csv: &Path, dir: &Path) -> anyhow::Result<accuracy::Accuracy> {
        let (requests, incomplete) = (dir.join("requests.csv"), dir.join("incomplete.csv"));
        accuracy::join_files(client_csv, &requests, &incomplete)
    }

    /// Starts `tracer record` on the load CPUs and waits until its programs are attached.
    fn attach(&mut self, name: &str, extra: &[&str]) -> anyhow::Result<Traced> {
        let dir = self.work.join(name);
        crate::session_dir::for_tracer(&dir)?;
        // The tracer's log is already in it.
        let mut flags = strings(&[
            "record",
            "--pid",
            &self.gateway.proc.pid().to_string(),
            "--out",
            &path_arg(&dir),
            "--overwrite",
        ]);
        flags.extend(strings(extra));
        // Calibration is measured once, in the accuracy run; the others skip its loops.
        if name != "accuracy" {
            flags.push("--no-calibrate".to_owned());
        }
        let tracer = start_tracer(&self.tracer, Some(&self.load_cpus), &flags, &dir)?;
        Ok(Traced { tracer, dir })
    }
}

/// The A/B's view of the bench: the tracer with `extra` flags, the open loop at `rate`.
struct AbArms<'a> {
    bench: &'a mut Bench,
    name: &'a str,
    extra: &'a [&'a str],
    rate: f64,
}

impl windows_ab::Arms for AbArms<'_> {
    fn attach(&mut self, index: usize) -> anyhow::Result<Traced> {
        self.bench
            .attach(&format!("{}-{index}", self.name), self.extra)
    }

    fn open_loop(&mut self, seconds: f64) -> anyhow::Result<Summary> {
        self.bench.open_loop(self.rate, seconds, &[])
    }
}

impl Bench {
    /// `per_arm` traced and `per_arm` untraced windows of `window` s at `rate`, in flipping
    /// pairs (U T T U U T …) so drift falls on both arms; the tracer runs with `extra` flags.
    fn ab_windows(
        &mut self,
        name: &str,
        extra: &[&str],
        rate: f64,
        per_arm: usize,
        window: f64,
    ) -> anyhow::Result<Vec<WindowRecord>> {
        let (pid, cpu) = (self.gateway.proc.pid(), self.gateway_cpu);
        let mut arms = AbArms {
            bench: self,
            name,
            extra,
            rate,
        };
        windows_ab::windows(&mut arms, pid, cpu, per_arm, window)
    }
}

impl Bench {
    /// One traced window with BPF run-time stats on, kept out of the A/B (the stats cost
    /// each program run two clock reads): BPF ns per answered request (client side, since a
    /// `--skip` session rebuilds no request).
    fn bpf_window(
        &mut self,
        name: &str,
        extra: &[&str],
        rate: f64,
        window: f64,
    ) -> anyhow::Result<f64> {
        let mut flags = extra.to_vec();
        flags.push("--bpf-stats");
        let tracer = self.attach(name, &flags)?;
        let load = self.open_loop(rate, window, &[]);
        let (breakdown, _) = tracer.stop()?;
        Ok(bpf_ns_per_answered(&breakdown, &load?))
    }
}

/// A stats session's BPF run time over the requests the client saw answered.
fn bpf_ns_per_answered(breakdown: &Breakdown, load: &Summary) -> f64 {
    let run_time = breakdown.cost.as_ref().and_then(|c| c.bpf_run_time_ns());
    run_time.unwrap_or(f64::NAN) / load.ok as f64
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

/// The independent cross-check of the raw dump `raw`, beside the model's `kernel` section of
/// the same session's `breakdown`; prints the table as it goes.
fn cross_check(raw: &Path, breakdown: &Breakdown) -> anyhow::Result<crosscheck::Report> {
    let independent = crosscheck::check(crosscheck::read_dump(raw)?);
    let model = breakdown
        .kernel
        .as_ref()
        .context("the accuracy session's breakdown.json has no `kernel` section")?;
    let comparison = crosscheck::compare(&independent, &model.into());
    print!("{}", crosscheck::table(&comparison));
    println!(
        "crosscheck: {} events, writer tids {:?}, {} switch-ins of threads never seen before",
        independent.events, independent.writer_tids, independent.switch_in_unknown
    );
    Ok(crosscheck::Report {
        comparison,
        independent,
    })
}

/// The tracer's options beyond the lean default, each costed on its own, and as `profile`
/// runs them together; then the floor: the lean set split into its uprobes and its
/// tracepoints (`--skip`), and all of it with programs that return at once
/// (`--empty-programs`: the hooks' own cost). Floor rows measure cost only: no request
/// rebuilds.
const MODES: [(&str, &[&str]); 8] = [
    ("--phases", &["--phases"]),
    ("--offcpu-stacks", &["--offcpu-stacks"]),
    ("--sample-hz 999", &["--sample-hz", "999"]),
    ("--wait-for", &["--wait-for"]),
    (
        "profile (all four)",
        &[
            "--phases",
            "--offcpu-stacks",
            "--sample-hz",
            "999",
            "--wait-for",
        ],
    ),
    (SKIP_SITES.0, SKIP_SITES.1),
    (
        "sites only (floor)",
        &[
            "--skip", "sched", "--skip", "syscalls", "--skip", "sockets", "--skip", "samples",
        ],
    ),
    (EMPTY_PROGRAMS.0, EMPTY_PROGRAMS.1),
];

/// Every hook of the lean set, each program returning at once: the traps and the dispatch.
const EMPTY_PROGRAMS: (&str, &[&str]) =
    ("hooks only, programs empty (floor)", &["--empty-programs"]);

/// The lean set without its uprobes: what the kernel events alone cost.
const SKIP_SITES: (&str, &[&str]) = ("tracepoints only (floor)", &["--skip", "sites"]);

/// Whether a mode's flags make it a cost-only floor row: a group left off, or empty programs.
fn is_floor(flags: &[&str]) -> bool {
    flags
        .iter()
        .any(|flag| matches!(*flag, "--skip" | "--empty-programs"))
}

/// One row of the cost-by-mode table, from a mode's A/B windows: the gateway's CPU per
/// request traced/untraced (ratio of the arms' medians), the tracer's hits per request
/// (median of the traced windows), calibrated probe time for those hits, and the BPF run time
/// per request of a separate stats window.
fn mode_cost(
    name: &str,
    flags: &[&str],
    windows: &[WindowRecord],
    calibration: Option<&Calibration>,
    bpf_ns_per_request: f64,
) -> Mode {
    let traced = || windows.iter().filter(|w| w.arm == Arm::Traced);
    let untraced = || windows.iter().filter(|w| w.arm == Arm::Untraced);
    let finite = |x: f64| Some(x).filter(|x| x.is_finite());
    let med = |values: Vec<Option<f64>>| finite(median(values.into_iter().flatten().collect()));
    let cpu_traced = med(traced().map(|w| w.gateway_cpu_us_per_request).collect());
    let cpu_untraced = med(untraced().map(|w| w.gateway_cpu_us_per_request).collect());
    let hits: Vec<Hits> = traced().filter_map(|w| w.tracer_hits_per_request).collect();
    let per_request = |kind: fn(&Hits) -> Option<f64>| med(hits.iter().map(kind).collect());
    let hits = Hits {
        sites: per_request(|h| h.sites),
        syscalls: per_request(|h| h.syscalls),
        sock: per_request(|h| h.sock),
        sched: per_request(|h| h.sched),
        samples: per_request(|h| h.samples),
    };
    // Calibrated kinds by their per-hit name; an unmeasured kind (null) is left out of the
    // sum, as the calibration's own is; no calibration at all measures nothing.
    let calibrated = [
        (hits.sites, "site"),
        (hits.syscalls, "syscall"),
        (hits.sock, "sock"),
        (hits.sched, "sched"),
    ];
    let probe_ns = match calibration {
        None => f64::NAN,
        Some(cal) => calibrated
            .iter()
            .filter_map(|(per_request, kind)| {
                let ns_per_hit = cal.ns_per_hit.get(*kind).copied().flatten()?;
                Some(f(*per_request) * ns_per_hit)
            })
            .sum(),
    };
    // A floor session rebuilds no request, so it has no hits to count.
    let floor = is_floor(flags);
    Mode {
        mode: name.to_owned(),
        flags: flags.iter().map(|f| (*f).to_owned()).collect(),
        windows_per_arm: windows.len() as u64 / 2,
        hits_per_request: (!floor).then_some(hits),
        probe_ns_per_request: if floor { None } else { finite(probe_ns) },
        probe_ns_per_request_leaves_out: calibration.and_then(|c| c.unmeasured.clone()),
        bpf_ns_per_request: finite(bpf_ns_per_request),
        gateway_cpu_us_per_request: TracedUntraced {
            untraced: cpu_untraced,
            traced: cpu_traced,
        },
        cpu_ratio: finite(f(cpu_traced) / f(cpu_untraced)),
        tracer_cpu_cores: med(traced().map(|w| w.tracer_cpu_cores).collect()),
    }
}

/// A figure for arithmetic: NaN when missing.
fn f(x: Option<f64>) -> f64 {
    x.unwrap_or(f64::NAN)
}

/// The lengths of each part, `--quick` applied.
struct Timing {
    accuracy_s: f64,
    window_s: f64,
    mode_window_s: f64,
    loss_s: f64,
    soak_s: f64,
    find_max_step_s: f64,
}

impl Timing {
    fn of(args: &Args) -> Timing {
        let quick = args.quick;
        Timing {
            accuracy_s: if quick { 5.0 } else { args.duration },
            window_s: if quick { 3.0 } else { args.window },
            mode_window_s: if quick { 2.0 } else { args.mode_window },
            loss_s: if quick { 3.0 } else { args.loss_duration },
            soak_s: if quick { 30.0 } else { args.soak },
            find_max_step_s: if quick { 1.0 } else { 2.0 },
        }
    }
}

/// `ensure_toolchain` installs the eBPF toolchain the tracer's build needs when it is missing
/// (xtask's `setup::ensure`), after the cheap checks of the flags and the privilege prompt.
pub fn run(
    args: Args,
    ensure_toolchain: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if let Some(dir) = &args.render {
        let readme = readme::render_dir(dir)?;
        eprintln!("xtask: wrote {}", readme.display());
        return Ok(());
    }
    crate::privilege::Runner::detect().authorize("cargo xtask validate")?;
    ensure_toolchain()?;
    let started = Instant::now();
    let timing = Timing::of(&args);
    let out = args.output.prepare("validation")?;
    let work = tempfile::Builder::new()
        .prefix("xtask-validate-")
        .tempdir()?;
    // Before building: the commit and the uncommitted paths are those of the code measured.
    let machine = crate::machine::collect();
    let (mut bench, mut pinning) = start(&args, work.path())?;

    // 1. Max throughput, untraced.
    let (max_untraced, max_source) = match args.max_rate {
        Some(r) => (r, "--max-rate"),
        None => {
            eprintln!("xtask: [1/6] max throughput, untraced");
            (
                bench.find_max(timing.find_max_step_s)?,
                "loadgen --find-max",
            )
        }
    };
    let rate = args.load * max_untraced;
    eprintln!("xtask: max {max_untraced:.0} req/s → {rate:.0} req/s");
    // An untraced warm-up at the rate, so the first window does not pay for cold caches.
    bench.open_loop(rate, 3.0, &[])?;

    let accuracy = accuracy_part(&mut bench, &args, &timing, rate, &out, &mut pinning)?;
    let (windows, ab, modes) = probe_effect_part(&mut bench, &args, &timing, rate, &accuracy)?;
    let max = max_part(&mut bench, &args, &timing)?;
    let loss_runs = loss_part(&mut bench, &args, &timing, rate, max.traced)?;
    let soak = soak_part(&mut bench, timing.soak_s, rate)?;

    // The tracer shares the load CPU with loadgen and the upstream: its CPU is probe effect too.
    let accuracy_cost = accuracy.breakdown.cost.clone();
    let tracer_cpu_cores = accuracy_cost
        .as_ref()
        .map(|c| c.tracer.cpu_session_s / c.session_s);
    let (searches, max_alongside, max_traced, max_floor) =
        (&max.searches, max.alongside, max.traced, max.floor);
    let validation = Validation {
        command: command_line(&args),
        machine,
        pinning,
        settings: Settings {
            load: args.load,
            quick: args.quick,
            connections: CONNECTIONS,
            accuracy_s: timing.accuracy_s,
            window_s: timing.window_s,
            windows_per_arm: args.windows,
            mode_window_s: Some(timing.mode_window_s),
            mode_windows_per_arm: Some(args.mode_windows),
            loss_s: timing.loss_s,
            soak_s: timing.soak_s,
            workers: args.placement.workers,
            forced_ring_mib: args.forced_ring_mib,
            forced_stall_s: args.forced_stall,
        },
        max_rate: MaxRate {
            untraced: max_untraced,
            untraced_source: max_source.to_owned(),
            searches: Some(
                searches
                    .iter()
                    .map(|&(untraced, traced)| Search {
                        untraced,
                        traced,
                        ratio: Some(traced / untraced),
                    })
                    .collect(),
            ),
            untraced_alongside: Some(max_alongside),
            traced: max_traced,
            ratio_traced_untraced: Some(max_traced / max_alongside),
            traced_tracepoints_only: max_floor,
            ratio_tracepoints_only_untraced: max_floor.map(|m| m / max_alongside),
        },
        rate,
        accuracy: AccuracyRun {
            loadgen: load_summary(&accuracy.load, false),
            tracer: tracer_counts(&accuracy.breakdown),
            join: accuracy.join,
        },
        crosscheck: accuracy.crosscheck,
        ab: Ab {
            windows,
            comparison: ab,
        },
        modes: Some(modes),
        calibration: accuracy.breakdown.calibration.clone(),
        cost: Cost {
            accuracy_run: accuracy_cost,
            max_traced_run: max.last_traced_breakdown.and_then(|b| b.cost),
            hits_per_request: accuracy.breakdown.hits_per_request.into(),
            tracer_cpu_cores,
            mode: accuracy.breakdown.mode().map(str::to_owned),
            drops: accuracy.breakdown.drops,
        },
        loss: loss_runs,
        soak,
        wall_time_s: started.elapsed().as_secs_f64(),
    };
    let path = out.join(VALIDATION_JSON);
    fs::write(&path, serde_json::to_string_pretty(&validation)? + "\n")?;
    // Written first, so a figure that does not fit its type loses nothing.
    let readme = readme::render_dir(&out)?;
    eprintln!(
        "xtask: validation written to {} in {:.0} s",
        readme.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds everything, starts the mock upstream and the pinned gateway; the bench and the
/// pinning as applied so far.
fn start(args: &Args, work: &Path) -> anyhow::Result<(Bench, Vec<Pin>)> {
    let bins = Binaries::build()?;
    let tracer = build_tracer()?;
    let Served { mock, key, gateway } = procs::start_served(&bins, &args.placement, 0, work)?;
    let (gateway_cpus, load_cpus) = (&args.placement.gateway_cpus, &args.placement.load_cpus);
    let pinning = vec![
        pin("gateway", gateway_cpus, gateway.proc.cpus_allowed()?),
        pin("mock-upstream", load_cpus, mock.proc.cpus_allowed()?),
        pin("loadgen", load_cpus, format!("{load_cpus} (taskset)")),
    ];
    let bench = Bench {
        bins,
        tracer,
        gateway,
        _mock: mock,
        key,
        work: work.to_owned(),
        load_cpus: args.placement.load_cpus.clone(),
        gateway_cpu: flags::first_cpu(&args.placement.gateway_cpus),
        runs: 0,
    };
    Ok((bench, pinning))
}

fn pin(process: &str, asked: &str, applied: String) -> Pin {
    Pin {
        process: process.to_owned(),
        asked: asked.to_owned(),
        applied,
    }
}

/// The accuracy run's figures.
struct AccuracyPart {
    load: Summary,
    breakdown: Breakdown,
    join: accuracy::Accuracy,
    crosscheck: crosscheck::Report,
}

/// Part 2, accuracy (and the cross-check), traced; its breakdown.json is kept in `out`.
fn accuracy_part(
    bench: &mut Bench,
    args: &Args,
    timing: &Timing,
    rate: f64,
    out: &Path,
    pinning: &mut Vec<Pin>,
) -> anyhow::Result<AccuracyPart> {
    let duration = timing.accuracy_s;
    eprintln!("xtask: [2/6] accuracy, {duration} s traced at {rate:.0} req/s");
    let work = bench.work.clone();
    let raw = work.join("raw.events");
    let traced = bench.attach(
        "accuracy",
        &["--raw-events", &path_arg(&raw), "--bpf-stats"],
    )?;
    let applied = traced.tracer.cpus_allowed()?;
    pinning.push(pin("tracer", &args.placement.load_cpus, applied));
    let client_csv = work.join("accuracy-client.csv");
    let load = bench.open_loop(rate, duration, &["--requests-out", &path_arg(&client_csv)]);
    let (breakdown, dir) = traced.stop()?;
    let load = load?;
    let join = bench.accuracy(&client_csv, &dir)?;
    let crosscheck = cross_check(&raw, &breakdown)?;
    let _ = fs::remove_file(&raw);
    fs::copy(
        dir.join("breakdown.json"),
        out.join("accuracy-breakdown.json"),
    )?;
    Ok(AccuracyPart {
        load,
        breakdown,
        join,
        crosscheck,
    })
}

/// Part 3, probe effect: flipping pairs of windows; then what each mode costs, in the same
/// A/B, shorter, per option. The lean windows, their comparison, and the cost-by-mode rows.
fn probe_effect_part(
    bench: &mut Bench,
    args: &Args,
    timing: &Timing,
    rate: f64,
    accuracy: &AccuracyPart,
) -> anyhow::Result<(
    Vec<WindowRecord>,
    session::analysis::ab::Comparison,
    Vec<Mode>,
)> {
    let window = timing.window_s;
    eprintln!(
        "xtask: [3/6] A/B, {} windows of {window} s per arm at {rate:.0} req/s",
        args.windows
    );
    // An untraced settle window, discarded: the accuracy run's tracer exit and the
    // cross-check's read of the raw dump leave the machine busy for a moment.
    bench.open_loop(rate, window.min(5.0), &[])?;
    let windows = bench.ab_windows("ab", &[], rate, args.windows as usize, window)?;
    let comparison = windows_ab::compare(&windows)?;

    // Unreadable: no calibrated probe time, as without one (the README's own read of it
    // names the key that does not fit).
    let calibration = accuracy.breakdown.calibration.as_ref();
    let accuracy_bpf = bpf_ns_per_answered(&accuracy.breakdown, &accuracy.load);
    let mut modes = vec![mode_cost(
        "lean (default)",
        &[],
        &windows,
        calibration,
        accuracy_bpf,
    )];
    let mode_window = timing.mode_window_s;
    let mode_runs = if args.mode_windows == 0 {
        &[][..]
    } else {
        &MODES[..]
    };
    for (name, flags) in mode_runs {
        eprintln!(
            "xtask: [3/6] cost of {name}: {} windows of {mode_window} s per arm",
            args.mode_windows
        );
        let mode_windows = bench.ab_windows(
            &format!("mode-{}", modes.len()),
            flags,
            rate,
            args.mode_windows as usize,
            mode_window,
        )?;
        let bpf = bench.bpf_window(
            &format!("mode-{}-bpf", modes.len()),
            flags,
            rate,
            mode_window,
        )?;
        modes.push(mode_cost(name, flags, &mode_windows, calibration, bpf));
    }
    Ok((windows, comparison, modes))
}

/// The max-throughput searches.
struct MaxPart {
    /// (untraced, traced) of each round.
    searches: Vec<(f64, f64)>,
    /// Medians of the rounds.
    alongside: f64,
    traced: f64,
    /// With the tracepoints alone; None when the modes were skipped.
    floor: Option<f64>,
    last_traced_breakdown: Option<Breakdown>,
}

/// Part 4, max throughput. The machine's level moves within minutes (one tracer read ×0.91 and
/// ×0.45 twenty minutes apart against a single untraced search), so each traced search is
/// paired with an untraced one just before it.
fn max_part(bench: &mut Bench, args: &Args, timing: &Timing) -> anyhow::Result<MaxPart> {
    let find_max_step = timing.find_max_step_s;
    let mut searches = Vec::new();
    let mut last_traced_breakdown = None;
    for round in 1..=MAX_SEARCH_ROUNDS {
        eprintln!(
            "xtask: [4/6] max throughput, round {round} of {MAX_SEARCH_ROUNDS}: untraced, then traced"
        );
        let untraced = bench.find_max(find_max_step)?;
        let traced = bench.attach(&format!("find-max-traced-{round}"), &[])?;
        let max = bench.find_max(find_max_step);
        last_traced_breakdown = Some(traced.stop()?.0);
        searches.push((untraced, max?));
    }
    let alongside = median(searches.iter().map(|s| s.0).collect());
    let traced = median(searches.iter().map(|s| s.1).collect());
    // The floor: the same search with the kernel events alone (no uprobes).
    let floor = if args.mode_windows == 0 {
        None
    } else {
        eprintln!("xtask: [4/6] max throughput, {}", SKIP_SITES.0);
        let traced = bench.attach("find-max-floor", SKIP_SITES.1)?;
        let max = bench.find_max(find_max_step);
        traced.stop()?;
        Some(max?)
    };
    Ok(MaxPart {
        searches,
        alongside,
        traced,
        floor,
        last_traced_breakdown,
    })
}

/// Part 5, loss at the traced max, above it, and with a forced-small ring.
fn loss_part(
    bench: &mut Bench,
    args: &Args,
    timing: &Timing,
    rate: f64,
    max_traced: f64,
) -> anyhow::Result<Vec<LossRun>> {
    let loss_s = timing.loss_s;
    let work = bench.work.clone();
    // At the traced max: a load the traced gateway really carries, so the rate achieved says
    // whether the tracer kept up, not whether the gateway did.
    eprintln!(
        "xtask: [5/6] loss at 100% and 150% of the traced max (each after the same load \
         untraced), and with a {} MiB ring",
        args.forced_ring_mib
    );
    let mut loss_runs = Vec::new();
    let forced_ring = args.forced_ring_mib.to_string();
    let loss_plan: [(&str, f64, Vec<&str>); 3] = [
        ("load-100pct", max_traced, vec![]),
        ("load-150pct", 1.5 * max_traced, vec![]),
        (
            "forced-loss",
            rate,
            vec!["--ring-mib", forced_ring.as_str()],
        ),
    ];
    for (name, loss_rate, extra) in loss_plan {
        // The same open loop untraced just before: what loadgen and the gateway achieve at
        // that rate without the tracer (loadgen shares CPU 1 with mock-upstream and the tracer).
        let untraced = if extra.is_empty() {
            let load = bench.open_loop(loss_rate, loss_s, &[])?;
            Some(Untraced {
                achieved_rate: Some(load.achieved_rate),
                p99_us: Some(load.latency_us.p99),
            })
        } else {
            None
        };
        let traced = bench.attach(name, &extra)?;
        let client_csv = work.join(format!("{name}-client.csv"));
        // The forced-loss run stops the tracer's reader for a while: the kernel keeps
        // writing into the small ring until it is full, then counts every failed reserve.
        let stall = (!extra.is_empty()).then(|| {
            let (signal, after) = (
                traced.tracer.signaller(),
                Duration::from_secs_f64(loss_s / 3.0),
            );
            let stall = Duration::from_secs_f64(args.forced_stall);
            std::thread::spawn(move || {
                std::thread::sleep(after);
                // Our own tracer, not reaped: the main thread stops it only after the load has
                // run, and this thread ends well before.
                if let Err(err) = signal(libc::SIGSTOP) {
                    eprintln!("xtask: stalling the tracer: {err:#}");
                }
                std::thread::sleep(stall);
                if let Err(err) = signal(libc::SIGCONT) {
                    eprintln!("xtask: resuming the tracer: {err:#}");
                }
            })
        });
        let load = bench.open_loop(
            loss_rate,
            loss_s,
            &["--requests-out", &path_arg(&client_csv)],
        );
        if let Some(stall) = stall {
            let _ = stall.join();
        }
        let (breakdown, dir) = traced.stop()?;
        let load = load?;
        let accuracy = bench.accuracy(&client_csv, &dir)?;
        let crossing = complete_requests_crossing_loss(&dir, breakdown.loss_spans.as_deref())?;
        let forced = !extra.is_empty();
        loss_runs.push(LossRun {
            name: name.to_owned(),
            rate: loss_rate,
            of_traced_max: Some(loss_rate / max_traced),
            ring_mib: forced.then_some(args.forced_ring_mib),
            tracer_stopped_s: forced.then_some(args.forced_stall),
            loadgen: load_summary(&load, true),
            untraced,
            events_per_s: breakdown
                .tracer
                .as_ref()
                .map(|t| t.events as f64 / breakdown.duration_s),
            lost_events: breakdown.lost_events,
            requests: breakdown.requests,
            incomplete: breakdown.incomplete,
            incomplete_reasons: breakdown.incomplete_reasons.clone(),
            loss_spans: breakdown.loss_spans.as_ref().map(|s| s.len() as u64),
            complete_crossing_loss: crossing,
            accuracy,
        });
    }

    Ok(loss_runs)
}

/// Part 6, a soak at the load's rate, sampling the tracer's RSS and CPU.
fn soak_part(bench: &mut Bench, soak: f64, rate: f64) -> anyhow::Result<Soak> {
    eprintln!("xtask: [6/6] soak, {soak} s traced at {rate:.0} req/s");
    let traced = bench.attach("soak", &[])?;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (samples, sampling, pid) = (samples.clone(), sampling.clone(), traced.tracer.pid());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut next = Duration::ZERO;
            while sampling.load(Ordering::SeqCst) {
                if t0.elapsed() >= next {
                    samples.lock().expect("sampler lock").push(SoakSample {
                        t_s: t0.elapsed().as_secs_f64(),
                        cpu_s: procstat::cpu_seconds(pid),
                        rss_kib: procstat::status_kib(pid, "VmRSS"),
                        hwm_kib: procstat::status_kib(pid, "VmHWM"),
                    });
                    next += SOAK_SAMPLE;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let soak_load = bench.open_loop(rate, soak, &[]);
    let peak_rss_kib = procstat::status_kib(traced.tracer.pid(), "VmHWM");
    let cpu_at_end = procstat::cpu_seconds(traced.tracer.pid());
    sampling.store(false, Ordering::SeqCst);
    let _ = sampler.join();
    let (soak_breakdown, _) = traced.stop()?;
    let soak_load = soak_load?;
    let samples = std::mem::take(&mut *samples.lock().expect("sampler lock"));
    Ok(Soak {
        seconds: soak,
        rate,
        loadgen: load_summary(&soak_load, true),
        tracer_peak_rss_kib: peak_rss_kib,
        tracer_cpu_s_at_end: cpu_at_end,
        cpu_per_minute: cpu_per_minute(&samples),
        samples,
        requests: soak_breakdown.requests,
        incomplete: soak_breakdown.incomplete,
        lost_events: soak_breakdown.lost_events,
        cost: soak_breakdown.cost,
    })
}

/// What validation keeps of loadgen's summary; `with_p99` where it keeps the tail.
fn load_summary(load: &Summary, with_p99: bool) -> LoadSummary {
    LoadSummary {
        ok: load.ok,
        errors: load.errors.clone(),
        achieved_rate: Some(load.achieved_rate),
        p99_us: with_p99.then_some(load.latency_us.p99),
    }
}

/// What a session's breakdown.json counted.
fn tracer_counts(breakdown: &Breakdown) -> TracerCounts {
    TracerCounts {
        requests: breakdown.requests,
        incomplete: breakdown.incomplete,
        incomplete_reasons: breakdown.incomplete_reasons.clone(),
        lost_events: breakdown.lost_events,
    }
}

/// Complete requests of `dir/requests.csv` whose [t_arrive, t_done] overlaps one of `spans`,
/// breakdown.json's `loss_spans` (must be 0), or None when the tracer did not list its spans.
fn complete_requests_crossing_loss(
    dir: &Path,
    spans: Option<&[[u64; 2]]>,
) -> anyhow::Result<Option<u64>> {
    let Some(spans) = spans else {
        return Ok(None);
    };
    let path = dir.join("requests.csv");
    let file = fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let requests = accuracy::read_traced_csv(file)?;
    let crossing = requests.iter().filter(|r| {
        spans
            .iter()
            .any(|&[from, to]| from <= r.t_done_ns && to >= r.t_arrive_ns)
    });
    Ok(Some(crossing.count() as u64))
}

/// Tracer CPU seconds per minute, from the soak's samples (first to last within each minute).
fn cpu_per_minute(samples: &[SoakSample]) -> Vec<Minute> {
    let points: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t_s, s.cpu_s?)))
        .collect();
    let mut out = Vec::new();
    let mut minute = 0;
    loop {
        let (from, to) = (minute as f64 * 60.0, (minute + 1) as f64 * 60.0);
        let inside: Vec<&(f64, f64)> = points
            .iter()
            .filter(|(t, _)| *t >= from && *t <= to + 0.5)
            .collect();
        let (Some(first), Some(last)) = (inside.first(), inside.last()) else {
            break;
        };
        if last.0 - first.0 > 1.0 {
            out.push(Minute {
                minute,
                cpu_s: last.1 - first.1,
                span_s: last.0 - first.0,
                cpu_share: (last.1 - first.1) / (last.0 - first.0),
            });
        }
        minute += 1;
    }
    out
}

fn command_line(args: &Args) -> String {
    let mut line = format!(
        "cargo xtask validate --load {} --duration {} --windows {} --window {} --mode-windows {} --mode-window {} --loss-duration {} --soak {}",
        args.load,
        args.duration,
        args.windows,
        args.window,
        args.mode_windows,
        args.mode_window,
        args.loss_duration,
        args.soak
    );
    if args.quick {
        line += " --quick";
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked() {
        assert!(flags::seconds("0").is_err() && flags::seconds("300").is_ok());
        assert_eq!(
            (
                flags::first_cpu("0"),
                flags::first_cpu("2-3"),
                flags::first_cpu("1,3")
            ),
            (0, 2, 1)
        );
    }

    #[test]
    fn quick_shortens_every_part() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let args = |extra: &[&str]| {
            Cli::parse_from(
                ["validate", "--duration", "40", "--soak", "600"]
                    .iter()
                    .chain(extra),
            )
            .args
        };
        let full = Timing::of(&args(&[]));
        assert_eq!(
            (full.accuracy_s, full.soak_s, full.find_max_step_s),
            (40.0, 600.0, 2.0)
        );
        let quick = Timing::of(&args(&["--quick"]));
        assert_eq!(
            (quick.accuracy_s, quick.window_s, quick.mode_window_s),
            (5.0, 3.0, 2.0)
        );
        assert_eq!(
            (quick.loss_s, quick.soak_s, quick.find_max_step_s),
            (3.0, 30.0, 1.0)
        );
    }

    fn window(index: u64, cpu: f64, hits: Option<Hits>) -> WindowRecord {
        WindowRecord {
            index,
            arm: session::analysis::ab::arm_of(index as usize),
            p50_us: Some(100.0),
            p99_us: Some(200.0),
            p999_us: Some(300.0),
            max_us: None,
            ok: 1000,
            errors: Default::default(),
            achieved_rate: None,
            gateway_cpu_s: None,
            gateway_cpu_us_per_request: Some(cpu),
            gateway_cpu_share: None,
            cpu0_busy: Some(0.5),
            tracer_cpu_cores: Some(0.05),
            tracer_bpf_ns_per_request: None,
            tracer_lost_events: None,
            tracer_requests: None,
            tracer_hits_per_request: hits,
        }
    }

    #[test]
    fn a_mode_costs_its_medians_and_its_calibrated_hits() {
        let hits = Hits {
            sites: Some(10.0),
            syscalls: Some(4.0),
            sock: Some(2.0),
            sched: Some(6.0),
            samples: Some(0.0),
        };
        // U T T U: untraced 100 and 102, traced 110 and 112.
        let windows = [
            window(0, 100.0, None),
            window(1, 110.0, Some(hits)),
            window(2, 112.0, Some(hits)),
            window(3, 102.0, None),
        ];
        let path = crate::workspace::root().join("profiles/validation-2026-12-02-verdict");
        let recorded: session::validation::Validation =
            crate::workspace::read_json(&path.join(VALIDATION_JSON)).unwrap();
        let mut cal = recorded.calibration.unwrap();
        cal.ns_per_hit = [("site", 100.0), ("syscall", 50.0), ("sock", 10.0)]
            .into_iter()
            .map(|(k, ns)| (k.to_owned(), Some(ns)))
            .chain([("sched".to_owned(), None)])
            .collect();
        let m = mode_cost("lean (default)", &[], &windows, Some(&cal), 5000.0);
        assert_eq!(m.windows_per_arm, 2);
        assert_eq!(m.gateway_cpu_us_per_request.untraced, Some(101.0));
        assert_eq!(m.gateway_cpu_us_per_request.traced, Some(111.0));
        assert_eq!(m.cpu_ratio, Some(111.0 / 101.0));
        // sched is unmeasured: left out of the sum, not a NaN.
        assert_eq!(
            m.probe_ns_per_request,
            Some(10.0 * 100.0 + 4.0 * 50.0 + 2.0 * 10.0)
        );
        assert_eq!(m.hits_per_request, Some(hits));
        assert_eq!(
            mode_cost("x", &[], &windows, None, 0.0).probe_ns_per_request,
            None
        );
        let floor = mode_cost(SKIP_SITES.0, SKIP_SITES.1, &windows, Some(&cal), 1.0);
        assert_eq!(
            (floor.hits_per_request, floor.probe_ns_per_request),
            (None, None)
        );
    }

    #[test]
    fn cpu_per_minute_from_samples() {
        let samples: Vec<SoakSample> = (0..=12)
            .map(|i| SoakSample {
                t_s: i as f64 * 10.0,
                cpu_s: Some(i as f64 * 0.5),
                rss_kib: None,
                hwm_kib: None,
            })
            .collect();
        let minutes = cpu_per_minute(&samples);
        assert_eq!(minutes.len(), 2);
        assert_eq!(minutes[0].cpu_s, 3.0);
        assert_eq!(minutes[1].cpu_share, 0.05);
    }

    #[test]
    fn crossing_loss_spans() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("requests.csv"),
            "request_id,status,t_arrive_ns,t_done_ns\n1,200,100,200\n2,200,300,400\n",
        )
        .unwrap();
        let none = complete_requests_crossing_loss(dir.path(), None).unwrap();
        assert_eq!(none, None);
        let spans = [[150, 160], [500, 600]];
        assert_eq!(
            complete_requests_crossing_loss(dir.path(), Some(&spans)).unwrap(),
            Some(1)
        );
    }
}
