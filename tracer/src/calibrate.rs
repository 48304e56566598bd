//! Probe-cost calibration: before `tracer record` attaches to the target, measure what one hit
//! of each probe kind costs on this kernel, from loops in the tracer's own process, with the
//! same kernel programs the session uses (loaded a second time, filtering on our own pid).
//!
//! Each kind is timed (CLOCK_MONOTONIC) in 3..=5 untraced rounds (fewer when the CPU is busy
//! and the loops run slow), then as many traced ones, on one pinned CPU: the highest CPU this
//! process may run on, which keeps it off the gateway's CPU 0 when xtask pins the tracer to
//! CPU 1. A round's time is its lower-quartile chunk (of 20..200 loop units) scaled to the
//! loop, so chunks in which another task ran do not count. Round i's cost per hit = (traced −
//! untraced ns per loop unit) × traced units / events the traced round wrote; the reported
//! cost is the median round, flagged `noisy` when the rounds spread over half of it. A median
//! at or below zero (the traced arm ran faster: another task swamped the rounds) measures
//! nothing: that kind is `unmeasured`, its rounds' range kept for the record, and it is left out
//! of the probe time per request. A busy CPU makes every figure rough (other tasks' cache and
//! TLB traffic land in both arms).
//! Includes what the target pays for the hook itself: the uprobe trap, and the syscall slow
//! path that any attached syscall tracepoint turns on.
//!
//! | kind | loop unit | untraced arm | traced arm adds | a hit is |
//! |---|---|---|---|---|
//! | site | a call of the NOP5 function [`tracer_calibration_site`] | nothing attached | `site_poll_enter` uprobe | a SITE event |
//! | syscall | `write(/dev/null, 1 byte)` | nothing attached | `sys_{enter,exit}_write` | a SYSCALL event (an enter + exit pair) |
//! | sock | a 1-byte `send` on a connected socket pair + `recv` at the peer | `sys_{enter,exit}_{sendto,recvfrom}` | `sock_send_length`, `sk_data_ready`, `sock_recv_length` | a SOCK_FD or DATA_READY event |
//!
//! The syscall and sock kinds use the session's mode ([`Plan`]): the table names the
//! tracepoints; with fentry or kprobes they are the same programs' fentry/fexit or
//! kprobe/kretprobe variants (on `__x64_sys_write`; `tcp_sendmsg`, `sock_def_readable`,
//! `tcp_recvmsg`). The sock pair is AF_UNIX for tracepoints (they fire for every family, and
//! no softirq sits between send and receive) and loopback TCP otherwise (those functions are
//! TCP's).
//! | sched | a context switch: two threads on one CPU `sched_yield` to each other | nothing attached | `sched_switch` (raw or classic, as the session's) | a SWITCH_OUT or SWITCH_IN event |
//!
//! A sock hit carries the runs that emit nothing (send and receive with a known fd): in this
//! loop two per DATA_READY, as in a gateway request (client receive and response send, upstream
//! send and receive, two data-ready). A sched hit is half a `sched_switch` run that emits two
//! events (both tasks are ours); a switch to or from a task of another process emits one.
//! Context switches are counted with `getrusage(RUSAGE_THREAD)`, so a yield that did not switch
//! is not charged. Not covered: cpu-clock samples, and the filter-only runs that every other
//! task on the machine pays while the tracepoints are attached.
//!
//! Per request, probe ns = Σ kind hits × ns per hit, with the rebuild's mean hit counts (a
//! ledger batch's writer hits are charged once, to its first durable request, so the mean
//! spreads them over the batch).

use std::{
    fs::File,
    num::NonZeroU32,
    os::fd::OwnedFd,
    path::PathBuf,
    sync::{Arc, Barrier},
    time::Instant,
};

use anyhow::{Context as _, bail, ensure};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{
        UProbe,
        uprobe::{UProbeLinkId, UProbeScope},
    },
};
use rustix::{
    net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType},
    thread::{self, CpuSet},
};
use session::stats::median;
use tracer_ebpf::abi::{Config, LOSS_SLOT, Loss, kind};

use crate::{
    aggregate::HitsPerRequest,
    attach::{
        self,
        detect::Plan,
        hooks::{self, Kind},
        sockets, syscalls, tracefs,
    },
    events::{decode::decode, monotonic_ns},
    report::SessionWriter,
};

