//! `cargo xtask profile`: one whole tail session at a fraction of max load, with its own
//! probe effect.
//!
//! mock-upstream, a demo ledger in a temp dir and the gateway (pinned to its CPUs) are
//! started, or with `--target nginx|haproxy|caddy` that proxy from Debian's package in front of
//! mock-upstream, pinned the same and traced kernel-only (`target`); `loadgen --find-max`
//! measures the max rate; a short untraced open-loop warm-up
//! runs at the target rate. Then the probe effect: windows of the same open loop in flipping
//! pairs, the tracer attached with the session's own flags in the traced ones only
//! (`probe-effect.json`). Then the session: the tracer attaches (its calibration and attach
//! happen before any traced load), loadgen runs the measured open loop, and the tracer is
//! stopped after the last response. The session directory gets the tracer's files
//! (breakdown, requests, flamegraphs, trace.json), loadgen's summaries and a README.md
//! written from them.

mod compare;
mod effect;
mod phases;
mod readme;
mod target;

use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};

use session::effect::ProbeEffect;

use crate::ab::{self, Traced};
use crate::machine::Machine;
use crate::procs::{self, Binaries, TracerProc, run_loadgen};
use crate::workspace::read_json;
use crate::{flags, session_dir};
use target::Target;

/// Files the tracer must leave in the session directory.
const TRACER_FILES: [&str; 10] = [
    "breakdown.json",
    "requests.csv",
    "tail-oncpu.folded",
    "tail-oncpu.svg",
    "all-oncpu.folded",
    "all-oncpu.svg",
    "median-oncpu.folded",
    "tail-diff.svg",
    "trace.json",
    "pictures.json",
];
/// And those of `--wait-for`, which the session passes where the target has it.
const WAIT_FOR_FILES: [&str; 2] = ["tail-wait.folded", "tail-wait.svg"];
/// Keep-alive connections of the open loop (one per in-flight request). Little's law sets the
/// floor: 25% of a 5 ms-upstream max (~6500 req/s) keeps ~50 requests in flight, and a run
/// that runs out of connections queues in loadgen instead of measuring the gateway.
const CONNECTIONS: u64 = 128;

#[derive(clap::Args)]
pub struct Args {
    /// The server to load and trace: the gateway, or one of Debian's proxies (installed with
    /// apt-get when missing) in front of mock-upstream, traced kernel-only.
    #[arg(long, default_value = "gateway", value_parser = target::parser())]
    target: Target,
    /// Fraction of the measured max throughput to run the session at (0 < load ≤ 1.5).
    #[arg(long, default_value_t = 0.25, value_parser = flags::fraction(1.5))]
    load: f64,
    /// mock-upstream's delay per request, in ms.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    delay_ms: u64,
    /// Traced open-loop seconds.
    #[arg(long, default_value_t = 30.0, value_parser = flags::seconds)]
    duration: f64,
    #[command(flatten)]
    placement: flags::Placement,
    #[command(flatten)]
    output: flags::Output,
    /// Skip the search and use this max rate (req/s), e.g. to repeat a session.
    #[arg(long, value_parser = rate)]
    max_rate: Option<f64>,
    /// Seconds per `--find-max` step (each step also warms up for half that, at most 1 s).
    #[arg(long, default_value_t = 2.0, value_parser = flags::seconds)]
    find_max_step: f64,
    /// Untraced open-loop warm-up at the target rate before the tracer attaches, in s.
    #[arg(long, default_value_t = 3.0, value_parser = flags::seconds)]
    warmup: f64,
    /// The tracer's cpu-clock sampling rate, on the gateway's CPUs. Each sample is a timer
    /// interrupt and two stack walks there, paid by the gateway: 999 Hz costs it measurably
    /// more CPU per request than 299 Hz (docs/probe-effect.md).
    #[arg(long, default_value_t = 299, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    sample_hz: u64,
    /// Probe-effect windows per arm (traced, untraced), in flipping pairs before the session.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(2..=100))]
    ab_windows: u64,
    /// Seconds of each probe-effect window.
    #[arg(long, default_value_t = 6.0, value_parser = flags::seconds)]
    ab_window: f64,
    /// Also attach the `phase` probe site: exact per-phase on-CPU parts, at ~9 more uprobe
    /// traps a request.
    #[arg(long)]
    phases: bool,
    /// Also take stacks at every switch-out (tail-offcpu.svg), at a stack walk each.
    #[arg(long)]
    offcpu_stacks: bool,
    /// Also turn on the kernel's BPF run-time statistics (~50 ns a program run).
    #[arg(long)]
    bpf_stats: bool,
    /// Load with no `x-request-id` header, as most clients do (`loadgen --no-request-id`: each
    /// id stays in the body only), in every loadgen run of the session.
    #[arg(long)]
    no_request_id: bool,
    /// An earlier session directory: the Reading sets this tail's ranking of parts and its
    /// waits behind other processes beside that session's.
    #[arg(long, value_name = "DIR")]
    compare: Option<PathBuf>,
}

