//! `tracer record`: check the target, attach, stream events into the rebuild until Ctrl-C, the
//! duration or the target's exit, then detach and report.

use std::{
    fs,
    os::fd::RawFd,
    sync::atomic::{AtomicI32, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tracer_ebpf::abi::{Event, kind};
use tracer_ebpf::sites::Site;

use crate::{
    attach::{Options, Session, preflight, target::Target},
    cli::RecordArgs,
    events::{DEFAULT_WINDOW_NS, EventSink, EventStream},
};

/// The signal that asked us to stop, or 0.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
}

/// SIGINT/SIGTERM set a flag; no SA_RESTART, so the poll in the main loop returns at once.
fn install_stop_handlers() -> anyhow::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an atomic.
        let result = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_stop_signal as *const () as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if result != 0 {
            return Err(std::io::Error::last_os_error()).context("installing signal handlers");
        }
    }
    Ok(())
}

/// A pidfd: readable once the target has exited.
fn pidfd_open(pid: u32) -> anyhow::Result<RawFd> {
    // SAFETY: plain syscall, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("pidfd_open({pid})"));
    }
    Ok(fd as RawFd)
}

/// Waits up to `timeout` for the ring or the target; returns true if the target has exited.
fn wait(ring_fd: RawFd, pidfd: RawFd, timeout: Duration) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: ring_fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: pidfd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout.as_millis() as libc::c_int) };
    ready > 0 && fds[1].revents != 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Signal(i32),
    Duration,
    TargetExited,
}

/// Counts events by kind until the rebuild consumes them.
#[derive(Debug, Default)]
pub struct Tally {
    pub by_kind: [u64; 16],
    pub request_ends: u64,
    pub loss_spans: u64,
}

impl EventSink for Tally {
    fn push(&mut self, event: &Event) {
        self.by_kind[usize::from(event.kind).min(15)] += 1;
        if event.kind == kind::SITE && event.sub == Site::RequestEnd as u16 {
            self.request_ends += 1;
        }
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
        ];
        let parts: Vec<String> = names
            .iter()
            .map(|(k, name)| format!("{name}={}", self.by_kind[usize::from(*k)]))
            .collect();
        parts.join(" ")
    }
}

pub fn run(args: &RecordArgs) -> anyhow::Result<()> {
    let target = Target::open(args.pid)?;
    preflight::check()?;
    fs::create_dir_all(&args.out)
        .with_context(|| format!("creating output directory {}", args.out.display()))?;
    install_stop_handlers()?;
    let pidfd = pidfd_open(args.pid)?;

    let options = Options {
        sample_hz: args.sample_hz,
        ring_bytes: args.ring_mib << 20,
        offcpu_stacks: args.offcpu_stacks,
    };
    let mut session = Session::attach(&target, &options)?;
    for mode in &session.modes {
        eprintln!("tracer: attach {mode}");
    }
    let ids: Vec<String> = session.program_ids().iter().map(u32::to_string).collect();
    eprintln!("tracer: program ids {}", ids.join(","));
    let mut stream = EventStream::new(
        session.take_events()?,
        session.take_loss()?,
        DEFAULT_WINDOW_NS,
    );
    let mut sink = Tally::default();

    let started = Instant::now();
    let mut last_report = (Instant::now(), 0u64, 0u64);
    let reason = loop {
        let exited = wait(stream.ring_fd(), pidfd, Duration::from_millis(10));
        stream.pump(&mut sink)?;
        let signal = STOP_SIGNAL.load(Ordering::SeqCst);
        if signal != 0 {
            break StopReason::Signal(signal);
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
            eprintln!(
                "tracer: {:>6.1}s  {:>7.0} req/s  p99 overhead n/a  {:>8.0} events/s  lost {}",
                started.elapsed().as_secs_f64(),
                (sink.request_ends - last_report.2) as f64 / seconds,
                (events - last_report.1) as f64 / seconds,
                stream.lost_events(),
            );
            last_report = (Instant::now(), events, sink.request_ends);
        }
    };

    session.detach();
    stream.finish(&mut sink)?;
    // SAFETY: our own fd, closed once.
    unsafe { libc::close(pidfd) };

    let why = match reason {
        StopReason::Signal(signal) => format!("signal {signal}"),
        StopReason::Duration => "duration reached".to_owned(),
        StopReason::TargetExited => format!("pid {} exited", args.pid),
    };
    eprintln!(
        "tracer: stopped ({why}) after {:.1}s, detached; {} events ({} lost, {} late, {} malformed)",
        started.elapsed().as_secs_f64(),
        stream.counters.events,
        stream.lost_events(),
        stream.late_events(),
        stream.counters.malformed,
    );
    eprintln!("tracer: events {}", sink.summary());
    Ok(())
}