/// Untraced, then as many traced, rounds per kind; the median round is reported.
pub const ROUNDS: usize = 5;
/// On a busy CPU the loops slow down: after this many rounds, stop once the untraced rounds
/// have taken [`UNTRACED_BUDGET_MS`], so calibration stays near 2 s.
pub const MIN_ROUNDS: usize = 3;
const UNTRACED_BUDGET_MS: u128 = 150;
// Loop sizes (multiples of their chunks). Each chunk is timed on its own and an arm's time is
// its lower-quartile chunk scaled to the loop: a chunk in which another task ran is an
// outlier, not a cost (the machine is shared; the gateway and load generator may be running).
const SITE_CALLS: u64 = 20_000;
const SITE_CHUNK: u64 = 200;
const WRITES: u64 = 20_000;
const WRITE_CHUNK: u64 = 100;
const SOCK_ROUND_TRIPS: u64 = 4_000;
const SOCK_CHUNK: u64 = 20;
/// Per thread; two threads.
const YIELDS: u64 = 8_000;
const YIELD_CHUNK: u64 = 20;
/// A sched round with fewer context switches than this measures nothing. Under emulation as
/// few as 6% of the 2 × [`YIELDS`] yields switch (~980).
const MIN_SWITCHES: u64 = 200;
/// Holds every event of one traced arm (the largest writes ~40k events of 48 bytes).
const RING_BYTES: u32 = 8 << 20;

/// The probe site the calibration hits: the same NOP5-and-ret body as the gateway's sites.
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn tracer_calibration_site(_a0: u64, _a1: u64, _a2: u64) {
    core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret")
}
const SITE_SYMBOL: &str = "tracer_calibration_site";
const SITE_PROGRAM: &str = "site_poll_enter";

/// One timed loop.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Arm {
    /// The lower-quartile chunk's ns × chunks in the loop.
    pub elapsed_ns: u64,
    /// Loop iterations, or context switches for sched.
    pub units: u64,
}

impl Arm {
    fn ns_per_unit(&self) -> f64 {
        self.elapsed_ns as f64 / self.units.max(1) as f64
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Round {
    pub untraced: Arm,
    pub traced: Arm,
    /// Events of this kind the traced arm wrote to the ring.
    pub events: u64,
}

impl Round {
    /// ns one event added, or `None` when the traced arm wrote none or ran no unit.
    pub fn ns_per_hit(&self) -> Option<f64> {
        if self.events == 0 || self.traced.units == 0 || self.untraced.units == 0 {
            return None;
        }
        let added_per_unit = self.traced.ns_per_unit() - self.untraced.ns_per_unit();
        Some(added_per_unit * self.traced.units as f64 / self.events as f64)
    }
}

/// One kind's rounds and their median.
#[derive(Clone, Debug, PartialEq)]
pub struct KindCost {
    pub rounds: Vec<Round>,
    /// The median round's cost; `None` (unmeasured) when that is not above zero, since a probe
    /// cannot make its target faster.
    pub ns_per_hit: Option<f64>,
    pub min_ns: f64,
    pub max_ns: f64,
    /// Median untraced ns per loop unit, for scale.
    pub untraced_ns_per_unit: f64,
    /// Median events per traced unit (1 for site and syscall, ~1 for sock, ~2 for sched).
    pub hits_per_unit: f64,
}

impl KindCost {
    pub fn from_rounds(rounds: Vec<Round>) -> anyhow::Result<KindCost> {
        let costs: Vec<f64> = rounds.iter().filter_map(Round::ns_per_hit).collect();
        if costs.len() != rounds.len() || costs.is_empty() {
            bail!("a traced round wrote no event (the probe did not fire)");
        }
        let untraced: Vec<f64> = rounds.iter().map(|r| r.untraced.ns_per_unit()).collect();
        let per_unit: Vec<f64> = rounds
            .iter()
            .map(|r| r.events as f64 / r.traced.units.max(1) as f64)
            .collect();
        let median_cost = median(&costs);
        Ok(KindCost {
            ns_per_hit: median_cost.filter(|ns| *ns > 0.0),
            min_ns: costs.iter().copied().fold(f64::INFINITY, f64::min),
            max_ns: costs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            untraced_ns_per_unit: median(&untraced).unwrap_or(0.0),
            hits_per_unit: median(&per_unit).unwrap_or(0.0),
            rounds,
        })
    }

    /// Rounds disagree by more than half the median: the machine was busy, so the figure is a
    /// rough one (said next to it, never hidden). An unmeasured kind has no figure to flag.
    pub fn is_noisy(&self) -> bool {
        self.ns_per_hit
            .is_some_and(|ns| self.max_ns - self.min_ns > 0.5 * ns)
    }

    /// `sched 41`, `sched 41 (noisy: rounds 40..90)` or `sock unmeasured (rounds -290..1841)`.
    fn label(&self, name: &str) -> String {
        match self.ns_per_hit {
            None => format!(
                "{name} unmeasured (rounds {:.0}..{:.0})",
                self.min_ns, self.max_ns
            ),
            Some(ns) if self.is_noisy() => format!(
                "{name} {ns:.0} (noisy: rounds {:.0}..{:.0})",
                self.min_ns, self.max_ns
            ),
            Some(ns) => format!("{name} {ns:.0}"),
        }
    }
}

/// The loop's time from its chunks' times: the lower-quartile chunk × the number of chunks.
/// Not the mean: a chunk in which another task ran measures that task.
pub fn robust_elapsed_ns(chunk_ns: &[u64], chunks_per_loop: u64) -> u64 {
    let mut sorted = chunk_ns.to_vec();
    sorted.sort_unstable();
    let quartile = sorted.get(sorted.len() / 4).copied().unwrap_or(0);
    quartile * chunks_per_loop
}

/// Runs `step` `units` times, timing every `chunk` steps.
fn timed_chunks(
    units: u64,
    chunk: u64,
    mut step: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Arm> {
    let chunks = units / chunk;
    let mut chunk_ns = Vec::with_capacity(chunks as usize);
    for _ in 0..chunks {
        let start = monotonic_ns();
        for _ in 0..chunk {
            step()?;
        }
        chunk_ns.push(monotonic_ns() - start);
    }
    Ok(Arm {
        elapsed_ns: robust_elapsed_ns(&chunk_ns, chunks),
        units: chunks * chunk,
    })
}

#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    pub cpu: usize,
    pub elapsed_s: f64,
    pub site: KindCost,
    pub syscall: KindCost,
    pub sock: KindCost,
    pub sched: KindCost,
}

/// Probe ns added to a mean request, per kind: hits × ns per hit; `None` for an unmeasured
/// kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerRequest {
    pub sites: Option<f64>,
    pub syscalls: Option<f64>,
    pub sock: Option<f64>,
    pub sched: Option<f64>,
}

impl PerRequest {
    fn kinds(&self) -> [(&'static str, Option<f64>); 4] {
        [
            ("sites", self.sites),
            ("syscalls", self.syscalls),
            ("sock", self.sock),
            ("sched", self.sched),
        ]
    }

    /// The measured kinds' sum: an unmeasured kind is left out, not counted as zero.
    pub fn total(&self) -> f64 {
        self.kinds().iter().filter_map(|(_, ns)| *ns).sum()
    }

    /// The kinds [`PerRequest::total`] leaves out.
    pub fn left_out(&self) -> Vec<&'static str> {
        self.kinds()
            .iter()
            .filter(|(_, ns)| ns.is_none())
            .map(|(name, _)| *name)
            .collect()
    }
}

impl Calibration {
    pub fn per_request(&self, hits: &HitsPerRequest) -> PerRequest {
        PerRequest {
            sites: self.site.ns_per_hit.map(|ns| hits.sites * ns),
            syscalls: self.syscall.ns_per_hit.map(|ns| hits.syscalls * ns),
            sock: self.sock.ns_per_hit.map(|ns| hits.sock * ns),
            sched: self.sched.ns_per_hit.map(|ns| hits.sched * ns),
        }
    }

