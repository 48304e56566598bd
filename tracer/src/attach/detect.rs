//! Which hook kinds this kernel allows, probed at run time, and the one place that picks each
//! group's mode from them: `--attach auto` takes fentry, else kprobes, else tracepoints; a
//! forced mode is used or refused with the reason. The scheduler takes raw tracepoints where
//! the kernel's BTF gives the offsets they read (classic ones otherwise, or with `--attach
//! tracepoint`), and new connections are matched by network namespace where BTF says where a
//! socket's is; sites are always uprobes and samples perf events.

use std::{fmt, path::Path};

use anyhow::{Context as _, bail};
use aya::{Btf, EbpfLoader, programs::FEntry};
use tracer_ebpf::abi::Offsets;

pub use super::hooks::SchedKind;
use super::{OBJECT, btf, hooks::Kind, sched, sockets, syscalls, tracefs};

/// `--attach`: let the tracer pick, or force one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Choice {
    #[default]
    Auto,
    Tracepoint,
    Kprobe,
    Fentry,
}

impl Choice {
    pub fn as_str(self) -> &'static str {
        match self {
            Choice::Auto => "auto",
            Choice::Tracepoint => "tracepoint",
            Choice::Kprobe => "kprobe",
            Choice::Fentry => "fentry",
        }
    }
}

/// The order `auto` tries: fentry (a direct trampoline call), then kprobes (an ftrace-based
/// call at function entry, and a return trampoline), then the classic tracepoints.
const PREFERENCE: [Kind; 3] = [Kind::Fentry, Kind::Kprobe, Kind::Tracepoint];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    Available,
    Unavailable(String),
}

impl fmt::Display for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Availability::Available => f.write_str("available"),
            Availability::Unavailable(why) => write!(f, "unavailable: {why}"),
        }
    }
}

