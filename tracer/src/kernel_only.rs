//! `tracer record` in kernel-only mode (issue 20): attach to every target process without
//! probe sites, stream the events and DATA records in timestamp order into
//! [`KernelOnlySink`], and report what was captured.
//!
//! **The rebuild of requests from the DATA records is not here yet.** Until it is, a session
//! counts what it captured, writes the raw dumps it was asked for (`--raw-events`: the 40-byte
//! events, PROCESS included; `--raw-data`: every DATA record), writes nothing to `--out`, and
//! exits non-zero saying so. The integrator plugs the rebuild in at [`KernelOnlySink`]: its
//! `data` gets every [`Data`] and its `push` every event (PROCESS forks and exits, sched,
//! sockets, samples), one ordered stream, in `exit_ns` / `ts_ns` order; `lost` the loss spans.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufWriter, Write as _},
    os::fd::AsFd as _,
    path::Path,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tracer_ebpf::abi::{Event, kind};

use crate::{
    attach::{Mode, Options, Session, detect::Plan, target::Target},
    audit::hooks::Hooks,
    cli::RecordArgs,
    events::{DEFAULT_WINDOW_NS, EventSink, EventStream, data::Data},
    out_dir::OutDir,
    record::{StopReason, Tally, stop_signal, wait, yield_cpu_to_others},
};

/// `--raw-data`: every DATA record as the kernel wrote it (`events::data::read_dump`).
struct DataDump {
    out: BufWriter<File>,
    written: u64,
    error: Option<std::io::Error>,
}

impl DataDump {
    fn create(path: &Path, overwrite: bool) -> anyhow::Result<DataDump> {
        let file = crate::out_dir::create_file_at(path, overwrite)?;
        Ok(DataDump {
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
            error: None,
        })
    }

    fn write(&mut self, data: &Data) {
        if self.error.is_some() {
            return;
        }
        match self
            .out
            .write_all(crate::events::data::encode(&data.to_event()))
        {
            Ok(()) => self.written += 1,
            Err(e) => self.error = Some(e),
        }
    }

    fn finish(mut self) -> anyhow::Result<u64> {
        if let Some(e) = self.error.take() {
            return Err(e).context("writing --raw-data");
        }
        self.out.flush().context("flushing --raw-data")?;
        Ok(self.written)
    }
}

/// What the DATA records held, per process.
#[derive(Debug, Default)]
pub struct DataTally {
    pub records: u64,
    /// Records whose `bytes` hold all the syscall moved.
    pub whole: u64,
    pub bytes_moved: u64,
    pub bytes_captured: u64,
    /// Records by tgid.
    pub by_process: BTreeMap<u32, u64>,
}

impl DataTally {
    fn push(&mut self, data: &Data) {
        self.records += 1;
        self.whole += u64::from(data.whole());
        self.bytes_moved += data.len;
        self.bytes_captured += data.bytes.len() as u64;
        *self.by_process.entry(data.tgid).or_default() += 1;
    }
}

/// The ordered stream of a kernel-only session. **The kernel-only rebuild goes here**: give
/// it a field, feed it from `push` and `data` (and `lost`), and drain/write its outcomes in
/// [`run`]'s loop where the exact mode's `Rebuild` writes its own.
pub struct KernelOnlySink {
    pub tally: Tally,
    pub data: DataTally,
    /// PROCESS sub 0: (child pid, parent tgid, whether the kernel could not tell it from a
    /// thread), in order.
    pub forks: Vec<(u32, u32, bool)>,
    /// PROCESS sub 1: the pids of target processes that exited.
    pub exits: Vec<u32>,
    hooks: Hooks,
    raw_data: Option<DataDump>,
}

impl EventSink for KernelOnlySink {
    fn push(&mut self, event: &Event) {
        self.tally.push(event);
        self.hooks.push(event);
        if event.kind == kind::PROCESS {
            match event.sub {
                0 => self
                    .forks
                    .push((event.tid, event.args[0] as u32, event.args[1] != 0)),
                _ => self.exits.push(event.tid),
            }
        }
    }

    fn data(&mut self, data: &Data) {
        self.data.push(data);
        if let Some(dump) = &mut self.raw_data {
            dump.write(data);
        }
    }

    fn lost(&mut self, from_ns: u64, to_ns: u64) {
        self.tally.lost(from_ns, to_ns);
        self.hooks.lost(from_ns, to_ns);
    }
}