    fn kinds(&self) -> [(&'static str, &KindCost); 4] {
        [
            ("site", &self.site),
            ("syscall", &self.syscall),
            ("sock", &self.sock),
            ("sched", &self.sched),
        ]
    }

    /// breakdown.json's `calibration` section.
    pub fn section(&self, hits: &HitsPerRequest) -> session::breakdown::Calibration {
        let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
        let round1 = |x: f64| (x * 10.0).round() / 10.0;
        // Figures written from floats: a non-finite one is null in the file.
        let finite1 = |x: f64| Some(round1(x)).filter(|x| x.is_finite());
        let kinds = self.kinds();
        fn by_kind<T>(
            kinds: &[(&str, &KindCost)],
            f: impl Fn(&KindCost) -> T,
        ) -> std::collections::BTreeMap<String, T> {
            (kinds.iter())
                .map(|(name, cost)| ((*name).to_owned(), f(cost)))
                .collect()
        }
        let names = |pick: &dyn Fn(&KindCost) -> bool| -> Vec<String> {
            (kinds.iter())
                .filter(|(_, cost)| pick(cost))
                .map(|(name, _)| (*name).to_owned())
                .collect()
        };
        let per_request = self.per_request(hits);
        session::breakdown::Calibration {
            method: "own-process loops with the session's programs filtered on the tracer's \
                     pid, untraced then traced, lower-quartile chunk per round, median round"
                .to_owned(),
            cpu: self.cpu as u32,
            // One round count per kind.
            rounds: by_kind(&kinds, |cost| cost.rounds.len() as u64),
            elapsed_s: round3(self.elapsed_s),
            // null, never a negative figure, for an unmeasured kind.
            ns_per_hit: by_kind(&kinds, |cost| cost.ns_per_hit.map(round1)),
            ns_per_hit_min_max: by_kind(&kinds, |cost| {
                [finite1(cost.min_ns), finite1(cost.max_ns)]
            }),
            untraced_ns_per_loop: by_kind(&kinds, |cost| finite1(cost.untraced_ns_per_unit)),
            noisy: names(&|cost| cost.is_noisy()),
            unmeasured: Some(names(&|cost| cost.ns_per_hit.is_none())),
            probe_ns_per_request: round1(per_request.total()),
            probe_ns_per_request_by_kind: [
                ("sites", per_request.sites),
                ("syscalls", per_request.syscalls),
                ("sock", per_request.sock),
                ("sched", per_request.sched),
            ]
            .into_iter()
            .map(|(name, ns)| (name.to_owned(), ns.map(round1)))
            .collect(),
            probe_ns_per_request_leaves_out: Some(
                (per_request.left_out().iter())
                    .map(|name| (*name).to_owned())
                    .collect(),
            ),
            not_included: "cpu-clock samples; filter-only runs in other tasks".to_owned(),
            note: "a ledger batch's writer hits are charged once, to its first durable \
                   request, so the mean over requests is the probe time per request"
                .to_owned(),
        }
    }

    /// Two lines for the stdout summary: costs per hit, and probe time per request.
    pub fn summary(&self, hits: &HitsPerRequest) -> String {
        let costs: Vec<String> = self
            .kinds()
            .iter()
            .map(|(name, cost)| cost.label(name))
            .collect();
        let p = self.per_request(hits);
        let terms: Vec<String> = p
            .kinds()
            .iter()
            .filter_map(|(name, ns)| Some(format!("{name} {:.1}", (*ns)? / 1e3)))
            .collect();
        let left_out = p.left_out();
        let left_out = if left_out.is_empty() {
            String::new()
        } else {
            format!("{} unmeasured, left out; ", left_out.join(", "))
        };
        format!(
            "probe cost per hit (calibrated on CPU {}, median round): {} ns\n\
             probe time added per request: ~{:.1} us ({} us; {left_out}samples not included)",
            self.cpu,
            costs.join(", "),
            p.total() / 1e3,
            terms.join(" + "),
        )
    }
}

/// Adds the `calibration` section and returns the summary lines, when calibration ran.
pub fn report(calibration: Option<&Calibration>, writer: &mut SessionWriter) -> Option<String> {
    let calibration = calibration?;
    let hits = writer.aggregate().hits_per_request();
    writer.set_calibration(calibration.section(&hits));
    Some(calibration.summary(&hits))
}

/// `tracer record`'s step before attaching: calibrate unless skipped, and say what came out.
pub fn before_attach(skip: bool, plan: &Plan) -> anyhow::Result<Option<Calibration>> {
    if skip {
        return Ok(None);
    }
    let calibration = run(plan).context("calibrating probe costs (--no-calibrate skips it)")?;
    let costs: Vec<String> = calibration
        .kinds()
        .iter()
        .map(|(name, cost)| match cost.ns_per_hit {
            Some(ns) => format!("{name} {ns:.0}"),
            None => format!("{name} unmeasured"),
        })
        .collect();
    say!(
        "tracer: calibrated on CPU {} in {:.1}s, ns per hit: {}",
        calibration.cpu,
        calibration.elapsed_s,
        costs.join(", ")
    );
    Ok(Some(calibration))
}

/// Measures every kind, syscalls and sockets in `plan`'s modes. Needs root and the eBPF
/// object; leaves nothing attached.
pub fn run(plan: &Plan) -> anyhow::Result<Calibration> {
    let started = Instant::now();
    let cpu = calibration_cpu()?;
    tracefs::ensure_mounted()?;
    attach::sched::check(plan.sched)?;
    let mut probes = Probes::load(plan)?;

    let site = probes.kind(&[Hook::Site], &[kind::SITE], &[], || {
        on_cpu(cpu, || {
            let mut i = 0u64;
            timed_chunks(SITE_CALLS, SITE_CHUNK, || {
                tracer_calibration_site(std::hint::black_box(i), 0, 0);
                i += 1;
                Ok(())
            })
        })
    });
    let site = site.context("calibrating the NOP5 probe site")?;

    let dev_null = File::options()
        .write(true)
        .open("/dev/null")
        .context("opening /dev/null")?;
    let write_pair = syscalls::hooks(plan.syscalls, "write").map(Hook::Kernel);
    let syscall = probes.kind(&write_pair, &[kind::SYSCALL], &[], || {
        on_cpu(cpu, || {
            timed_chunks(WRITES, WRITE_CHUNK, || {
                if rustix::io::write(&dev_null, &[0u8]).context("write to /dev/null")? != 1 {
                    bail!("a short write to /dev/null");
                }
                Ok(())
            })
        })
    });
    let syscall = syscall.with_context(|| format!("calibrating the syscall {}s", plan.syscalls))?;

    let (sender, receiver) = match plan.sockets {
        Kind::Tracepoint => socket_pair()?,
        Kind::Kprobe | Kind::Fentry => tcp_pair()?,
    };
    // send and recv are the sendto and recvfrom syscalls, the ones the gateway's sockets use.
    let socket_syscalls: Vec<Hook> = ["sendto", "recvfrom"]
        .into_iter()
        .flat_map(|name| syscalls::hooks(plan.syscalls, name))
        .map(Hook::Kernel)
        .collect();
    let sock_hooks = sockets::io_hooks(plan.sockets).map(Hook::Kernel);
    let sock = probes.kind(
        &sock_hooks,
        &[kind::SOCK_FD, kind::DATA_READY],
        &socket_syscalls,
        || {
            on_cpu(cpu, || {
                let mut byte = [0u8];
                timed_chunks(SOCK_ROUND_TRIPS, SOCK_CHUNK, || {
                    let sent = net::send(&sender, &byte, SendFlags::empty());
                    // The byte just sent is there, so this does not block.
                    let received = net::recv(&receiver, &mut byte, RecvFlags::empty());
                    let (sent, (received, _)) = (sent?, received?);
                    if sent != 1 || received != 1 {
                        bail!("socketpair send/recv moved {sent} and {received} bytes, not 1");
                    }
                    Ok(())
                })
            })
        },
    );
    let sock = sock.with_context(|| format!("calibrating the socket {}s", plan.sockets))?;

    let switch = [Hook::Kernel(attach::sched::hook(
        plan.sched,
        "sched_switch",
    ))];
    let sched = probes.kind(&switch, &[kind::SWITCH_OUT, kind::SWITCH_IN], &[], || {
        yield_pair(cpu)
    });
    let sched = sched.context("calibrating the sched tracepoints")?;

    Ok(Calibration {
        cpu,
        elapsed_s: started.elapsed().as_secs_f64(),
        site,
        syscall,
        sock,
        sched,
    })
}

/// A hook the calibration attaches and detaches between arms.
#[derive(Clone, Debug)]
enum Hook {
    Site,
    Kernel(hooks::Hook),
}

enum Link {
    Site(UProbeLinkId),
    Kernel(hooks::Link),
}

/// The session's kernel programs, loaded apart from the session, with `CONFIG.tgid` = our pid.
struct Probes {
    ebpf: Ebpf,
    /// For fentry programs; `None` when the plan has none.
    btf: Option<Btf>,
    events: RingBuf<MapData>,
    loss: PerCpuArray<MapData, Loss>,
    pid: NonZeroU32,
}

impl Probes {
    fn load(plan: &Plan) -> anyhow::Result<Probes> {
        if attach::OBJECT.is_empty() {
            bail!("this tracer was built with AYA_BUILD_SKIP=1 and has no eBPF programs");
        }
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("EVENTS", RING_BYTES)
            // No stacks are taken (no OFFCPU_STACKS flag): do not preallocate the session's size.
            .map_max_entries("STACKS", 1)
            .load(attach::OBJECT)
            .context("loading the eBPF object for calibration")?;
        let pid = NonZeroU32::new(std::process::id()).context("pid 0")?;
        // Submits wake no reader, as in a session: the loops drain the ring themselves.
        let config = Config {
            tgid: pid.get(),
            flags: 0,
            wakeup_bytes: u64::from(RING_BYTES) / 4,
            netns: 0,
            offsets: plan.detected.offsets,
        };
        let map = ebpf.map_mut("CONFIG").context("map CONFIG missing")?;
        Array::<_, Config>::try_from(map)?.set(0, config, 0)?;
        let events = RingBuf::try_from(ebpf.take_map("EVENTS").context("map EVENTS missing")?)?;
        let loss = PerCpuArray::try_from(ebpf.take_map("LOSS").context("map LOSS missing")?)?;
        let btf = if [plan.syscalls, plan.sockets].contains(&Kind::Fentry) {
            Some(Btf::from_sys_fs().context("reading the kernel's BTF for fentry")?)
        } else {
            None
        };
        Ok(Probes {
            ebpf,
            btf,
            events,
            loss,
            pid,
        })
    }

