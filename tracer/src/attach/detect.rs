//! Which hook kinds this kernel allows, probed at run time in one place. fentry and kprobes
//! could replace tracepoints where allowed; on the kernels we target, tracepoints carry every
//! hook and this only reports what was found.

use std::{fmt, path::Path};

use aya::{Btf, Ebpf, programs::FEntry};

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

#[derive(Clone, Debug)]
pub struct Detected {
    pub fentry: Availability,
    pub kprobe: Availability,
}

impl Detected {
    /// The alternatives to a tracepoint, for the attach-mode line of a tracepoint group.
    pub fn alternatives(&self) -> String {
        format!("fentry {}; kprobe {}", self.fentry, self.kprobe)
    }
}

pub fn detect(ebpf: &mut Ebpf) -> Detected {
    Detected {
        fentry: fentry(ebpf),
        kprobe: kprobe(),
    }
}

/// Loads and attaches a do-nothing fentry program, then unloads it.
fn fentry(ebpf: &mut Ebpf) -> Availability {
    match try_fentry(ebpf) {
        Ok(()) => Availability::Available,
        Err(err) => Availability::Unavailable(errno_name(&err)),
    }
}

fn try_fentry(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let btf = Btf::from_sys_fs()?;
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
        Availability::Unavailable("no kprobe PMU in this kernel".into())
    }
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
