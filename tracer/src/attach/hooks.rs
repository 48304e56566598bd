//! One kernel program and where it attaches, for every kind of kernel hook the tracer uses, so
//! the session and the calibration attach the same programs the same way whatever the mode.

use std::fmt;

use anyhow::Context as _;
use aya::{
    Btf, Ebpf,
    programs::{
        FEntry, FExit, KProbe, RawTracePoint, TracePoint, fentry::FEntryLinkId, fexit::FExitLinkId,
        kprobe::KProbeLinkId, raw_trace_point::RawTracePointLinkId, trace_point::TracePointLinkId,
    },
};

/// How a group of kernel hooks is attached. Sites are always uprobes and samples perf events;
/// syscalls and sockets have a variant of each, the scheduler raw or classic tracepoints
/// ([`SchedKind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Tracepoint,
    Kprobe,
    Fentry,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tracepoint => "tracepoint",
            Kind::Kprobe => "kprobe",
            Kind::Fentry => "fentry",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the scheduler programs are attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedKind {
    /// Each program has its own recursion guard: one runs even while another of ours does.
    RawTracepoint,
    /// They share `bpf_prog_active` with the syscall, socket and sample programs: the kernel
    /// skips a wakeup that lands while one of those runs (counted in `recursion_misses`).
    Tracepoint,
}

impl SchedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SchedKind::RawTracepoint => "raw_tracepoint",
            SchedKind::Tracepoint => "tracepoint",
        }
    }
}

/// A kernel program and where it attaches.
#[derive(Clone, Debug)]
pub struct Hook {
    pub program: String,
    pub at: At,
}

#[derive(Clone, Debug)]
pub enum At {
    Tracepoint {
        category: &'static str,
        name: String,
    },
    /// A raw tracepoint, by its name alone (`sched_switch`).
    RawTracepoint(String),
    /// A kprobe or kretprobe on this function (the program's section says which).
    Kprobe(String),
    Fentry(String),
    Fexit(String),
}

/// An attached hook, to detach on its own (the calibration's arms).
pub enum Link {
    Tracepoint(String, TracePointLinkId),
    RawTracepoint(String, RawTracePointLinkId),
    Kprobe(String, KProbeLinkId),
    Fentry(String, FEntryLinkId),
    Fexit(String, FExitLinkId),
}

impl Hook {
    /// A tracepoint whose program is named after it.
    pub fn tracepoint(category: &'static str, name: &str) -> Hook {
        Hook::new(
            name,
            At::Tracepoint {
                category,
                name: name.to_owned(),
            },
        )
    }

    pub fn new(program: impl Into<String>, at: At) -> Hook {
        Hook {
            program: program.into(),
            at,
        }
    }

    /// Loads the program unless already loaded, and attaches it. `btf` is needed by fentry
    /// and fexit only.
    pub fn attach(&self, ebpf: &mut Ebpf, btf: Option<&Btf>) -> anyhow::Result<Link> {
        let name = self.program.as_str();
        let btf = || btf.context("fentry needs the kernel's BTF");
        // Loads the program as `$ty` unless loaded, and attaches it: the link's id.
        macro_rules! load_attach {
            ($ty:ty, |$p:ident| $load:expr, $attach:expr, $to:expr) => {{
                let $p: &mut $ty = typed(ebpf, name)?;
                if $p.fd().is_err() {
                    $load.with_context(|| format!("loading {name}"))?;
                }
                $attach.with_context(|| format!("attaching {name} to {}", $to))?
            }};
        }
        let owned = || self.program.clone();
        Ok(match &self.at {
            At::Tracepoint { category, name: tp } => Link::Tracepoint(
                owned(),
                load_attach!(
                    TracePoint,
                    |p| p.load(),
                    p.attach(category, tp),
                    format!("tracepoint {category}:{tp}")
                ),
            ),
            At::RawTracepoint(tp) => Link::RawTracepoint(
                owned(),
                load_attach!(
                    RawTracePoint,
                    |p| p.load(),
                    p.attach(tp),
                    format!("raw tracepoint {tp}")
                ),
            ),
            At::Kprobe(f) => Link::Kprobe(
                owned(),
                load_attach!(KProbe, |p| p.load(), p.attach(f, 0), f),
            ),
            At::Fentry(f) => Link::Fentry(
                owned(),
                load_attach!(FEntry, |p| p.load(f, btf()?), p.attach(), f),
            ),
            At::Fexit(f) => Link::Fexit(
                owned(),
                load_attach!(FExit, |p| p.load(f, btf()?), p.attach(), f),
            ),
        })
    }
}

/// The program `name` as its type `T`.
pub(crate) fn typed<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    Ok(ebpf
        .program_mut(name)
        .with_context(|| format!("{name} missing from the eBPF object"))?
        .try_into()?)
}

impl Link {
    /// Takes the link out of its program, so that dropping the result detaches it.
    pub fn take(self, ebpf: &mut Ebpf) -> anyhow::Result<Box<dyn Send>> {
        Ok(match self {
            Link::Tracepoint(n, id) => Box::new(typed::<TracePoint>(ebpf, &n)?.take_link(id)?),
            Link::RawTracepoint(n, id) => {
                Box::new(typed::<RawTracePoint>(ebpf, &n)?.take_link(id)?)
            }
            Link::Kprobe(n, id) => Box::new(typed::<KProbe>(ebpf, &n)?.take_link(id)?),
            Link::Fentry(n, id) => Box::new(typed::<FEntry>(ebpf, &n)?.take_link(id)?),
            Link::Fexit(n, id) => Box::new(typed::<FExit>(ebpf, &n)?.take_link(id)?),
        })
    }
}