    /// [`MIN_ROUNDS`]..=[`ROUNDS`] rounds of `measure` without `hooks`, then as many with them
    /// (`base` attached throughout), after one untimed warm-up; counts the `kinds` events each
    /// traced round wrote. Not interleaved: a detach costs 20-200 ms here (the kernel waits for
    /// an RCU grace period), so the hooks are attached once; chunk quartiles absorb drift.
    fn kind(
        &mut self,
        hooks: &[Hook],
        kinds: &[u16],
        base: &[Hook],
        mut measure: impl FnMut() -> anyhow::Result<Arm>,
    ) -> anyhow::Result<KindCost> {
        let base_links = self.attach(base)?;
        let result = (|| {
            measure()?;
            let started = Instant::now();
            let mut untraced = Vec::with_capacity(ROUNDS);
            while untraced.len() < MIN_ROUNDS
                || (untraced.len() < ROUNDS && started.elapsed().as_millis() < UNTRACED_BUDGET_MS)
            {
                untraced.push(measure()?);
            }
            self.drain(kinds);
            let lost_before = self.lost()?;
            let links = self.attach(hooks)?;
            let traced = (|| {
                let mut traced = Vec::with_capacity(untraced.len());
                for _ in 0..untraced.len() {
                    let arm = measure()?;
                    traced.push((arm, self.drain(kinds)));
                }
                Ok::<_, anyhow::Error>(traced)
            })();
            self.detach(links)?;
            let mut traced = traced?;
            if let Some(last) = traced.last_mut() {
                // Events still in the ring after the detach.
                last.1 += self.drain(kinds);
            }
            if self.lost()? != lost_before {
                bail!("the calibration ring overflowed ({RING_BYTES} bytes)");
            }
            let rounds = untraced
                .into_iter()
                .zip(traced)
                .map(|(untraced, (traced, events))| Round {
                    untraced,
                    traced,
                    events,
                })
                .collect();
            KindCost::from_rounds(rounds)
        })();
        self.detach(base_links)?;
        self.drain(&[]);
        result
    }

