//! `tracer record`: check the target, attach, stream events into the rebuild until Ctrl-C, the
//! duration or the target's exit, then detach and report.

use std::{
    io::{self, Write as _},
    os::fd::{AsFd as _, BorrowedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tracer_ebpf::abi::{Event, kind};

use crate::{
    attach::{Options, Session, detect::Plan, mode::Seed, preflight, target::Target, tracefs},
    audit::hooks::Hooks,
    cli::RecordArgs,
    events::{DEFAULT_WINDOW_NS, EventSink, EventStream, data::Data, monotonic_ns},
    flame::Pictures,
    out_dir::OutDir,
    report::{SessionEnd, SessionMeta, SessionWriter},
    requests::{KernelOnlyRebuilder, Outcome, Rebuilder, SessionRebuilder},
};

/// Exit status of a second Ctrl-C: killed by SIGINT, as a shell reports it.
pub const INTERRUPTED_EXIT: i32 = 128 + SIGINT;

/// SIGINT, SIGTERM and SIGHUP (an ssh drop) store their number here (0: none yet); the main
/// loop looks every drain, at most 10 ms later, and ends the session writing its outputs. A
/// SIGINT once stopping exits at once, writing nothing: the user asked twice. It still
/// unmounts tracefs if this process mounted it (BPF links go with the process's fds).
pub(crate) fn stop_signal() -> anyhow::Result<Arc<AtomicUsize>> {
    let stop = Arc::new(AtomicUsize::new(0));
    let stopping = Arc::new(AtomicBool::new(false));
    let install = |result: std::io::Result<_>| result.context("installing signal handlers");
    // Before the flag is set below: actions run in the order registered, so the first SIGINT
    // finds the flag still clear.
    let asked_twice = stopping.clone();
    // SAFETY: the action is async-signal-safe: an atomic load, then
    // `unmount_from_signal_handler` (an atomic swap and one umount2 syscall) and `_exit`.
    install(unsafe {
        signal_hook::low_level::register(SIGINT, move || {
            if asked_twice.load(Ordering::SeqCst) {
                tracefs::unmount_from_signal_handler();
                signal_hook::low_level::exit(INTERRUPTED_EXIT);
            }
        })
    })?;
    for signal in [SIGINT, SIGTERM, SIGHUP] {
        install(signal_hook::flag::register_usize(
            signal,
            stop.clone(),
            signal as usize,
        ))?;
        install(signal_hook::flag::register(signal, stopping.clone()))?;
    }
    Ok(stop)
}

/// Waits up to `timeout` for the ring or the target; returns true if the target has exited.
pub(crate) fn wait(ring: BorrowedFd<'_>, pidfd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut fds = [
        PollFd::from_borrowed_fd(ring, PollFlags::IN),
        PollFd::from_borrowed_fd(pidfd, PollFlags::IN),
    ];
    let timeout = Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos().into(),
    };
    // An interrupted poll (a stop signal) is a timeout: the loop looks at the flag next.
    poll(&mut fds, Some(&timeout)).is_ok_and(|n| n > 0) && !fds[1].revents().is_empty()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    Signal(i32),
    Duration,
    TargetExited,
}

/// Counts events by kind, for the closing summary and the tests.
#[derive(Debug, Default)]
pub struct Tally {
    pub by_kind: [u64; 16],
    pub loss_spans: u64,
}

impl EventSink for Tally {
    fn push(&mut self, event: &Event) {
        self.by_kind[usize::from(event.kind).min(15)] += 1;
    }

    fn lost(&mut self, _from_ns: u64, _to_ns: u64) {
        self.loss_spans += 1;
    }
}

impl Tally {
    pub fn summary(&self) -> String {
        let names = [
            (kind::SITE, "site"),
            (kind::SYSCALL, "syscall"),
            (kind::SOCK_FD, "sock_fd"),
            (kind::DATA_READY, "data_ready"),
            (kind::ESTABLISHED, "established"),
            (kind::SWITCH_OUT, "switch_out"),
            (kind::SWITCH_IN, "switch_in"),
            (kind::WAKEUP, "wakeup"),
            (kind::SAMPLE, "sample"),
            (kind::TASK_NAME, "task_name"),
        ];
        let parts: Vec<String> = names
            .iter()
            .map(|(k, name)| format!("{name}={}", self.by_kind[usize::from(*k)]))
            .collect();
        parts.join(" ")
    }
}

