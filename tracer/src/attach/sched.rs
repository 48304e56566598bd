//! Attach `programs/sched.rs`: classic sched tracepoints (not tp_btf: the programs read the
//! record's fields at offsets checked here, and prev's tgid comes from `current`).

use aya::Ebpf;
use tracer_ebpf::tracepoints::SCHED_LAYOUTS;

use super::{attach_tracepoint, tracefs};

const FORK: &str = "sched_process_fork";

pub fn check() -> anyhow::Result<()> {
    for layout in &SCHED_LAYOUTS {
        let format = tracefs::check_layout(layout)?;
        if layout.name == "sched_switch" {
            tracefs::check_task_report_max(&format.print_fmt)?;
        }
    }
    Ok(())
}

/// First: threads the target creates from now on are added to TIDS by the kernel, so seeding
/// TIDS from /proc afterwards misses none.
pub fn attach_fork(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    attach_tracepoint(ebpf, FORK, "sched", FORK)
}

pub fn attach_rest(ebpf: &mut Ebpf) -> anyhow::Result<usize> {
    let rest = SCHED_LAYOUTS.iter().filter(|layout| layout.name != FORK);
    let mut count = 1;
    for layout in rest {
        attach_tracepoint(ebpf, layout.name, layout.category, layout.name)?;
        count += 1;
    }
    Ok(count)
}