fn rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("expected a positive rate in req/s, got {text}")),
    }
}

/// What the README needs to say about how the session ran, beside the session's own files:
/// written as profile.json, so the README can be rendered again from the directory alone.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionFacts {
    /// What the session traced; left out for the gateway (every session before `--target`).
    #[serde(default, skip_serializing_if = "Target::is_gateway")]
    pub target: Target,
    /// The target's version as it reports it (`nginx -v`); left out for the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    pub command: String,
    pub load: f64,
    pub delay_ms: u64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub workers: u64,
    pub connections: u64,
    /// `--no-request-id`: loadgen sent no x-request-id; false in every session before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_request_id: bool,
    pub max_rate: f64,
    pub max_rate_source: String,
    pub target_rate: f64,
    pub pinning: Vec<(String, String, String)>,
    pub machine: Machine,
    /// `--compare`: the link to the earlier session's README, relative to this one (its
    /// tail is read from the files beside it).
    pub compare: Option<String>,
}

/// `ensure_toolchain` installs the eBPF toolchain the tracer's build needs when it is missing
/// (xtask's `setup::ensure`), after the cheap checks of the flags and the privilege prompt.
pub fn run(
    args: Args,
    ensure_toolchain: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    // Checked before anything runs, so a bad flag or --compare costs nothing.
    check_target_flags(&args)?;
    if let Some(dir) = &args.compare {
        compare::TailFacts::read(dir)
            .with_context(|| format!("--compare {}: not a session directory", dir.display()))?;
    }
    crate::privilege::Runner::detect().authorize("cargo xtask profile")?;
    // `cargo build -p tracer` below needs the eBPF toolchain; a fresh machine gets it here.
    ensure_toolchain()?;
    let started = Instant::now();
    // Before anything is built or started: the commit measured, and the load average the
    // session started from.
    let machine = crate::machine::collect();
    let out = (args.output).prepare(&default_name(&args))?;
    let work = tempfile::Builder::new()
        .prefix("xtask-profile-")
        .tempdir()?;
    let logs = work.path();

    let bins = Binaries::build()?;
    let tracer_bin = procs::cargo_build_release(&["-p", "tracer", "--bins"])?.find("tracer")?;
    let load_cpus = Some(args.placement.load_cpus.as_str());

    let target::Server {
        mock,
        target: procs::Listener { proc: server, url },
        client,
        version: target_version,
    } = target::start(args.target, &bins, &args.placement, args.delay_ms, logs)?;
    let client = client_flags(client, &args);
    let loadgen = |extra: &[String], timeout: Duration| -> anyhow::Result<()> {
        let mut all = vec!["--url".to_owned(), url.clone()];
        all.extend_from_slice(&client);
        all.extend_from_slice(extra);
        run_loadgen(&bins, load_cpus, &all, timeout, logs)
    };

    let (max_rate, max_rate_source) = match args.max_rate {
        Some(max) => (max, "given with --max-rate".to_owned()),
        None => {
            eprintln!("xtask: searching the max rate (loadgen --find-max)");
            let find_max = out.join("find-max.json");
            let step = args.find_max_step;
            loadgen(
                &strings(&[
                    "--find-max",
                    "--duration",
                    &step.to_string(),
                    "--warmup",
                    &(step / 2.0).min(1.0).to_string(),
                    "--out",
                    &path_arg(&find_max),
                ]),
                Duration::from_secs(300),
            )?;
            let found: session::loadgen::FindMax = read_json(&find_max)?;
            (
                found.max_rate,
                "`loadgen --find-max` (find-max.json)".to_owned(),
            )
        }
    };
    ensure!(
        max_rate > 0.0,
        "the max rate is 0: {} served nothing",
        args.target.the()
    );
    let target_rate = args.load * max_rate;
    eprintln!(
        "xtask: max {max_rate:.0} req/s → target {target_rate:.0} req/s ({:.0}%)",
        args.load * 100.0
    );

    let open_loop = |duration: f64, extra: &[&str]| {
        let mut flags = strings(&[
            "--rate",
            &format!("{target_rate:.3}"),
            "--duration",
            &duration.to_string(),
            "--connections",
            &CONNECTIONS.to_string(),
        ]);
        flags.extend(strings(extra));
        flags
    };
    eprintln!(
        "xtask: untraced warm-up, {} s at the target rate",
        args.warmup
    );
    loadgen(
        &open_loop(args.warmup, &["--warmup", "0"]),
        Duration::from_secs_f64(args.warmup + 60.0),
    )?;

    let tracer_flags = tracer_flags(&args);
    let effect = {
        let mut arms = EffectArms {
            tracer: &tracer_bin,
            flags: &tracer_flags,
            pid: server.pid(),
            tracer_cpus: tracer_cpus(&args),
            work: work.path(),
            run: &|seconds: f64, summary: &Path| {
                loadgen(
                    &open_loop(seconds, &["--warmup", "0", "--out", &path_arg(summary)]),
                    Duration::from_secs_f64(seconds + 60.0),
                )
            },
        };
        eprintln!(
            "xtask: probe effect, {} traced and {} untraced windows of {} s",
            args.ab_windows, args.ab_windows, args.ab_window
        );
        let windows = ab::windows(
            &mut arms,
            server.pid(),
            flags::first_cpu(&args.placement.gateway_cpus),
            args.ab_windows as usize,
            args.ab_window,
        )?;
        probe_effect(windows, &tracer_flags, &args, target_version.clone())?
    };
    fs::write(
        out.join(readme::PROBE_EFFECT_JSON),
        serde_json::to_string_pretty(&effect)? + "\n",
    )?;

    let mut tracer = start_tracer(&tracer_bin, &tracer_flags, &args, server.pid(), &out, logs)?;
    let pinning = vec![
        (
            args.target.name().to_owned(),
            args.placement.gateway_cpus.clone(),
            server.cpus_allowed()?,
        ),
        (
            "mock-upstream".to_owned(),
            args.placement.load_cpus.clone(),
            mock.proc.cpus_allowed()?,
        ),
        (
            "tracer".to_owned(),
            tracer_cpus(&args).map_or_else(|| "all".to_owned(), str::to_owned),
            tracer.cpus_allowed()?,
        ),
        (
            "loadgen".to_owned(),
            args.placement.load_cpus.clone(),
            format!("{} (taskset)", args.placement.load_cpus),
        ),
    ];

    eprintln!(
        "xtask: traced open loop, {} s at {target_rate:.0} req/s",
        args.duration
    );
    let follow = follow_log(&logs.join("tracer.log"));
    let client_csv = work.path().join("loadgen-requests.csv");
    let traced = loadgen(
        &open_loop(
            args.duration,
            &[
                "--warmup",
                "0",
                "--out",
                &path_arg(&out.join("loadgen.json")),
                "--requests-out",
                &path_arg(&client_csv),
            ],
        ),
        Duration::from_secs_f64(args.duration + 120.0),
    );
    let stopped = tracer.stop();
    follow.store(false, Ordering::SeqCst);
    traced?;
    stopped?;

    let wait_for = tracer_flags.iter().any(|flag| flag == "--wait-for");
    let wait_files = WAIT_FOR_FILES.iter().filter(|_| wait_for);
    for file in TRACER_FILES.iter().chain(wait_files) {
        ensure!(
            out.join(file).exists(),
            "the tracer left no {file} in {}{}",
            out.display(),
            tracer.proc.log_tail()
        );
    }

    let facts = SessionFacts {
        target: args.target,
        target_version,
        command: command_line(&args),
        load: args.load,
        delay_ms: args.delay_ms,
        duration_s: args.duration,
        warmup_s: args.warmup,
        workers: args.placement.workers,
        connections: CONNECTIONS,
        no_request_id: args.no_request_id,
        max_rate,
        max_rate_source,
        target_rate,
        pinning,
        machine,
        compare: (args.compare.as_deref()).map(|dir| relative_link(&out, &dir.join("README.md"))),
    };
    let readme = readme::write(&out, &facts)?;
    compress_requests_csv(&out)?;
    eprintln!(
        "xtask: session written to {} in {:.0} s",
        readme.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

/// loadgen's flags that reach the target (`target::Server::client`) and say how every run
/// loads it, find-max, warm-up and probe-effect windows included.
fn client_flags(mut client: Vec<String>, args: &Args) -> Vec<String> {
    if args.no_request_id {
        client.push("--no-request-id".to_owned());
    }
    client
}

/// The gateway's own flags, refused with a proxy: `--phases` needs its probe sites and
/// `--workers` sets its tokio workers.
fn check_target_flags(args: &Args) -> anyhow::Result<()> {
    if args.target.kernel_only() {
        let name = args.target.name();
        ensure!(
            !args.phases,
            "--phases needs the gateway's probe sites; {name} is traced kernel-only"
        );
        ensure!(
            args.placement.workers == 1,
            "--workers sets the gateway's tokio workers; {name} runs as its configuration says"
        );
    }
    Ok(())
}

/// The session directory's default name: `25pct-0ms` for the gateway, `nginx-25pct-0ms`.
fn default_name(args: &Args) -> String {
    let name = format!("{}pct-{}ms", (args.load * 100.0).round(), args.delay_ms);
    match args.target {
        Target::Gateway => name,
        proxy => format!("{}-{name}", proxy.name()),
    }
}

/// The command that reproduces the session, as the README shows it.
fn command_line(args: &Args) -> String {
    let mut line = "cargo xtask profile".to_owned();
    if args.target.kernel_only() {
        line += &format!(" --target {}", args.target.name());
    }
    line += &format!(
        " --load {} --delay-ms {} --duration {}",
        args.load, args.delay_ms, args.duration
    );
    if !args.target.kernel_only() {
        line += &format!(" --workers {}", args.placement.workers);
    }
    if args.find_max_step != 2.0 {
        line += &format!(" --find-max-step {}", args.find_max_step);
    }
    if args.warmup != 3.0 {
        line += &format!(" --warmup {}", args.warmup);
    }
    if let Some(max) = args.max_rate {
        line += &format!(" --max-rate {max}");
    }
    if args.sample_hz != 299 {
        line += &format!(" --sample-hz {}", args.sample_hz);
    }
    if (args.ab_windows, args.ab_window) != (8, 6.0) {
        line += &format!(
            " --ab-windows {} --ab-window {}",
            args.ab_windows, args.ab_window
        );
    }
    for (on, flag) in [
        (args.no_request_id, " --no-request-id"),
        (args.phases, " --phases"),
        (args.offcpu_stacks, " --offcpu-stacks"),
        (args.bpf_stats, " --bpf-stats"),
    ] {
        if on {
            line += flag;
        }
    }
    if let Some(dir) = &args.compare {
        line += &format!(" --compare {}", dir.display());
    }
    if let Some(out) = &args.output.out {
        line += &format!(" --out {}", out.display());
    }
    line
}

/// `to` as seen from directory `from` (both made absolute), for a README link.
fn relative_link(from: &Path, to: &Path) -> String {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
    let (from, to) = (absolute(from), absolute(to));
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let ups = from.components().count() - common;
    let mut link: PathBuf = std::iter::repeat_n("..", ups).collect();
    link.extend(to.components().skip(common));
    link.display().to_string()
}

/// The session's `tracer record` flags beyond `--pid` and `--out`: the probe-effect windows
/// run the very same ones. The default is the lean set plus what the tail pictures need at
/// little cost to the gateway: more samples (on the gateway's CPUs only) and the wait-for
/// view (in the tracer process; it charges waits to the probe sites' requests, so a proxy,
/// traced kernel-only, goes without); the costlier sources only when asked for.
fn tracer_flags(args: &Args) -> Vec<String> {
    let mut flags = strings(&["--sample-hz", &args.sample_hz.to_string()]);
    if !args.target.kernel_only() {
        flags.push("--wait-for".to_owned());
    }
    for (on, flag) in [
        (args.phases, "--phases"),
        (args.offcpu_stacks, "--offcpu-stacks"),
        (args.bpf_stats, "--bpf-stats"),
    ] {
        if on {
            flags.push(flag.to_owned());
        }
    }
    flags
}

/// The probe-effect windows' harness: the session's tracer, the session's open loop.
struct EffectArms<'a> {
    tracer: &'a Path,
    flags: &'a [String],
    pid: u32,
    tracer_cpus: Option<&'a str>,
    work: &'a Path,
    /// Runs one window of the open loop, its summary written to the path.
    run: &'a dyn Fn(f64, &Path) -> anyhow::Result<()>,
}

impl ab::Arms for EffectArms<'_> {
    fn attach(&mut self, index: usize) -> anyhow::Result<Traced> {
        let dir = self.work.join(format!("effect-{index}"));
        session_dir::for_tracer(&dir)?;
        // The tracer's log is already in it.
        let mut flags = strings(&[
            "record",
            "--pid",
            &self.pid.to_string(),
            "--out",
            &path_arg(&dir),
            "--overwrite",
        ]);
        flags.extend_from_slice(self.flags);
        // The session measures the calibration once; the windows skip its loops.
        flags.push("--no-calibrate".to_owned());
        let tracer = procs::start_tracer(self.tracer, self.tracer_cpus, &flags, &dir)?;
        Ok(Traced { tracer, dir })
    }

    fn open_loop(&mut self, seconds: f64) -> anyhow::Result<session::loadgen::Summary> {
        let summary = self.work.join("effect-loadgen.json");
        let _ = fs::remove_file(&summary);
        (self.run)(seconds, &summary)?;
        read_json(&summary)
    }
}