/// The ordered stream feeds the rebuild; its outcomes go to the session's files (and complete
/// requests to the pictures' spill) as they come.
struct Rebuild {
    rebuilder: SessionRebuilder,
    writer: SessionWriter,
    pictures: Pictures,
    tally: Tally,
    /// Raw dump, loss spans, BPF stats, own cost (issue 6).
    hooks: Hooks,
}

impl EventSink for Rebuild {
    fn push(&mut self, event: &Event) {
        self.tally.push(event);
        self.hooks.push(event);
        self.rebuilder.push(event);
    }

    fn data(&mut self, data: &Data) {
        self.hooks.data(data);
        self.rebuilder.data(data);
    }

    fn lost(&mut self, from_ns: u64, to_ns: u64) {
        self.tally.lost(from_ns, to_ns);
        self.hooks.lost(from_ns, to_ns);
        self.rebuilder.lost(from_ns, to_ns);
    }
}

impl Rebuild {
    fn write(&mut self, outcomes: Vec<Outcome>) -> anyhow::Result<()> {
        for outcome in &outcomes {
            self.writer.write(outcome)?;
            if let Outcome::Complete(record) = outcome {
                self.pictures.push(record)?;
            }
        }
        Ok(())
    }
}

pub fn run(args: &RecordArgs) -> anyhow::Result<()> {
    // Privileges first: without them the first failure is an unreadable /proc/PID/exe, which
    // does not say what to do.
    preflight::check()?;
    // Dropped last, after detach, on every path out.
    let _tracefs = tracefs::UnmountOnDrop;
    let (targets, mode) = crate::attach::mode::open(&args.pid, args.kernel_only)?;
    let kernel_only = mode.is_kernel_only();
    if kernel_only {
        say!("tracer: mode: {mode}");
        for missing in targets.iter().filter_map(Target::missing_sites) {
            say!("tracer: exact mode needs the probe sites: {missing}");
        }
        for (asked, what) in [(args.phases, "--phases"), (args.wait_for, "--wait-for")] {
            if asked {
                say!("tracer: {what} needs the probe sites: ignored in kernel-only mode");
            }
        }
    }
    let Some(first) = targets.first() else {
        anyhow::bail!("no --pid given");
    };
    let pid = first.pid.get();
    let out = OutDir::open(&args.out, args.overwrite)?;
    let stop = stop_signal()?;
    // Opened by Target::open before it checked the pid: readable once the target has exited.
    let pidfd = first.pidfd.clone();

    let options = Options {
        sample_hz: args.sample_hz,
        ring_bytes: args.ring_mib << 20,
        stack_entries: args.stack_entries,
        offcpu_stacks: args.offcpu_stacks,
        phases: args.phases && !kernel_only,
        skip: args.skip.clone(),
        empty_programs: args.empty_programs,
    };
    let plan = Plan::new(args.attach)?;
    // Before attaching, so the target's probes do not run during the calibration loops. It
    // measures the probe sites' cost, which a kernel-only session does not pay.
    let calibration = crate::calibrate::before_attach(args.no_calibrate || kernel_only, &plan)?;
    let mut session = Session::attach_mode(&targets, &mode, &options, &plan)?;
    let wait_for = args.wait_for && !kernel_only;
    let mode = match (kernel_only, wait_for) {
        (true, _) => format!("{} + kernel-only", options.mode()),
        (false, true) => format!("{} + wait-for", options.mode()),
        (false, false) => options.mode(),
    };
    say!("tracer: mode {mode}");
    if options.empty_programs {
        say!(
            "tracer: --empty-programs: the hooks are attached but their programs return at once; \
             this session measures cost only and records nothing"
        );
    } else if !options.skip.is_empty() {
        say!("tracer: --skip: this session measures cost only; its requests will not rebuild");
    }
    for mode in &session.modes {
        say!("tracer: attach {mode}");
    }
    for warning in plan.warnings() {
        say!("{warning}");
    }
    // A fallback only when detection chose kprobes for attached syscalls, not when asked for.
    if plan.choice == crate::attach::detect::Choice::Auto
        && options.attaches(crate::attach::Group::Syscalls)
        && let Some(warning) = crate::attach::syscalls::fallback_warning(plan.syscalls)
    {
        say!("{warning}");
    }
    let mut stream = EventStream::new(
        session.take_events()?,
        options.ring_bytes,
        session.take_loss()?,
        DEFAULT_WINDOW_NS,
    );
    // Taken now so that they outlive detach: the pictures resolve stack ids at the very end.
    let stacks = session.take_stacks()?;
    let drops = session.take_drops()?;
    let mut meta = SessionMeta {
        pid,
        record_args: std::env::args().collect(),
        ..SessionMeta::default()
    };
    for mode in &session.modes {
        meta.attach_modes
            .insert(mode.group.to_owned(), mode.mode.to_owned());
    }
    meta.attach_modes.insert("mode".to_owned(), mode);
    meta.attach_modes
        .insert("attach".to_owned(), plan.choice.as_str().to_owned());
    let detected = &plan.detected;
    for (kind, availability) in [
        ("fentry", &detected.fentry),
        ("kprobe", &detected.kprobe),
        ("syscall_tracepoints", &detected.syscall_tracepoints),
        ("sock_tracepoints", &detected.sock_tracepoints),
        ("sched_raw_tracepoints", &detected.sched_raw_tracepoints),
        ("sock_netns", &detected.sock_netns),
    ] {
        meta.attach_modes
            .insert(kind.to_owned(), availability.to_string());
    }
    let mut sink = Rebuild {
        rebuilder: match (kernel_only, wait_for) {
            (true, _) => SessionRebuilder::KernelOnly(KernelOnlyRebuilder::new()),
            (false, true) => SessionRebuilder::Exact(Rebuilder::new().with_wait_for()),
            (false, false) => SessionRebuilder::Exact(Rebuilder::new()),
        },
        writer: SessionWriter::create(&out, meta)?,
        pictures: Pictures::start(&Seed::tgids(&targets), &out, wait_for, args.sample_hz)?,
        tally: Tally::default(),
        hooks: Hooks::start(
            args.raw_events.as_deref(),
            args.raw_data.as_deref(),
            args.overwrite,
            session.program_ids(),
            args.bpf_stats,
        )?,
    };

    // The ready line (xtask profile and the tests wait for it): printed once everything that
    // runs before the loop is done, so load started after it is traced from its first request.
    let ids: Vec<String> = session.program_ids().iter().map(u32::to_string).collect();
    say!("tracer: program ids {}", ids.join(","));
    // Attached: from here on the tracer only reads, and that can wait for others.
    stream.priority.run_idle()?;
    let started = Instant::now();
    let mut last_report = (Instant::now(), 0u64, 0u64);
    let reason = loop {
        let exited = wait(stream.ring_fd(), pidfd.as_fd(), Duration::from_millis(10));
        stream.pump(&mut sink)?;
        let outcomes = sink.rebuilder.drain();
        sink.write(outcomes)?;
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
            let events = stream.counters.events;
            let aggregate = sink.writer.aggregate();
            let requests = aggregate.requests() + aggregate.incomplete();
            say!(
                "tracer: {:>6.1}s  {:>7.0} req/s  p99 overhead {:>8.1} us  {:>8.0} events/s  \
                 lost {}  incomplete {}",
                started.elapsed().as_secs_f64(),
                (requests - last_report.2) as f64 / seconds,
                aggregate.overhead_quantile_ns(0.99) as f64 / 1e3,
                (events - last_report.1) as f64 / seconds,
                stream.lost_events(),
                aggregate.incomplete(),
            );
            last_report = (Instant::now(), events, requests);
        }
    };
    let traced_s = started.elapsed().as_secs_f64();

    let detaching = Instant::now();
    sink.hooks.before_detach();
    // Read before detach (the programs close with it); a failure costs this count only.
    let recursion_misses = session.recursion_misses();
    let kretprobe_missed = session.kretprobe_missed();
    session.detach();
    let detach_s = detaching.elapsed().as_secs_f64();
    stream.finish(&mut sink)?;
    let outcomes = sink.rebuilder.finish(monotonic_ns());
    sink.write(outcomes)?;

    let why = match reason {
        StopReason::Signal(signal) => format!("signal {signal}"),
        StopReason::Duration => "duration reached".to_owned(),
        StopReason::TargetExited => format!("pid {pid} exited"),
    };
    say!(
        "tracer: stopped ({why}) after {traced_s:.1}s, detached in {detach_s:.1}s; {} events \
         and {} data records ({} lost, {} late, {} malformed)",
        stream.counters.events,
        stream.counters.data,
        stream.lost_events(),
        stream.late_events(),
        stream.counters.malformed,
    );
    say!("tracer: events {}", sink.tally.summary());
    if let SessionRebuilder::KernelOnly(r) = &sink.rebuilder {
        say!("tracer: kernel-only {}", r.summary());
        sink.writer.set_kernel_only(r.to_model());
    }
    let (user_s, system_s) = crate::audit::cost::own_cpu_seconds();
    say!("tracer: own cpu {user_s:.2}s user + {system_s:.2}s system");
    let (behind_s, spells) = stream.priority.behind();
    if spells > 0 {
        say!(
            "tracer: the reader was behind for {behind_s:.1}s in {spells} spell(s), at normal \
             priority then"
        );
    }
    let kernel_drops = crate::events::drops::read(&drops)?;
    let unclaimed = sink.rebuilder.established_unclaimed();
    if kernel_drops.tids_full + kernel_drops.in_flight_full > 0 {
        say!(
            "tracer: WARNING kernel maps full: {} thread adds and {} syscall enters dropped; \
             requests that needed them are incomplete",
            kernel_drops.tids_full,
            kernel_drops.in_flight_full,
        );
    }
    if kernel_drops.stack_failed > 0 {
        // Ids are hashes of the frames: only a full STACKS map or a failed walk loses one.
        say!(
            "tracer: {} stacks not taken (STACKS full, or not walkable); \
             those samples and switch-outs are drawn as {}",
            kernel_drops.stack_failed,
            crate::flame::fold::NO_STACK,
        );
    }
    if unclaimed > 0 {
        say!(
            "tracer: WARNING {unclaimed} connections reached the listening port(s) and were never \
             served by the target (not accepted before the session ended, another process on the \
             same port, or another network namespace where the match is by port alone)"
        );
    }
    let evicted = crate::events::drops::target_socks_evicted_at_least(&kernel_drops);
    if evicted > 0 {
        say!(
            "tracer: WARNING at least {evicted} sockets were evicted from the kernel's set of the \
             target's sockets (more open at once than it holds); their data arrivals until the \
             next read were not seen"
        );
    }
    let mut drops_json = crate::events::drops::to_model(&kernel_drops);
    drops_json.established_unclaimed = unclaimed;
    if let Some(warning) = crate::events::drops::add_kretprobe_missed(
        &mut drops_json,
        kretprobe_missed.as_deref().map_err(String::as_str),
    ) {
        say!("{warning}");
    }
    match &recursion_misses {
        Ok(misses) => {
            if let Some(warning) =
                crate::events::drops::add_recursion_misses(&mut drops_json, misses)
            {
                say!("{warning}");
            }
        }
        Err(err) => {
            drops_json.recursion_misses = Some(None);
            say!("tracer: WARNING the programs' recursion misses could not be read: {err:#}");
        }
    }
    sink.writer.set_drops(drops_json);
    sink.writer.set_tracer(session::breakdown::TracerCounters {
        stop_reason: why.to_string(),
        events: stream.counters.events,
        late_events: stream.late_events(),
        loss_spans: sink.tally.loss_spans,
        reader_behind_s: Some(behind_s),
        cpu_user_s: user_s,
        cpu_system_s: system_s,
    });
    sink.hooks.finish(&sink.rebuilder, &mut sink.writer)?;
    let probe_cost = crate::calibrate::report(calibration.as_ref(), &mut sink.writer);
    let summary = sink.writer.finish(SessionEnd {
        duration_s: traced_s,
        lost_events: stream.lost_events(),
    })?;
    let drawing = Instant::now();
    let no_names = std::collections::HashMap::new();
    let pictures = sink.pictures.finish(
        &summary.bands,
        &stacks,
        sink.rebuilder.task_names().unwrap_or(&no_names),
    )?;
    say!(
        "tracer: pictures of {} requests ({} tail, {} median band; {} samples, {} in the tail) \
         drawn in {:.1}s",
        pictures.requests,
        pictures.tail.requests,
        pictures.median_band.requests,
        pictures.all_samples,
        pictures.tail.samples,
        drawing.elapsed().as_secs_f64(),
    );
    // The files are written; a closed stdout loses only this copy of the table.
    let mut stdout = io::stdout().lock();
    let _ = writeln!(stdout, "{}", summary.table);
    if let Some(probe_cost) = probe_cost {
        let _ = writeln!(stdout, "{probe_cost}");
    }
    Ok(())
}
