//! Load the kernel programs, point them at the target, and attach every hook. One file per
//! kernel program group (`tracer-ebpf/src/programs/*.rs`), plus detection, tracefs checks and
//! the target's discovery. Dropping the [`Session`] detaches and unloads everything.

pub mod btf;
pub mod detect;
pub mod hooks;
pub mod mode;
pub mod preflight;
pub mod samples;
pub mod sched;
pub mod sites;
pub mod sockets;
pub mod stats;
pub mod syscalls;
pub mod target;
pub mod tracefs;
pub mod usdt;

use std::{fmt, os::fd::AsFd as _};

use anyhow::{Context as _, bail};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
};
use tracer_ebpf::abi::{Config, Drops, Loss, Stack};

pub use self::mode::Mode;
use self::target::Target;

/// The kernel programs, built by build.rs.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

/// A group of hooks, one per kernel program file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    Sched,
    Syscalls,
    Sockets,
    Sites,
    Samples,
}

impl Group {
    pub const fn name(self) -> &'static str {
        match self {
            Group::Sched => "sched",
            Group::Syscalls => "syscalls",
            Group::Sockets => "sockets",
            Group::Sites => "sites",
            Group::Samples => "samples",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub sample_hz: u64,
    /// Ring buffer size: a power of two, at least a page.
    pub ring_bytes: u32,
    /// STACKS's capacity: distinct stacks kept.
    pub stack_entries: u32,
    pub offcpu_stacks: bool,
    /// Attach the `phase` site too, for per-phase on-CPU parts.
    pub phases: bool,
    /// Groups left unattached, to measure what the others cost. The split needs every group.
    pub skip: Vec<Group>,
    /// Attach, but let every program return at once: what the hooks cost on their own.
    pub empty_programs: bool,
}

impl Options {
    /// The ring fill (bytes) past which a submit wakes the reader: a quarter of the ring, so a
    /// reader that sleeps between timed drains still has three quarters of headroom.
    pub fn wakeup_bytes(&self) -> u64 {
        u64::from(self.ring_bytes) / 4
    }

    /// The mode's name, for the startup line, breakdown.json and the session README.
    pub fn mode(&self) -> String {
        let mut mode = vec!["lean".to_owned()];
        if self.phases {
            mode.push("phases".to_owned());
        }
        if self.offcpu_stacks {
            mode.push("offcpu-stacks".to_owned());
        }
        mode.push(format!("sample-hz={}", self.sample_hz));
        for group in &self.skip {
            mode.push(format!("without {}", group.name()));
        }
        if self.empty_programs {
            mode.push("empty programs".to_owned());
        }
        mode.join(" + ")
    }

    /// Whether `group`'s hooks are attached (not left off with `--skip`).
    pub fn attaches(&self, group: Group) -> bool {
        !self.skip.contains(&group)
    }
}

/// How one group of hooks is attached, for the startup lines and breakdown.json.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachMode {
    pub group: &'static str,
    pub mode: &'static str,
    pub detail: String,
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<9} {:<11} {}", self.group, self.mode, self.detail)
    }
}

/// Everything loaded and attached. Maps taken out with `take_*` outlive it.
pub struct Session {
    ebpf: Ebpf,
    pub modes: Vec<AttachMode>,
    /// The syscall kprobes' links, when syscalls are kprobes (dropped with the session).
    kprobes: stats::KprobeLinks,
}

impl Session {
    /// Attaches syscalls and sockets the way `plan` says ([`detect::Plan::new`]), in exact
    /// mode.
    pub fn attach(
        target: &Target,
        options: &Options,
        plan: &detect::Plan,
    ) -> anyhow::Result<Session> {
        Self::attach_mode(std::slice::from_ref(target), &Mode::Exact, options, plan)
    }