/// probe-effect.json: the windows, and the traced/untraced ratios computed from them.
fn probe_effect(
    windows: Vec<session::validation::WindowRecord>,
    tracer_flags: &[String],
    args: &Args,
    target_version: Option<String>,
) -> anyhow::Result<ProbeEffect> {
    Ok(ProbeEffect {
        target: args.target,
        target_version,
        tracer_flags: tracer_flags.to_vec(),
        windows_per_arm: args.ab_windows,
        window_s: args.ab_window,
        comparison: crate::ab::compare(&windows)?,
        windows,
    })
}

/// Starts `tracer record` on the load CPUs and waits until every program is attached.
fn start_tracer(
    bin: &Path,
    tracer_flags: &[String],
    args: &Args,
    pid: u32,
    out: &Path,
    logs: &Path,
) -> anyhow::Result<TracerProc> {
    // The session directory already holds find-max.json and probe-effect.json; --overwrite
    // lets the tracer add its files beside them (session_dir checked it was ours to fill).
    session_dir::for_tracer(out)?;
    let mut flags = strings(&[
        "record",
        "--pid",
        &pid.to_string(),
        "--out",
        &path_arg(out),
        "--overwrite",
    ]);
    flags.extend_from_slice(tracer_flags);
    eprintln!("xtask: attaching the tracer to pid {pid}");
    procs::start_tracer(bin, tracer_cpus(args), &flags, logs)
}