    fn attach(&mut self, hooks: &[Hook]) -> anyhow::Result<Vec<Link>> {
        let mut links = Vec::new();
        for hook in hooks {
            let link = match hook {
                Hook::Site => {
                    let uprobe: &mut UProbe = program(&mut self.ebpf, SITE_PROGRAM)?.try_into()?;
                    if uprobe.fd().is_err() {
                        uprobe.load().context("loading the site program")?;
                    }
                    let exe = PathBuf::from(format!("/proc/{}/exe", self.pid));
                    let id = uprobe
                        .attach(SITE_SYMBOL, &exe, UProbeScope::OneProcess(self.pid))
                        .with_context(|| format!("attaching a uprobe to {SITE_SYMBOL}"))?;
                    Link::Site(id)
                }
                Hook::Kernel(hook) => Link::Kernel(hook.attach(&mut self.ebpf, self.btf.as_ref())?),
            };
            links.push(link);
        }
        Ok(links)
    }

    /// Detaches every link, in parallel: each detach waits for an RCU grace period (40-200
    /// ms on this VM), and the waits overlap. Returns once all are gone.
    fn detach(&mut self, links: Vec<Link>) -> anyhow::Result<()> {
        let mut owned: Vec<Box<dyn Send>> = Vec::new();
        for link in links {
            match link {
                Link::Site(id) => {
                    let uprobe: &mut UProbe = program(&mut self.ebpf, SITE_PROGRAM)?.try_into()?;
                    owned.push(Box::new(uprobe.take_link(id)?));
                }
                Link::Kernel(link) => owned.push(link.take(&mut self.ebpf)?),
            }
        }
        std::thread::scope(|scope| {
            for link in owned {
                scope.spawn(move || drop(link));
            }
        });
        Ok(())
    }

