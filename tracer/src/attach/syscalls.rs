//! Attach `programs/syscalls.rs`: a sys_enter_* / sys_exit_* tracepoint pair per syscall.

use anyhow::Context as _;
use aya::Ebpf;
use tracer_ebpf::tracepoints::{SYS_ENTER_FD, SYS_EXIT_RET, SYSCALLS};

use super::{attach_tracepoint, tracefs};

/// Checks every format file first, so a layout mismatch fails before anything is attached.
pub fn check() -> anyhow::Result<()> {
    for (name, _) in SYSCALLS {
        let enter = format!("sys_enter_{name}");
        let exit = format!("sys_exit_{name}");
        tracefs::check_fields(
            &tracefs::read_format("syscalls", &enter)?,
            "syscalls",
            &enter,
            &[SYS_ENTER_FD],
        )?;
        tracefs::check_fields(
            &tracefs::read_format("syscalls", &exit)?,
            "syscalls",
            &exit,
            &[SYS_EXIT_RET],
        )?;
    }
    Ok(())
}

/// Returns the number of tracepoints attached.
pub fn attach(ebpf: &mut Ebpf) -> anyhow::Result<usize> {
    for (name, _) in SYSCALLS {
        for direction in ["enter", "exit"] {
            let tracepoint = format!("sys_{direction}_{name}");
            attach_tracepoint(ebpf, &tracepoint, "syscalls", &tracepoint)
                .with_context(|| format!("syscall {name}"))?;
        }
    }
    Ok(SYSCALLS.len() * 2)
}