/// Where the tracer runs: beside the load for the gateway (as every gateway session ran). A
/// proxy at 25% of its own max is loaded with several times the gateway's rate, which keeps
/// the load's CPUs busy; the tracer (SCHED_IDLE, which any other task preempts) then also
/// takes the idle time of the proxy's CPUs, or the kernel-only data fills the ring.
fn tracer_cpus(args: &Args) -> Option<&str> {
    match args.target {
        Target::Gateway => Some(&args.placement.load_cpus),
        _ => None,
    }
}

/// Echoes new lines of `path` (the tracer's live progress) to stderr until the flag drops.
fn follow_log(path: &Path) -> Arc<AtomicBool> {
    let running = Arc::new(AtomicBool::new(true));
    let flag = running.clone();
    let path = path.to_owned();
    std::thread::spawn(move || {
        let mut offset = 0u64;
        let mut pending = String::new();
        while flag.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(250));
            let Ok(mut file) = fs::File::open(&path) else {
                continue;
            };
            if file.seek(SeekFrom::Start(offset)).is_err() {
                continue;
            }
            let mut fresh = String::new();
            if let Ok(read) = file.read_to_string(&mut fresh) {
                offset += read as u64;
                pending += &fresh;
                while let Some(end) = pending.find('\n') {
                    eprintln!("  │ {}", &pending[..end]);
                    pending.drain(..=end);
                }
            }
        }
    });
    running
}