    /// Empties the ring; returns how many events of `kinds` it held.
    fn drain(&mut self, kinds: &[u16]) -> u64 {
        let mut count = 0;
        while let Some(item) = self.events.next() {
            if decode(&item).is_some_and(|event| kinds.contains(&event.kind)) {
                count += 1;
            }
        }
        count
    }

    fn lost(&self) -> anyhow::Result<u64> {
        let per_cpu = self.loss.get(&LOSS_SLOT, 0).context("reading LOSS")?;
        Ok(per_cpu.iter().map(|loss| loss.count).sum())
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .with_context(|| format!("{name} missing from the eBPF object"))
}

/// The highest CPU this process may run on.
fn calibration_cpu() -> anyhow::Result<usize> {
    let set = thread::sched_getaffinity(None).context("sched_getaffinity")?;
    (0..CpuSet::MAX_CPU)
        .rev()
        .find(|&cpu| set.is_set(cpu))
        .context("empty CPU affinity")
}

fn pin_current_thread(cpu: usize) -> anyhow::Result<()> {
    ensure!(cpu < CpuSet::MAX_CPU, "no CPU {cpu}");
    let mut set = CpuSet::new();
    set.set(cpu);
    thread::sched_setaffinity(None, &set).with_context(|| format!("pinning to CPU {cpu}"))
}

/// Runs `work` on a fresh thread pinned to `cpu`, so the tracer's own threads stay unpinned.
fn on_cpu<T: Send>(
    cpu: usize,
    work: impl FnOnce() -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                pin_current_thread(cpu)?;
                work()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("calibration thread panicked"))?
    })
}

/// A connected AF_UNIX stream pair: the sock tracepoints fire for every family, and unlike
/// loopback TCP no softirq (deferred to ksoftirqd on a busy CPU) sits between send and receive.
fn socket_pair() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("socketpair")
}

/// A connected loopback TCP pair, Nagle off so every 1-byte send goes out at once.
fn tcp_pair() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding loopback")?;
    let sender = std::net::TcpStream::connect(listener.local_addr()?).context("connecting")?;
    let (receiver, _) = listener.accept().context("accepting")?;
    sender.set_nodelay(true)?;
    Ok((OwnedFd::from(sender), OwnedFd::from(receiver)))
}

