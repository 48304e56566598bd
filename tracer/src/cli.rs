//! Command line: `tracer record --pid PID [--pid PID...] [--kernel-only] [--duration S]
//! [--out DIR] [--sample-hz N] [--ring-mib M]`.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

use crate::attach::{Group, detect::Choice};

#[derive(Parser, Debug)]
#[command(
    name = "tracer",
    about = "Attach to a running gateway and split every request's overhead"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Trace a running gateway until Ctrl-C, the duration, or the gateway's exit.
    Record(RecordArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct RecordArgs {
    /// The process to trace: the gateway's pid (exact mode), or a proxy's without probe sites
    /// (kernel-only mode: nginx's master, haproxy, caddy, Apache's parent; its child processes
    /// are followed).
    /// Repeatable in kernel-only mode.
    #[arg(long, required = true, num_args = 1)]
    pub pid: Vec<u32>,
    /// Trace in kernel-only mode even a process that has the probe sites: no uprobes; the
    /// requests are found in the bytes of the data syscalls. A process without the sites is
    /// traced this way anyway.
    #[arg(long)]
    pub kernel_only: bool,
    /// Stop after this many seconds (decimals allowed); default: until Ctrl-C or the target exits.
    #[arg(long, value_parser = parse_duration, allow_negative_numbers = true)]
    pub duration: Option<Duration>,
    /// Directory for requests.csv and breakdown.json: created if missing; an existing one must
    /// be yours, writable only by you, and empty (see --overwrite).
    #[arg(long, default_value = "tracer-out")]
    pub out: PathBuf,
    /// Record into a non-empty --out, replacing the files this session writes there (and an
    /// earlier session's --raw-events dump); other files stay.
    #[arg(long)]
    pub overwrite: bool,
    /// cpu-clock sampling frequency of the gateway's threads (two stack walks a sample);
    /// 0 turns sampling off.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub sample_hz: u64,
    /// Ring buffer size in MiB, a power of two. The default holds ~9 s of events at
    /// 150k events/s, so a reader stall at 25% load loses nothing.
    #[arg(long, default_value_t = 64, value_parser = parse_ring_mib)]
    pub ring_mib: u32,
    /// Distinct stacks the session keeps (kernel and user alike); a new stack past that many is
    /// not taken, and counted (breakdown.json's `drops.stack_failed`).
    #[arg(long, default_value_t = tracer_ebpf::abi::STACK_ENTRIES, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub stack_entries: u32,
    /// Take kernel and user stacks at every switch-out of a gateway thread (off-CPU flamegraphs).
    #[arg(long)]
    pub offcpu_stacks: bool,
    /// Attach the `phase` probe site too: on-CPU time split by phase (`cpu.<phase>`) instead
    /// of one `cpu` part, at ~9 more site hits per request.
    #[arg(long)]
    pub phases: bool,
    /// Charge each request's waits to what held the CPU instead (tail-wait.svg/.folded and
    /// pictures.json's `wait`, `wait_all`). No more events, but the tracer's own CPU nearly
    /// doubles (measured at 25% load).
    #[arg(long)]
    pub wait_for: bool,
    /// Also write every event read, 40 bytes each after a header line, to this file (for
    /// validate's cross-check). Kernel-only mode's DATA records are not in it (see --raw-data);
    /// its PROCESS events are.
    #[arg(long)]
    pub raw_events: Option<PathBuf>,
    /// Kernel-only mode: also write every DATA record, in timestamp order, to this file as the
    /// kernel wrote it, after a header line (`tracer_ebpf::abi::DataEvent`, 560 bytes each; read
    /// back with `tracer::events::data::read_dump`). For tests and for replaying a capture.
    #[arg(long, hide = true)]
    pub raw_data: Option<PathBuf>,
    /// How to hook syscalls and sockets: `auto` takes fentry, else kprobes, else tracepoints;
    /// any other value forces that kind and fails, saying why, if this kernel lacks it. The
    /// scheduler is always tracepoints, the probe sites uprobes.
    #[arg(long, value_enum, default_value_t = Choice::Auto)]
    pub attach: Choice,
    /// Turn on the kernel's BPF run-time statistics for the session: each program's runs and
    /// run time in breakdown.json's `cost`. They add two clock reads to every program run
    /// (~50 ns here), so they are off by default.
    #[arg(long)]
    pub bpf_stats: bool,
    /// Leave a group of hooks unattached (repeatable), to measure what the rest costs, as
    /// `cargo xtask validate`'s floor rows do. The split needs every group, so such a session
    /// only measures cost: its requests do not rebuild.
    #[arg(long, value_enum, value_name = "GROUP")]
    pub skip: Vec<Group>,
    /// Attach every hook as usual, but let each program return at once: the session measures
    /// what the uprobe traps and the tracepoint dispatch cost on their own (validate's
    /// "hooks only" floor row), and records nothing.
    #[arg(long)]
    pub empty_programs: bool,
    /// Skip the probe-cost calibration (~1-2 s before attaching) and its breakdown.json section.
    #[arg(long)]
    pub no_calibrate: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds (for example 30 or 2.5)"))?;
    if !seconds.is_finite() || seconds <= 0.0 || seconds > 7.0 * 24.0 * 3600.0 {
        return Err(format!(
            "duration must be more than 0 s and at most a week, got {text}"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn parse_ring_mib(text: &str) -> Result<u32, String> {
    let mib: u32 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number of MiB"))?;
    if !mib.is_power_of_two() || mib > 2048 {
        return Err(format!(
            "ring size must be a power of two between 1 and 2048 MiB, got {mib}"
        ));
    }
    Ok(mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2.5").unwrap(), Duration::from_millis(2500));
        for bad in ["abc", "0", "-1", "inf", "NaN", ""] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ring_sizes() {
        assert_eq!(parse_ring_mib("64").unwrap(), 64);
        for bad in ["0", "3", "4096", "x"] {
            assert!(parse_ring_mib(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn record_defaults() {
        let cli = Cli::parse_from(["tracer", "record", "--pid", "1"]);
        let Command::Record(args) = cli.command;
        assert_eq!((args.pid, args.sample_hz, args.ring_mib), (vec![1], 99, 64));
        assert!(!args.kernel_only);
        assert!(!args.phases && !args.offcpu_stacks && !args.wait_for && !args.empty_programs);
        assert_eq!(args.duration, None);
        assert_eq!(args.attach, Choice::Auto);
    }

    #[test]
    fn several_pids_and_kernel_only() {
        let cli = Cli::parse_from([
            "tracer",
            "record",
            "--pid",
            "10",
            "--pid",
            "20",
            "--kernel-only",
        ]);
        let Command::Record(args) = cli.command;
        assert_eq!(args.pid, vec![10, 20]);
        assert!(args.kernel_only);
        // At least one; one value per --pid.
        assert!(Cli::try_parse_from(["tracer", "record"]).is_err());
        assert!(Cli::try_parse_from(["tracer", "record", "--pid", "1", "2"]).is_err());
        assert!(Cli::try_parse_from(["tracer", "record", "--pid", "x"]).is_err());
    }

    #[test]
    fn attach_modes() {
        let cli = Cli::parse_from(["tracer", "record", "--pid", "1", "--attach", "kprobe"]);
        let Command::Record(args) = cli.command;
        assert_eq!(args.attach, Choice::Kprobe);
        assert!(Cli::try_parse_from(["tracer", "record", "--pid", "1", "--attach", "x"]).is_err());
    }
}