    /// Attaches in `mode`. Exact: `targets` is the one target. Kernel-only: TGIDS gets every
    /// target and its descendant processes, TIDS their threads, LISTEN_PORTS the ports any of
    /// them listens on (in the first one's network namespace); no probe site is attached.
    pub fn attach_mode(
        targets: &[Target],
        mode: &Mode,
        options: &Options,
        plan: &detect::Plan,
    ) -> anyhow::Result<Session> {
        let Some(target) = targets.first() else {
            bail!("no target to attach to");
        };
        let kernel_only = mode.is_kernel_only();
        if !kernel_only && targets.len() > 1 {
            bail!("exact mode traces one process");
        }
        if OBJECT.is_empty() {
            bail!("this tracer was built with AYA_BUILD_SKIP=1 and has no eBPF programs");
        }
        tracefs::ensure_mounted()?;
        sockets::check()?;
        sched::check(plan.sched)?;
        if kernel_only && plan.syscalls == hooks::Kind::Tracepoint {
            syscalls::check_data_tracepoints()?;
        }
        let btf = if [plan.syscalls, plan.sockets].contains(&hooks::Kind::Fentry) {
            Some(Btf::from_sys_fs().context("reading the kernel's BTF for fentry")?)
        } else {
            None
        };

        let mut ebpf = EbpfLoader::new()
            .map_max_entries("EVENTS", options.ring_bytes)
            .map_max_entries("STACKS", options.stack_entries)
            .load(OBJECT)
            .context("loading the eBPF object")?;

        let mut flags = 0;
        if options.offcpu_stacks {
            flags |= Config::OFFCPU_STACKS;
        }
        if options.empty_programs {
            flags |= Config::EMPTY_PROGRAMS;
        }
        if kernel_only {
            flags |= Config::KERNEL_ONLY;
        }
        let config = Config {
            tgid: target.pid.get(),
            flags,
            wakeup_bytes: options.wakeup_bytes(),
            netns: if plan.netns_match { target.netns } else { 0 },
            offsets: plan.detected.offsets,
        };
        Array::<_, Config>::try_from(map(&mut ebpf, "CONFIG")?)?.set(0, config, 0)?;
        // Kernel-only: the targets first, so that the fork program, attached next, follows
        // their children; then what /proc shows once it runs, so that none is missed.
        if kernel_only {
            let mut tgids = HashMap::<_, u32, u8>::try_from(map(&mut ebpf, "TGIDS")?)?;
            for target in targets {
                tgids.insert(target.pid.get(), 1, 0)?;
            }
        }
        sched::attach_fork(&mut ebpf, plan.sched)?;
        let (pids, seeded) = if kernel_only {
            let seed = mode::Seed::read(targets);
            let mut tgids = HashMap::<_, u32, u8>::try_from(map(&mut ebpf, "TGIDS")?)?;
            for &tgid in &seed.tgids {
                tgids
                    .insert(tgid, 1, 0)
                    .context("seeding TGIDS (more than 1024 target processes?)")?;
            }
            // The fork program may have cached a verdict on a process seeded since: a version
            // the kernel's increments from 0 never reach makes every cached verdict stale.
            Array::<_, u64>::try_from(map(&mut ebpf, "TGIDS_VERSION")?)?.set(0, 1 << 32, 0)?;
            (seed.tgids, seed.tids)
        } else {
            (vec![target.pid.get()], target.tids()?)
        };
        let mut tids = HashMap::<_, u32, u8>::try_from(map(&mut ebpf, "TIDS")?)?;
        for &tid in &seeded {
            tids.insert(tid, 1, 0)?;
        }
        let mut ports = HashMap::<_, u16, u8>::try_from(map(&mut ebpf, "LISTEN_PORTS")?)?;
        let listen_ports = self::target::listen_ports_of(&pids)?;
        for &port in &listen_ports {
            ports.insert(port, 1, 0)?;
        }

        let mut modes = Vec::new();
        let mut kprobes = stats::KprobeLinks::default();
        if options.attaches(Group::Sched) {
            let n = sched::attach_rest(&mut ebpf, plan.sched)?;
            modes.push(AttachMode {
                group: "sched",
                mode: plan.sched.as_str(),
                detail: format!(
                    "{}; {}{} threads seeded; raw tracepoints {}",
                    sched::describe(plan.sched, n),
                    if kernel_only {
                        format!("{} processes and ", pids.len())
                    } else {
                        String::new()
                    },
                    seeded.len(),
                    plan.detected.sched_raw_tracepoints
                ),
            });
        }
        if options.attaches(Group::Syscalls) {
            let links = syscalls::attach(&mut ebpf, plan.syscalls, btf.as_ref())?;
            kprobes = stats::KprobeLinks::take(&mut ebpf, links)?;
            modes.push(AttachMode {
                group: "syscalls",
                mode: plan.syscalls.as_str(),
                detail: format!(
                    "{}; {}",
                    syscalls::describe(plan.syscalls),
                    plan.alternatives(&plan.detected.syscall_tracepoints)
                ),
            });
        }
        if options.attaches(Group::Sockets) {
            sockets::attach(&mut ebpf, plan.sockets, btf.as_ref())?;
            let ports: Vec<String> = listen_ports.iter().map(u16::to_string).collect();
            modes.push(AttachMode {
                group: "sockets",
                mode: plan.sockets.as_str(),
                detail: format!(
                    "{}; listening ports [{}] {}; {}",
                    sockets::describe(plan.sockets),
                    ports.join(", "),
                    if plan.netns_match {
                        "in the target's network namespace"
                    } else {
                        "in any network namespace"
                    },
                    plan.alternatives(&plan.detected.sock_tracepoints)
                ),
            });
        }
        if kernel_only {
            modes.push(AttachMode {
                group: "sites",
                mode: "none",
                detail: format!("{mode}: no probe sites attached"),
            });
        } else if options.attaches(Group::Sites) {
            let n = sites::attach(&mut ebpf, target, options.phases)?;
            let which = if options.phases {
                ""
            } else {
                " (no phase site: --phases)"
            };
            modes.push(AttachMode {
                group: "sites",
                mode: "uprobe",
                detail: format!(
                    "{n} probe sites{which} by {} in {}",
                    target.sites.found_by.name(),
                    target.exe_name.display()
                ),
            });
        }
        for group in &options.skip {
            modes.push(AttachMode {
                group: group.name(),
                mode: "skipped",
                detail: "--skip: cost measurement only, the split needs this group".to_owned(),
            });
        }
        if options.sample_hz > 0 && options.attaches(Group::Samples) {
            let allowed = self::target::cpus_allowed_of(&pids)?;
            let cpus = samples::attach(&mut ebpf, options.sample_hz, &allowed)?;
            let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
            modes.push(AttachMode {
                group: "samples",
                mode: "perf_event",
                detail: format!(
                    "cpu-clock {} Hz on CPU {} (the {} affinity at attach)",
                    options.sample_hz,
                    list.join(","),
                    if pids.len() > 1 {
                        "targets'"
                    } else {
                        "target's"
                    }
                ),
            });
        }
        Ok(Session {
            ebpf,
            modes,
            kprobes,
        })
    }