/// Context switches (voluntary and not) of the calling thread so far. rustix has no getrusage.
fn thread_switches() -> u64 {
    // SAFETY: a zeroed rusage is valid; getrusage fills it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        usage
    };
    (usage.ru_nvcsw + usage.ru_nivcsw) as u64
}

/// Two threads pinned to `cpu` yield to each other; units are the context switches they made.
fn yield_pair(cpu: usize) -> anyhow::Result<Arm> {
    let barrier = Arc::new(Barrier::new(2));
    let spawn = || {
        let barrier = Arc::clone(&barrier);
        std::thread::spawn(move || -> anyhow::Result<(Vec<u64>, u64)> {
            pin_current_thread(cpu)?;
            barrier.wait();
            let switches = thread_switches();
            let mut chunk_ns = Vec::with_capacity((YIELDS / YIELD_CHUNK) as usize);
            for _ in 0..YIELDS / YIELD_CHUNK {
                let start = monotonic_ns();
                for _ in 0..YIELD_CHUNK {
                    thread::sched_yield();
                }
                chunk_ns.push(monotonic_ns() - start);
            }
            Ok((chunk_ns, thread_switches() - switches))
        })
    };
    let threads = [spawn(), spawn()];
    let (mut chunk_ns, mut switches) = (Vec::new(), 0);
    for thread in threads {
        let (chunks, switched) = thread
            .join()
            .map_err(|_| anyhow::anyhow!("yield thread panicked"))??;
        chunk_ns.extend(chunks);
        switches += switched;
    }
    // Costs are per switch actually made, so not every yield has to switch: on 6.18 here
    // nearly all do, in an emulated guest (QEMU TCG, Linux 6.1, where a yield is slow enough
    // that CFS keeps the yielder) 6-40%. Threads that never share the CPU make none.
    if switches < MIN_SWITCHES {
        bail!(
            "only {switches} context switches in {} yields: the yields did not alternate",
            2 * YIELDS
        );
    }
    // While one thread runs its loop the other runs its own: one thread's chunks span the run.
    Ok(Arm {
        elapsed_ns: robust_elapsed_ns(&chunk_ns, YIELDS / YIELD_CHUNK),
        units: switches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(untraced: (u64, u64), traced: (u64, u64), events: u64) -> Round {
        Round {
            untraced: Arm {
                elapsed_ns: untraced.0,
                units: untraced.1,
            },
            traced: Arm {
                elapsed_ns: traced.0,
                units: traced.1,
            },
            events,
        }
    }

    #[test]
    fn cost_is_added_time_per_event() {
        // 1000 calls: 2 ns each untraced, 302 ns traced, one event per call.
        assert_eq!(
            round((2_000, 1000), (302_000, 1000), 1000).ns_per_hit(),
            Some(300.0)
        );
        // Switches: 1000 ns untraced, 1100 traced, two events per switch → 50 ns per event;
        // arms with different unit counts compare per unit.
        let sched = round((1_000_000, 1000), (2_200_000, 2000), 4000);
        assert_eq!(sched.ns_per_hit(), Some(50.0));
        // A round whose traced arm is faster gives a negative cost; the kind's median decides.
        assert_eq!(
            round((2_000, 1000), (1_000, 1000), 1000).ns_per_hit(),
            Some(-1.0)
        );
        assert_eq!(round((2_000, 1000), (302_000, 1000), 0).ns_per_hit(), None);
        assert_eq!(round((2_000, 0), (302_000, 1000), 10).ns_per_hit(), None);
    }

    #[test]
    fn a_preempted_chunk_does_not_count() {
        let chunks = [100, 5_000_000, 102, 98, 101, 4_000_000, 99, 3_000_000];
        assert_eq!(robust_elapsed_ns(&chunks, 8), 800);
        assert_eq!(robust_elapsed_ns(&[], 5), 0);
    }

    #[test]
    fn kind_cost_takes_the_median_round_and_refuses_silent_probes() {
        let rounds = vec![
            round((0, 10), (1000, 10), 10),
            round((0, 10), (3000, 10), 10),
            round((0, 10), (2000, 10), 20),
        ];
        let cost = KindCost::from_rounds(rounds).unwrap();
        assert_eq!(
            (cost.ns_per_hit, cost.min_ns, cost.max_ns),
            (Some(100.0), 100.0, 300.0)
        );
        assert_eq!(cost.hits_per_unit, 1.0);
        assert!(KindCost::from_rounds(vec![round((0, 10), (100, 10), 0)]).is_err());
        assert!(KindCost::from_rounds(Vec::new()).is_err());
    }

    /// The cost of rounds of one unit an arm and one event, each `(untraced ns, traced ns)`.
    fn cost_of(rounds: &[(u64, u64)]) -> KindCost {
        let rounds = rounds
            .iter()
            .map(|&(untraced, traced)| round((untraced, 1), (traced, 1), 1))
            .collect();
        KindCost::from_rounds(rounds).unwrap()
    }

    fn flat(ns: f64) -> KindCost {
        cost_of(&[(0, ns as u64)])
    }

    fn calibration() -> Calibration {
        Calibration {
            cpu: 1,
            elapsed_s: 0.5,
            site: flat(300.0),
            syscall: flat(100.0),
            sock: flat(60.0),
            sched: flat(40.0),
        }
    }

    fn hits() -> HitsPerRequest {
        HitsPerRequest {
            sites: 20.0,
            syscalls: 6.0,
            sock: 2.5,
            sched: 4.0,
            samples: 1.0,
        }
    }

    #[test]
    fn per_request_is_hits_times_cost() {
        let hits = hits();
        let p = calibration().per_request(&hits);
        assert_eq!(
            (p.sites, p.syscalls, p.sock, p.sched),
            (Some(6000.0), Some(600.0), Some(150.0), Some(160.0))
        );
        assert!(p.left_out().is_empty());
        assert_eq!(p.total(), 6910.0);
        let section = calibration().section(&hits);
        assert_eq!(section.probe_ns_per_request, 6910.0);
        assert_eq!(section.ns_per_hit["site"], Some(300.0));
        assert_eq!(section.probe_ns_per_request_by_kind["sock"], Some(150.0));
        let summary = calibration().summary(&hits);
        assert!(
            summary.contains("site 300, syscall 100, sock 60, sched 40 ns"),
            "{summary}"
        );
        assert!(summary.contains("~6.9 us"), "{summary}");
        assert!(!summary.contains("noisy"), "{summary}");
        let mut noisy = calibration();
        noisy.sched = cost_of(&[(0, 40), (0, 90), (0, 41)]);
        assert!(
            noisy
                .summary(&hits)
                .contains("sched 41 (noisy: rounds 40..90)")
        );
        assert_eq!(noisy.section(&hits).noisy, ["sched"]);
    }

    /// Every number in `text`, signs included.
    fn numbers(text: &str) -> Vec<f64> {
        text.split(|c: char| !(c.is_ascii_digit() || c == '-' || c == '.'))
            .filter_map(|word| word.trim_end_matches('.').parse().ok())
            .collect()
    }

    #[test]
    fn a_negative_median_is_unmeasured_and_left_out_of_the_sum() {
        let hits = hits();
        let mut noisy = calibration();
        // A busy neighbour: the traced arm came out faster in the median round.
        noisy.sock = cost_of(&[(400, 110), (400, 321), (0, 1841)]);
        assert_eq!(noisy.sock.ns_per_hit, None);
        assert!(!noisy.sock.is_noisy(), "no figure to call noisy");
        // A median of exactly zero measures nothing either.
        let zero = cost_of(&[(50, 50)]);
        assert_eq!(zero.ns_per_hit, None);

        let p = noisy.per_request(&hits);
        assert_eq!(p.sock, None);
        assert_eq!(p.left_out(), ["sock"]);
        assert_eq!(p.total(), 6000.0 + 600.0 + 160.0);

        let summary = noisy.summary(&hits);
        assert!(
            summary.contains("sock unmeasured (rounds -290..1841)"),
            "the rounds' range stays on record: {summary}"
        );
        assert!(summary.contains("~6.8 us"), "{summary}");
        assert!(
            summary
                .contains("(sites 6.0 + syscalls 0.6 + sched 0.2 us; sock unmeasured, left out;"),
            "{summary}"
        );
        // The range's low end is the only negative number, and it sits inside `rounds a..b`.
        let without_range = summary.replace("-290..", "..");
        assert!(
            numbers(&without_range).iter().all(|&n| n >= 0.0),
            "{summary}"
        );

        let section = noisy.section(&hits);
        assert_eq!(section.ns_per_hit["sock"], None);
        assert_eq!(
            section.ns_per_hit_min_max["sock"],
            [Some(-290.0), Some(1841.0)]
        );
        assert_eq!(section.rounds["sock"], 3);
        assert_eq!(section.unmeasured, Some(vec!["sock".to_owned()]));
        assert!(section.noisy.is_empty());
        assert_eq!(section.probe_ns_per_request, 6760.0);
        assert_eq!(section.probe_ns_per_request_by_kind["sock"], None);
        assert_eq!(
            section.probe_ns_per_request_leaves_out,
            Some(vec!["sock".to_owned()])
        );
        let mut json = section.clone();
        json.ns_per_hit_min_max.clear();
        let text = serde_json::to_string(&json).unwrap();
        assert!(
            numbers(&text).iter().all(|&n| n >= 0.0),
            "no negative figure outside the rounds' range: {text}"
        );
    }
}