/// requests.csv is ~10 MB for 30 s; the session keeps it gzipped (`gzip -n`: no timestamp,
/// so the same rows give the same bytes).
fn compress_requests_csv(out: &Path) -> anyhow::Result<()> {
    let csv = out.join("requests.csv");
    let _ = fs::remove_file(out.join("requests.csv.gz"));
    let status = Command::new("gzip")
        .args(["-9", "-n"])
        .arg(&csv)
        .status()
        .context("running gzip")?;
    ensure!(status.success(), "gzip {} failed ({status})", csv.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_compared_session_is_linked_relative_to_this_one() {
        assert_eq!(
            relative_link(
                Path::new("/r/profiles/new"),
                Path::new("/r/profiles/old/README.md")
            ),
            "../old/README.md"
        );
        assert_eq!(
            relative_link(Path::new("/tmp/s"), Path::new("/r/p/README.md")),
            "../../r/p/README.md"
        );
    }

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(line: &[&str]) -> Result<Args, clap::Error> {
        use clap::Parser as _;
        Cli::try_parse_from(std::iter::once("profile").chain(line.iter().copied()))
            .map(|cli| cli.args)
    }

    #[test]
    fn the_target_defaults_to_the_gateway_whose_command_line_is_as_before() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.target, Target::Gateway);
        assert_eq!(
            command_line(&args),
            "cargo xtask profile --load 0.25 --delay-ms 0 --duration 30 --workers 1"
        );
        assert_eq!(default_name(&args), "25pct-0ms");
        assert_eq!(tracer_flags(&args), ["--sample-hz", "299", "--wait-for"]);
        check_target_flags(&parse(&["--phases", "--workers", "2"]).unwrap()).unwrap();
        let explicit = parse(&["--target", "gateway"]).unwrap();
        assert_eq!(command_line(&explicit), command_line(&args));
    }

    #[test]
    fn each_proxy_is_a_target() {
        for (name, target) in [
            ("nginx", Target::Nginx),
            ("haproxy", Target::Haproxy),
            ("caddy", Target::Caddy),
        ] {
            let args = parse(&["--target", name, "--delay-ms", "5"]).unwrap();
            assert_eq!(args.target, target);
            check_target_flags(&args).unwrap();
            assert_eq!(
                command_line(&args),
                format!(
                    "cargo xtask profile --target {name} --load 0.25 --delay-ms 5 --duration 30"
                )
            );
            assert_eq!(default_name(&args), format!("{name}-25pct-5ms"));
            assert_eq!(tracer_flags(&args), ["--sample-hz", "299"]);
        }
    }

    #[test]
    fn no_request_id_reaches_every_loadgen_run_and_the_command_line() {
        let direct = || vec!["--direct".to_owned()];
        for target in ["gateway", "nginx", "caddy"] {
            let args = parse(&["--target", target]).unwrap();
            assert!(!args.no_request_id);
            assert_eq!(client_flags(direct(), &args), ["--direct"]);
            assert!(!command_line(&args).contains("--no-request-id"));

            let args = parse(&["--target", target, "--no-request-id"]).unwrap();
            assert!(args.no_request_id);
            check_target_flags(&args).unwrap();
            assert_eq!(
                client_flags(direct(), &args),
                ["--direct", "--no-request-id"]
            );
            assert!(
                command_line(&args).ends_with(" --duration 30 --no-request-id")
                    || command_line(&args).ends_with(" --workers 1 --no-request-id"),
                "{}",
                command_line(&args)
            );
            assert_eq!(
                tracer_flags(&args),
                tracer_flags(&parse(&["--target", target]).unwrap())
            );
        }
        assert!(parse(&["--no-request-id=yes"]).is_err());
    }

    #[test]
    fn a_bad_target_names_the_possible_ones() {
        let err = parse(&["--target", "apache"]).err().unwrap().to_string();
        assert!(
            err.contains("invalid value 'apache' for '--target <TARGET>'"),
            "{err}"
        );
        assert!(
            err.contains("[possible values: gateway, nginx, haproxy, caddy]"),
            "{err}"
        );
        assert!(parse(&["--target", "Nginx"]).is_err());
        assert!(parse(&["--target"]).is_err());
    }

    #[test]
    fn the_gateways_own_flags_are_refused_with_a_proxy() {
        let err = check_target_flags(&parse(&["--target", "nginx", "--phases"]).unwrap());
        assert!(
            format!("{:#}", err.unwrap_err()).contains("--phases needs the gateway's probe sites"),
        );
        let err = check_target_flags(&parse(&["--target", "caddy", "--workers", "2"]).unwrap());
        assert!(format!("{:#}", err.unwrap_err()).contains("--workers"));
    }

    #[test]
    fn flags_are_checked() {
        assert!(flags::fraction(1.5)("1.5").is_ok() && flags::fraction(1.5)("2").is_err());
        assert!(
            flags::seconds("0").is_err()
                && flags::seconds("inf").is_err()
                && flags::seconds("30").is_ok()
        );
        assert!(rate("0").is_err() && rate("1200.5").is_ok());
    }
}