    /// Kernel ids of the loaded programs, so a test can check none outlives the session.
    pub fn program_ids(&self) -> Vec<u32> {
        self.ebpf
            .programs()
            .filter_map(|(_, program)| program.info().ok())
            .map(|info| info.id())
            .collect()
    }

    /// Per loaded program, the times the kernel skipped it because another BPF program ran on
    /// that CPU (nonzero ones only, by name). Read before detach: unloading loses them.
    pub fn recursion_misses(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let mut misses = Vec::new();
        for (name, program) in self.ebpf.programs() {
            let Ok(fd) = program.fd() else {
                continue; // never loaded (another attach mode's variant)
            };
            let n =
                stats::recursion_misses(fd.as_fd()).with_context(|| format!("program {name}"))?;
            if n > 0 {
                misses.push((name.to_owned(), n));
            }
        }
        misses.sort();
        Ok(misses)
    }

    /// Per syscall kretprobe, the calls whose exit it missed (its instances ran out), or why
    /// that is unknown. Empty unless syscalls are kprobes.
    pub fn kretprobe_missed(&self) -> Result<Vec<(String, u64)>, String> {
        self.kprobes.kretprobe_missed()
    }

    /// The threads TIDS holds now: once the target has exited, none should be left.
    pub fn target_tids(&self) -> anyhow::Result<Vec<u32>> {
        let map = self
            .ebpf
            .map("TIDS")
            .context("map TIDS missing from the eBPF object")?;
        let tids = HashMap::<_, u32, u8>::try_from(map)?;
        Ok(tids.keys().collect::<Result<_, _>>()?)
    }

