//! Attach `programs/syscalls.rs`: an enter/exit pair per traced syscall, as tracepoints
//! (`syscalls:sys_{enter,exit}_*`), fentry/fexit or kprobe/kretprobe on `__x64_sys_*`.
//!
//! A kretprobe holds one of its max(10, 2 × CPUs) instances (aya sets no maxactive) for every
//! call in flight machine-wide, a blocked `read` in any process included; a call entered with
//! none free emits no SYSCALL event. fexit has no such limit, one reason `auto` prefers fentry.

use anyhow::Context as _;
use aya::{Btf, Ebpf};
use tracer_ebpf::tracepoints::{DATA_SYSCALL_BUFS, SYS_ENTER_FD, SYS_EXIT_RET, SYSCALLS};

use super::{
    hooks::{At, Hook, Kind, Link},
    tracefs,
};

/// Checks every format file, so a layout mismatch is found before anything is attached.
pub fn check_tracepoints() -> anyhow::Result<()> {
    for (name, _) in SYSCALLS {
        tracefs::check("syscalls", &format!("sys_enter_{name}"), &[SYS_ENTER_FD])?;
        tracefs::check("syscalls", &format!("sys_exit_{name}"), &[SYS_EXIT_RET])?;
    }
    Ok(())
}

/// Kernel-only mode: the data syscalls' enter records have their buffer where the programs
/// read it.
pub fn check_data_tracepoints() -> anyhow::Result<()> {
    for (name, buf) in DATA_SYSCALL_BUFS {
        tracefs::check("syscalls", &format!("sys_enter_{name}"), &[buf])?;
    }
    Ok(())
}

/// The enter and exit hooks of syscall `name` (as in `sys_enter_<name>`).
pub fn hooks(kind: Kind, name: &str) -> [Hook; 2] {
    let function = format!("__x64_sys_{name}");
    match kind {
        Kind::Tracepoint => [
            Hook::tracepoint("syscalls", &format!("sys_enter_{name}")),
            Hook::tracepoint("syscalls", &format!("sys_exit_{name}")),
        ],
        Kind::Kprobe => [
            Hook::new(format!("kprobe_sys_{name}"), At::Kprobe(function.clone())),
            Hook::new(format!("kretprobe_sys_{name}"), At::Kprobe(function)),
        ],
        Kind::Fentry => [
            Hook::new(format!("fentry_sys_{name}"), At::Fentry(function.clone())),
            Hook::new(format!("fexit_sys_{name}"), At::Fexit(function)),
        ],
    }
}

/// What the attach line says: how many hooks, on what.
pub fn describe(kind: Kind) -> String {
    let n = SYSCALLS.len() * 2;
    match kind {
        Kind::Tracepoint => format!("{n} syscalls:sys_{{enter,exit}}_*"),
        Kind::Kprobe => format!("{n} kprobe/kretprobe on __x64_sys_*"),
        Kind::Fentry => format!("{n} fentry/fexit on __x64_sys_*"),
    }
}

/// The warning for a session whose syscalls are kretprobes: their exits can be dropped when
/// the kretprobe's instances run out, counted only by kernels whose perf links report
/// `missed` (6.7+).
pub fn fallback_warning(kind: Kind) -> Option<String> {
    (kind == Kind::Kprobe).then(|| {
        "tracer: WARNING syscalls fell back to kprobe/kretprobe: a call entered while all of a \
         kretprobe's max(10, 2 x CPUs) instances are held (by blocked calls in any process) \
         emits no exit; requests missing one are incomplete or misattributed, and breakdown.json's \
         drops.kretprobe_missed counts them where the kernel says (6.7+). `--attach fentry` or \
         `tracepoint` has no such limit"
            .to_owned()
    })
}

/// Returns the links attached (the kretprobes' missed counts are read from them).
pub fn attach(ebpf: &mut Ebpf, kind: Kind, btf: Option<&Btf>) -> anyhow::Result<Vec<Link>> {
    let mut links = Vec::new();
    for (name, _) in SYSCALLS {
        for hook in hooks(kind, name) {
            links.push(
                hook.attach(ebpf, btf)
                    .with_context(|| format!("syscall {name}"))?,
            );
        }
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This kernel's data syscalls have their buffer where kernel-only mode reads it.
    #[test]
    fn data_syscall_buffers_are_where_the_programs_read_them() {
        if tracefs::read_format("syscalls", "sys_enter_read").is_err() {
            eprintln!("SKIPPED data_syscall_buffers: no tracefs here");
            return;
        }
        check_data_tracepoints().unwrap();
    }

    /// Issue 21 item 9: falling back to kretprobes is said out loud, the other modes are not.
    #[test]
    fn item9_kprobe_fallback_warns() {
        let warning = fallback_warning(Kind::Kprobe).unwrap();
        assert!(
            warning.contains("WARNING") && warning.contains("kretprobe"),
            "{warning}"
        );
        assert_eq!(fallback_warning(Kind::Tracepoint), None);
        assert_eq!(fallback_warning(Kind::Fentry), None);
    }
}
