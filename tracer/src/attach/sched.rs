//! Attach `programs/sched.rs`: classic sched tracepoints (not tp_btf: the programs read the
//! record's fields at offsets checked here, and prev's tgid comes from `current`).

use anyhow::bail;
use aya::Ebpf;
use tracer_ebpf::tracepoints::{FORK_VARIANTS, SCHED_LAYOUTS};

use super::{attach_tracepoint, tracefs};

const FORK: &str = "sched_process_fork";

pub fn check() -> anyhow::Result<()> {
    for layout in &SCHED_LAYOUTS {
        let format = tracefs::check_layout(layout)?;
        if layout.name == "sched_switch" {
            tracefs::check_task_report_max(&format.print_fmt)?;
            tracefs::check_exit_states(&format.print_fmt)?;
        }
    }
    fork_program()?;
    Ok(())
}

/// The fork program whose `child_pid` offset is this kernel's (the comms before it are inline
/// arrays on some kernels and `__data_loc` strings on others).
fn fork_program() -> anyhow::Result<&'static str> {
    let format = tracefs::read_format("sched", FORK)?;
    let here = format.fields.iter().find(|f| f.name == "child_pid");
    for (program, field) in FORK_VARIANTS {
        if here.is_some_and(|f| f.offset == field.offset && f.size == field.size) {
            return Ok(program);
        }
    }
    let known: Vec<String> = FORK_VARIANTS
        .iter()
        .map(|(_, f)| format!("offset {} size {}", f.offset, f.size))
        .collect();
    match here {
        Some(f) => bail!(
            "sched:{FORK} field `child_pid` is at offset {} size {} on this kernel; the kernel \
             programs read {}: add a variant to tracer-ebpf for this layout",
            f.offset,
            f.size,
            known.join(" or ")
        ),
        None => bail!("sched:{FORK} has no field `child_pid` on this kernel"),
    }
}

/// First: threads the target creates from now on are added to TIDS by the kernel, so seeding
/// TIDS from /proc afterwards misses none.
pub fn attach_fork(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    attach_tracepoint(ebpf, fork_program()?, "sched", FORK)
}

pub fn attach_rest(ebpf: &mut Ebpf) -> anyhow::Result<usize> {
    for layout in &SCHED_LAYOUTS {
        attach_tracepoint(ebpf, layout.name, layout.category, layout.name)?;
    }
    Ok(SCHED_LAYOUTS.len() + 1)
}