impl Availability {
    /// `why` names the failure: by errno for a load, in full for a missing tracepoint.
    fn from_result(
        result: anyhow::Result<()>,
        why: impl Fn(&anyhow::Error) -> String,
    ) -> Availability {
        match result {
            Ok(()) => Availability::Available,
            Err(err) => Availability::Unavailable(why(&err)),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Detected {
    pub fentry: Availability,
    pub kprobe: Availability,
    /// The `syscalls:sys_{enter,exit}_*` tracepoints with the expected layout.
    pub syscall_tracepoints: Availability,
    /// The sock:* send, receive and data-ready tracepoints (Linux 6.3+).
    pub sock_tracepoints: Availability,
    /// The sched raw tracepoints with the arguments the programs read, and the `task_struct`
    /// members they read, in the kernel's BTF.
    pub sched_raw_tracepoints: Availability,
    /// Where a `struct sock`'s network namespace is, in the kernel's BTF.
    pub sock_netns: Availability,
    /// The offsets found; 0 for what is unavailable.
    pub offsets: Offsets,
}

/// The mode of each group with a choice, and what was found.
#[derive(Clone, Debug)]
pub struct Plan {
    pub choice: Choice,
    pub syscalls: Kind,
    pub sockets: Kind,
    pub sched: SchedKind,
    /// New connections on the target's ports are matched in its network namespace only.
    pub netns_match: bool,
    pub detected: Detected,
}

impl Plan {
    /// Detects what this kernel allows and picks each group's mode, or says why the forced one
    /// cannot be used. Needs tracefs mounted.
    pub fn new(choice: Choice) -> anyhow::Result<Plan> {
        let detected = detect()?;
        Ok(Plan {
            choice,
            syscalls: pick(choice, "syscalls", &detected, &detected.syscall_tracepoints)?,
            sockets: pick(choice, "sockets", &detected, &detected.sock_tracepoints)?,
            sched: pick_sched(choice, &detected),
            netns_match: detected.sock_netns == Availability::Available,
            detected,
        })
    }

    /// What this plan gives up for lack of kernel support, one warning a line; none when all
    /// is there or the fallback was asked for.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let (SchedKind::Tracepoint, Availability::Unavailable(why), Choice::Auto) = (
            self.sched,
            &self.detected.sched_raw_tracepoints,
            self.choice,
        ) {
            warnings.push(format!(
                "tracer: WARNING the scheduler hooks fall back to classic tracepoints (raw \
                 tracepoints: {why}): a wakeup that interrupts another of the tracer's programs \
                 is skipped by the kernel, and only counted (drops.recursion_misses)"
            ));
        }
        if let Availability::Unavailable(why) = &self.detected.sock_netns {
            warnings.push(format!(
                "tracer: WARNING new connections on the target's ports are matched by port \
                 only, not network namespace ({why}): another namespace's connections on the \
                 same port count as the target's"
            ));
        }
        warnings
    }

    /// The alternatives found, for the attach lines.
    pub fn alternatives(&self, tracepoints: &Availability) -> String {
        format!(
            "fentry {}; kprobe {}; tracepoint {tracepoints}",
            self.detected.fentry, self.detected.kprobe
        )
    }
}

fn pick(
    choice: Choice,
    group: &str,
    detected: &Detected,
    tracepoints: &Availability,
) -> anyhow::Result<Kind> {
    let availability = |kind: Kind| match kind {
        Kind::Fentry => &detected.fentry,
        Kind::Kprobe => &detected.kprobe,
        Kind::Tracepoint => tracepoints,
    };
    let forced = match choice {
        Choice::Auto => None,
        Choice::Tracepoint => Some(Kind::Tracepoint),
        Choice::Kprobe => Some(Kind::Kprobe),
        Choice::Fentry => Some(Kind::Fentry),
    };
    if let Some(kind) = forced {
        return match availability(kind) {
            Availability::Available => Ok(kind),
            Availability::Unavailable(why) => {
                bail!("--attach {kind}: {group} cannot use {kind} on this kernel: {why}")
            }
        };
    }
    PREFERENCE
        .into_iter()
        .find(|&kind| availability(kind) == &Availability::Available)
        .with_context(|| {
            format!(
                "{group}: no way to attach on this kernel (fentry {}; kprobe {}; tracepoint {})",
                detected.fentry, detected.kprobe, tracepoints
            )
        })
}

/// Raw scheduler tracepoints unless classic ones are asked for (`--attach tracepoint`) or
/// the kernel's BTF lacks what they read.
fn pick_sched(choice: Choice, detected: &Detected) -> SchedKind {
    match (choice, &detected.sched_raw_tracepoints) {
        (Choice::Tracepoint, _) | (_, Availability::Unavailable(_)) => SchedKind::Tracepoint,
        (_, Availability::Available) => SchedKind::RawTracepoint,
    }
}

pub fn detect() -> anyhow::Result<Detected> {
    tracefs::ensure_mounted()?;
    let btf = btf::Btf::from_sys_fs();
    let mut offsets = Offsets::default();
    let sched_raw = btf.as_ref().map_err(clone).and_then(|btf| {
        offsets = sched::raw_offsets(btf)?;
        Ok(())
    });
    let sock_netns = btf.as_ref().map_err(clone).and_then(|btf| {
        (offsets.sock_net, offsets.net_inum) = sockets::netns_offsets(btf)?;
        Ok(())
    });
    Ok(Detected {
        fentry: Availability::from_result(try_fentry(), errno_name),
        kprobe: kprobe(),
        syscall_tracepoints: Availability::from_result(syscalls::check_tracepoints(), full),
        sock_tracepoints: Availability::from_result(sockets::check_tracepoints(), full),
        sched_raw_tracepoints: Availability::from_result(sched_raw, full),
        sock_netns: Availability::from_result(sock_netns, full),
        offsets,
    })
}

fn clone(err: &anyhow::Error) -> anyhow::Error {
    anyhow::anyhow!("{err:#}")
}

/// Loads and attaches the do-nothing fentry program, then unloads it (with its own small copy
/// of the object's maps, which the kernel frees with it).
fn try_fentry() -> anyhow::Result<()> {
    if OBJECT.is_empty() {
        bail!("no eBPF programs (AYA_BUILD_SKIP)");
    }
    let btf = Btf::from_sys_fs()?;
    let mut ebpf = EbpfLoader::new()
        .map_max_entries("EVENTS", 4096)
        .map_max_entries("STACKS", 1)
        .load(OBJECT)?;
    let program: &mut FEntry = ebpf
        .program_mut("detect_fentry")
        .ok_or_else(|| anyhow::anyhow!("detect_fentry missing from the eBPF object"))?
        .try_into()?;
    program.load("do_nanosleep", &btf)?;
    let attached = program.attach().map(|_| ());
    program.unload()?;
    Ok(attached?)
}

/// aya attaches kprobes through the kprobe PMU; without it (CONFIG_KPROBES off) there is none.
fn kprobe() -> Availability {
    if Path::new("/sys/bus/event_source/devices/kprobe/type").exists() {
        Availability::Available
    } else {
        Availability::Unavailable("no kprobe PMU in this kernel (CONFIG_KPROBES off)".into())
    }
}

fn full(err: &anyhow::Error) -> String {
    format!("{err:#}")
}

/// The errno of the first OS error in the chain, by name ("EPERM"), else the error's text.
fn errno_name(err: &anyhow::Error) -> String {
    let errno = err.chain().find_map(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
    });
    match errno {
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::ENOENT) => "ENOENT".into(),
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP".into(),
        // The kernel's internal ENOTSUPP leaks to user space from some BPF paths.
        Some(524) => "ENOTSUPP".into(),
        Some(errno) => format!("errno {errno}"),
        None => format!("{err:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detected(fentry: bool, kprobe: bool, tracepoints: bool) -> Detected {
        let a = |ok: bool| {
            if ok {
                Availability::Available
            } else {
                Availability::Unavailable("EPERM".into())
            }
        };
        Detected {
            fentry: a(fentry),
            kprobe: a(kprobe),
            syscall_tracepoints: a(tracepoints),
            sock_tracepoints: a(tracepoints),
            sched_raw_tracepoints: a(true),
            sock_netns: a(true),
            offsets: Offsets::default(),
        }
    }