    pub fn take_events(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        Ok(RingBuf::try_from(take(&mut self.ebpf, "EVENTS")?)?)
    }

    pub fn take_loss(&mut self) -> anyhow::Result<PerCpuArray<MapData, Loss>> {
        Ok(PerCpuArray::try_from(take(&mut self.ebpf, "LOSS")?)?)
    }

    pub fn take_drops(&mut self) -> anyhow::Result<PerCpuArray<MapData, Drops>> {
        Ok(PerCpuArray::try_from(take(&mut self.ebpf, "DROPS")?)?)
    }

    /// The stacks map (`abi::Stack` by id); stack ids of the session's events keep resolving after detach.
    pub fn take_stacks(&mut self) -> anyhow::Result<HashMap<MapData, u64, Stack>> {
        Ok(HashMap::try_from(take(&mut self.ebpf, "STACKS")?)?)
    }

    /// Detaches every link and unloads every program (what dropping does, said out loud).
    pub fn detach(self) {
        drop(self.kprobes);
        drop(self.ebpf);
    }
}

fn map<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut aya::maps::Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("map {name} missing from the eBPF object"))
}

fn take(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("map {name} missing from the eBPF object"))
}

#[cfg(test)]
mod tests {
    use object::{Object as _, ObjectSection as _, SectionKind};

    /// BPF_STX | BPF_DW | BPF_ATOMIC, with imm BPF_ADD: `lock *(u64 *)(dst + off) += src`.
    fn atomic_adds(code: &[u8]) -> usize {
        code.chunks_exact(8)
            .filter(|insn| insn[0] == 0xdb && insn[4..8] == [0; 4])
            .count()
    }

    /// Issue 21 item 11: LOSS and DROPS are bumped by an atomic add in every kind of program
    /// that emits (a load and a store lose a count when a program nests in another).
    #[test]
    fn item11_counters_are_atomic_adds() {
        if super::OBJECT.is_empty() {
            return; // AYA_BUILD_SKIP: no programs to look at.
        }
        let file = object::File::parse(super::OBJECT).unwrap();
        for name in ["uprobe", "tracepoint", "perf_event", "kretprobe"] {
            let code: Vec<u8> = file
                .sections()
                .filter(|s| s.kind() == SectionKind::Text && s.name() == Ok(name))
                .flat_map(|s| s.data().unwrap().to_vec())
                .collect();
            assert!(!code.is_empty(), "no {name} programs");
            assert!(
                atomic_adds(&code) > 0,
                "{name} programs count without an atomic add"
            );
        }
    }
}

/// The programs kernel-only mode adds to (the data syscalls' tracepoints, the raw and classic
/// fork and exit programs) pass this kernel's verifier (root: loading needs CAP_BPF).
#[cfg(test)]
mod verifier_tests {
    use aya::{
        EbpfLoader,
        programs::{RawTracePoint, TracePoint},
    };

    #[test]
    fn kernel_only_programs_load() {
        if super::OBJECT.is_empty() || !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED kernel_only_programs_load: no programs, or not root");
            return;
        }
        let mut ebpf = EbpfLoader::new().load(super::OBJECT).unwrap();
        let mut names: Vec<String> = Vec::new();
        for (name, _) in tracer_ebpf::tracepoints::SYSCALLS {
            names.push(format!("sys_enter_{name}"));
            names.push(format!("sys_exit_{name}"));
        }
        names.extend(
            ["sched_process_fork", "sched_process_exit", "sched_switch"].map(str::to_owned),
        );
        for name in &names {
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .unwrap_or_else(|| panic!("{name} missing"))
                .try_into()
                .unwrap();
            program.load().unwrap_or_else(|e| panic!("{name}: {e:?}"));
        }
        for name in [
            "raw_sched_process_fork",
            "raw_sched_process_exit",
            "raw_sched_switch",
        ] {
            let program: &mut RawTracePoint = ebpf.program_mut(name).unwrap().try_into().unwrap();
            program.load().unwrap_or_else(|e| panic!("{name}: {e:?}"));
        }
    }
}
