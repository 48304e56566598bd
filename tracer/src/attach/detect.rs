//! Which hook kinds this kernel allows, probed at run time, and the one place that picks each
//! group's mode from them: `--attach auto` takes fentry, else kprobes, else tracepoints; a
//! forced mode is used or refused with the reason. The scheduler is always classic
//! tracepoints, sites uprobes and samples perf events; the choice is for syscalls and sockets.

use std::{fmt, path::Path};

use anyhow::{Context as _, bail};
use aya::{Btf, EbpfLoader, programs::FEntry};

use super::{OBJECT, hooks::Kind, sockets, syscalls, tracefs};

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
}

/// The mode of each group with a choice, and what was found.
#[derive(Clone, Debug)]
pub struct Plan {
    pub choice: Choice,
    pub syscalls: Kind,
    pub sockets: Kind,
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
            detected,
        })
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

pub fn detect() -> anyhow::Result<Detected> {
    tracefs::ensure_mounted()?;
    Ok(Detected {
        fentry: Availability::from_result(try_fentry(), errno_name),
        kprobe: kprobe(),
        syscall_tracepoints: Availability::from_result(syscalls::check_tracepoints(), full),
        sock_tracepoints: Availability::from_result(sockets::check_tracepoints(), full),
    })
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
}