impl KernelOnlySink {
    /// One line: the DATA records per process, the forks followed and exits seen.
    pub fn summary(&self) -> String {
        let processes: Vec<String> = self
            .data
            .by_process
            .iter()
            .map(|(tgid, n)| format!("{tgid}:{n}"))
            .collect();
        let forks: Vec<String> = self
            .forks
            .iter()
            .map(|(child, parent, maybe_thread)| {
                format!(
                    "{child}<-{parent}{}",
                    if *maybe_thread {
                        "(maybe a thread)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        let exits: Vec<String> = self.exits.iter().map(u32::to_string).collect();
        format!(
            "data {} records ({} whole; {} bytes moved, {} captured) by process [{}]; \
             forks followed [{}]; exits [{}]",
            self.data.records,
            self.data.whole,
            self.data.bytes_moved,
            self.data.bytes_captured,
            processes.join(" "),
            forks.join(" "),
            exits.join(" "),
        )
    }
}

/// Runs a kernel-only session on `targets` (opened and checked by `attach::mode::open`).
pub fn run(args: &RecordArgs, targets: &[Target], mode: &Mode) -> anyhow::Result<()> {
    let Some(first) = targets.first() else {
        bail!("no --pid given");
    };
    // Checked now, as exact mode does; the kernel-only rebuild will write its files there.
    let _out = OutDir::open(&args.out, args.overwrite)?;
    let stop = stop_signal()?;
    let pidfd = first.pidfd.clone();
    let options = Options {
        sample_hz: args.sample_hz,
        ring_bytes: args.ring_mib << 20,
        stack_entries: args.stack_entries,
        offcpu_stacks: args.offcpu_stacks,
        phases: false,
        skip: args.skip.clone(),
        empty_programs: args.empty_programs,
    };
    if args.phases {
        say!("tracer: --phases needs the probe sites: ignored in kernel-only mode");
    }
    if !args.no_calibrate {
        say!("tracer: no probe-cost calibration in kernel-only mode (it measures the sites')");
    }
    let plan = Plan::new(args.attach)?;
    let mut session = Session::attach_mode(targets, mode, &options, &plan)?;
    say!("tracer: mode {} + kernel-only", options.mode());
    for attached in &session.modes {
        say!("tracer: attach {attached}");
    }
    for warning in plan.warnings() {
        say!("{warning}");
    }
    if plan.choice == crate::attach::detect::Choice::Auto
        && options.attaches(crate::attach::Group::Syscalls)
        && let Some(warning) = crate::attach::syscalls::fallback_warning(plan.syscalls)
    {
        say!("{warning}");
    }
    let mut stream = EventStream::new(
        session.take_events()?,
        session.take_loss()?,
        DEFAULT_WINDOW_NS,
    );
    let drops = session.take_drops()?;
    let mut sink = KernelOnlySink {
        tally: Tally::default(),
        data: DataTally::default(),
        forks: Vec::new(),
        exits: Vec::new(),
        hooks: Hooks::start(
            args.raw_events.as_deref(),
            args.overwrite,
            session.program_ids(),
            args.bpf_stats,
        )?,
        raw_data: args
            .raw_data
            .as_deref()
            .map(|path| DataDump::create(path, args.overwrite))
            .transpose()?,
    };
    // The ready line, as in exact mode.
    let ids: Vec<String> = session.program_ids().iter().map(u32::to_string).collect();
    say!("tracer: program ids {}", ids.join(","));
    yield_cpu_to_others()?;
    let started = Instant::now();
    let mut last_report = (Instant::now(), 0u64, 0u64);
    let reason = loop {
        let exited = wait(stream.ring_fd(), pidfd.as_fd(), Duration::from_millis(10));
        stream.pump(&mut sink)?;
        let signal = stop.load(Ordering::SeqCst);
        if signal != 0 {
            say!("tracer: stopping (signal {signal}); Ctrl-C again exits at once, writing nothing");
            break StopReason::Signal(signal as i32);
        }
        if exited {
            break StopReason::TargetExited;
        }
        if args.duration.is_some_and(|d| started.elapsed() >= d) {
            break StopReason::Duration;
        }
        if last_report.0.elapsed() >= Duration::from_secs(1) {
            let seconds = last_report.0.elapsed().as_secs_f64();
            let (events, data) = (stream.counters.events, stream.counters.data);
            say!(
                "tracer: {:>6.1}s  {:>8.0} events/s  {:>8.0} data/s  lost {}",
                started.elapsed().as_secs_f64(),
                (events - last_report.1) as f64 / seconds,
                (data - last_report.2) as f64 / seconds,
                stream.lost_events(),
            );
            last_report = (Instant::now(), events, data);
        }
    };
    let traced_s = started.elapsed().as_secs_f64();
    sink.hooks.before_detach();
    session.detach();
    stream.finish(&mut sink)?;
    let why = match reason {
        StopReason::Signal(signal) => format!("signal {signal}"),
        StopReason::Duration => "duration reached".to_owned(),
        StopReason::TargetExited => format!("pid {} exited", first.pid),
    };
    say!(
        "tracer: stopped ({why}) after {traced_s:.1}s; {} events and {} data records ({} lost, \
         {} late, {} malformed)",
        stream.counters.events,
        stream.counters.data,
        stream.lost_events(),
        stream.late_events(),
        stream.counters.malformed,
    );
    say!("tracer: events {}", sink.tally.summary());
    say!("tracer: kernel-only {}", sink.summary());
    let kernel_drops = crate::events::drops::read(&drops)?;
    if kernel_drops.tids_full + kernel_drops.in_flight_full > 0 {
        say!(
            "tracer: WARNING kernel maps full: {} thread or process adds and {} syscall enters \
             dropped",
            kernel_drops.tids_full,
            kernel_drops.in_flight_full,
        );
    }
    if let Some(n) = sink.hooks.finish_raw()? {
        say!("tracer: --raw-events: {n} events written");
    }
    if let Some(dump) = sink.raw_data.take() {
        let n = dump.finish()?;
        say!("tracer: --raw-data: {n} data records written");
    }
    bail!(
        "kernel-only mode: the rebuild of requests from the captured data is not implemented yet \
         (issue 20); nothing was written to {}",
        args.out.display()
    )
}
