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

#[derive(Clone, Debug)]
pub enum Hook {
    Tracepoint {
        program: String,
        category: &'static str,
        name: String,
    },
    /// A raw tracepoint (by its name alone: `sched_switch`).
    RawTracepoint {
        program: String,
        name: String,
    },
    /// A kprobe or kretprobe (the program's section says which).
    Kprobe {
        program: String,
        function: String,
    },
    Fentry {
        program: String,
        function: String,
    },
    Fexit {
        program: String,
        function: String,
    },
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
    pub fn tracepoint(category: &'static str, name: &str) -> Hook {
        Hook::Tracepoint {
            program: name.to_owned(),
            category,
            name: name.to_owned(),
        }
    }

    pub fn program(&self) -> &str {
        match self {
            Hook::Tracepoint { program, .. }
            | Hook::RawTracepoint { program, .. }
            | Hook::Kprobe { program, .. }
            | Hook::Fentry { program, .. }
            | Hook::Fexit { program, .. } => program,
        }
    }

    /// Loads the program unless already loaded, and attaches it. `btf` is needed by fentry
    /// and fexit only.
    pub fn attach(&self, ebpf: &mut Ebpf, btf: Option<&Btf>) -> anyhow::Result<Link> {
        let program = program(ebpf, self.program())?;
        let btf = || btf.context("fentry needs the kernel's BTF");
        Ok(match self {
            Hook::Tracepoint { category, name, .. } => {
                let tracepoint: &mut TracePoint = program.try_into()?;
                if tracepoint.fd().is_err() {
                    tracepoint
                        .load()
                        .with_context(|| format!("loading {name}"))?;
                }
                let id = tracepoint
                    .attach(category, name)
                    .with_context(|| format!("attaching tracepoint {category}:{name}"))?;
                Link::Tracepoint(self.program().to_owned(), id)
            }
            Hook::RawTracepoint {
                program: program_name,
                name,
            } => {
                let raw: &mut RawTracePoint = program.try_into()?;
                if raw.fd().is_err() {
                    raw.load()
                        .with_context(|| format!("loading {program_name}"))?;
                }
                let id = raw
                    .attach(name)
                    .with_context(|| format!("attaching raw tracepoint {name}"))?;
                Link::RawTracepoint(program_name.clone(), id)
            }
            Hook::Kprobe {
                program: name,
                function,
            } => {
                let kprobe: &mut KProbe = program.try_into()?;
                if kprobe.fd().is_err() {
                    kprobe.load().with_context(|| format!("loading {name}"))?;
                }
                let id = kprobe
                    .attach(function, 0)
                    .with_context(|| format!("attaching {name} to {function}"))?;
                Link::Kprobe(name.clone(), id)
            }
            Hook::Fentry {
                program: name,
                function,
            } => {
                let fentry: &mut FEntry = program.try_into()?;
                if fentry.fd().is_err() {
                    fentry
                        .load(function, btf()?)
                        .with_context(|| format!("loading {name} for {function}"))?;
                }
                let id = fentry
                    .attach()
                    .with_context(|| format!("attaching {name} to {function}"))?;
                Link::Fentry(name.clone(), id)
            }
            Hook::Fexit {
                program: name,
                function,
            } => {
                let fexit: &mut FExit = program.try_into()?;
                if fexit.fd().is_err() {
                    fexit
                        .load(function, btf()?)
                        .with_context(|| format!("loading {name} for {function}"))?;
                }
                let id = fexit
                    .attach()
                    .with_context(|| format!("attaching {name} to {function}"))?;
                Link::Fexit(name.clone(), id)
            }
        })
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .with_context(|| format!("{name} missing from the eBPF object"))
}

impl Link {
    /// Takes the link out of its program, so that dropping the result detaches it.
    pub fn take(self, ebpf: &mut Ebpf) -> anyhow::Result<Box<dyn Send>> {
        Ok(match self {
            Link::Tracepoint(name, id) => {
                let p: &mut TracePoint = program(ebpf, &name)?.try_into()?;
                Box::new(p.take_link(id)?)
            }
            Link::RawTracepoint(name, id) => {
                let p: &mut RawTracePoint = program(ebpf, &name)?.try_into()?;
                Box::new(p.take_link(id)?)
            }
            Link::Kprobe(name, id) => {
                let p: &mut KProbe = program(ebpf, &name)?.try_into()?;
                Box::new(p.take_link(id)?)
            }
            Link::Fentry(name, id) => {
                let p: &mut FEntry = program(ebpf, &name)?.try_into()?;
                Box::new(p.take_link(id)?)
            }
            Link::Fexit(name, id) => {
                let p: &mut FExit = program(ebpf, &name)?.try_into()?;
                Box::new(p.take_link(id)?)
            }
        })
    }
}