    #[test]
    fn auto_prefers_fentry_then_kprobe_then_tracepoint() {
        let tp = Availability::Available;
        let pick = |d: &Detected| pick(Choice::Auto, "syscalls", d, &tp).unwrap();
        assert_eq!(pick(&detected(true, true, true)), Kind::Fentry);
        assert_eq!(pick(&detected(false, true, true)), Kind::Kprobe);
        assert_eq!(pick(&detected(false, false, true)), Kind::Tracepoint);
    }

    #[test]
    fn a_forced_mode_is_used_or_refused_with_the_reason() {
        let d = detected(false, true, false);
        assert_eq!(
            pick(Choice::Kprobe, "sockets", &d, &d.sock_tracepoints).unwrap(),
            Kind::Kprobe
        );
        let err = pick(Choice::Fentry, "sockets", &d, &d.sock_tracepoints).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--attach fentry: sockets cannot use fentry on this kernel: EPERM"
        );
        let none = detected(false, false, false);
        assert!(pick(Choice::Auto, "sockets", &none, &none.sock_tracepoints).is_err());
    }

    /// Issue 21 item 8: raw sched tracepoints wherever BTF has what they read; classic ones
    /// when asked for, or else with a warning that says what that costs.
    #[test]
    fn sched_raw_unless_asked_or_missing_and_the_fallback_is_said() {
        let mut d = detected(false, false, true);
        let plan = |choice, d: &Detected| Plan {
            choice,
            syscalls: Kind::Tracepoint,
            sockets: Kind::Tracepoint,
            sched: pick_sched(choice, d),
            netns_match: d.sock_netns == Availability::Available,
            detected: d.clone(),
        };
        let auto = plan(Choice::Auto, &d);
        assert_eq!(auto.sched, SchedKind::RawTracepoint);
        assert!(auto.netns_match);
        assert_eq!(auto.warnings(), Vec::<String>::new());
        assert_eq!(pick_sched(Choice::Kprobe, &d), SchedKind::RawTracepoint);
        let asked = plan(Choice::Tracepoint, &d);
        assert_eq!(asked.sched, SchedKind::Tracepoint);
        assert_eq!(asked.warnings(), Vec::<String>::new());

        d.sched_raw_tracepoints = Availability::Unavailable("no btf_trace_sched_switch".into());
        d.sock_netns = Availability::Unavailable("no struct net".into());
        let fallback = plan(Choice::Auto, &d);
        assert_eq!(fallback.sched, SchedKind::Tracepoint);
        assert!(!fallback.netns_match);
        let warnings = fallback.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0]
                .contains("classic tracepoints (raw tracepoints: no btf_trace_sched_switch)")
        );
        assert!(warnings[1].contains("matched by port only"));
    }
}
