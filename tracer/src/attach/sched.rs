//! Attach `programs/sched.rs`: the scheduler tracepoints, raw where the kernel's BTF gives the
//! `task_struct` members their programs read (`raw_*`), else classic, whose record fields are
//! checked here against tracefs. Prev's tgid comes from `current` in both.

use anyhow::{bail, ensure};
use aya::Ebpf;
use tracer_ebpf::{
    abi::Offsets,
    tracepoints::{FORK_VARIANTS, SCHED_LAYOUTS},
};

use super::{
    btf::Btf,
    hooks::{At, Hook, Link, SchedKind},
    tracefs,
};

const FORK: &str = "sched_process_fork";

/// The raw tracepoints' arguments the programs read, as the kernel's BTF spells them; `None`:
/// attached, but no argument read.
const RAW_ARGS: [(&str, Option<&[&str]>); 5] = [
    (
        "sched_switch",
        Some(&[
            "bool",
            "struct task_struct *",
            "struct task_struct *",
            "unsigned int",
        ]),
    ),
    ("sched_wakeup", Some(&["struct task_struct *"])),
    ("sched_wakeup_new", Some(&["struct task_struct *"])),
    (
        FORK,
        Some(&["struct task_struct *", "struct task_struct *"]),
    ),
    ("sched_process_exit", None),
];

/// Whether the raw programs can run on this kernel, and the `task_struct` offsets they need:
/// every raw tracepoint with the arguments they read, and the members with the sizes they read.
pub fn raw_offsets(btf: &Btf) -> anyhow::Result<Offsets> {
    for (name, want) in RAW_ARGS {
        let args = btf.raw_tracepoint_args(name)?;
        if let Some(want) = want {
            ensure!(
                args.len() >= want.len() && args[..want.len()] == *want,
                "raw tracepoint {name} takes ({}) on this kernel, the programs read ({})",
                args.join(", "),
                want.join(", ")
            );
        }
    }
    let member = |name: &str, size: u32| -> anyhow::Result<u32> {
        let m = btf.member("task_struct", &[name])?;
        ensure!(
            m.size == size,
            "task_struct.{name} is {} bytes on this kernel, the programs read {size}",
            m.size
        );
        Ok(m.offset)
    };
    Ok(Offsets {
        task_pid: member("pid", 4)?,
        task_comm: member("comm", 16)?,
        task_exit_state: member("exit_state", 4)?,
        task_tgid: member("tgid", 4)?,
        ..Offsets::default()
    })
}

pub fn check(kind: SchedKind) -> anyhow::Result<()> {
    match kind {
        SchedKind::Tracepoint => {
            for layout in &SCHED_LAYOUTS {
                let format = tracefs::check_layout(layout)?;
                if layout.name == "sched_switch" {
                    tracefs::check_task_report_max(&format.print_fmt)?;
                    tracefs::check_exit_states(&format.print_fmt)?;
                }
            }
            fork_program()?;
        }
        // The raw programs test exit_state against the same EXIT_DEAD and EXIT_ZOMBIE bits,
        // which the classic record reports unchanged.
        SchedKind::RawTracepoint => {
            let format = tracefs::read_format("sched", "sched_switch")?;
            tracefs::check_exit_states(&format.print_fmt)?;
        }
    }
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

/// The hook of tracepoint `name` (a `sched:*` one but fork) in `kind`'s variant.
pub fn hook(kind: SchedKind, name: &str) -> Hook {
    match kind {
        SchedKind::RawTracepoint => {
            Hook::new(format!("raw_{name}"), At::RawTracepoint(name.into()))
        }
        SchedKind::Tracepoint => Hook::tracepoint("sched", name),
    }
}

/// First: threads the target creates from now on are added to TIDS by the kernel, so seeding
/// TIDS from /proc afterwards misses none.
pub fn attach_fork(ebpf: &mut Ebpf, kind: SchedKind) -> anyhow::Result<Link> {
    let hook = match kind {
        SchedKind::RawTracepoint => hook(kind, FORK),
        SchedKind::Tracepoint => Hook::new(
            fork_program()?,
            At::Tracepoint {
                category: "sched",
                name: FORK.to_owned(),
            },
        ),
    };
    hook.attach(ebpf, None)
}

pub fn attach_rest(ebpf: &mut Ebpf, kind: SchedKind) -> anyhow::Result<usize> {
    for layout in &SCHED_LAYOUTS {
        hook(kind, layout.name).attach(ebpf, None)?;
    }
    Ok(SCHED_LAYOUTS.len() + 1)
}

pub fn describe(kind: SchedKind, n: usize) -> String {
    match kind {
        SchedKind::RawTracepoint => format!("{n} raw sched_* (task_struct offsets from BTF)"),
        SchedKind::Tracepoint => format!("{n} sched:*"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::btf::tests::Writer;

    #[test]
    fn raw_offsets_from_btf_and_a_changed_argument_refused() {
        let build = |switch_state: &str| {
            let mut w = Writer::new();
            let int = w.int("int", 4);
            let uint = w.int(switch_state, 4);
            let char_ = w.int("char", 1);
            let bool_ = w.int("_Bool", 1);
            let bool_t = w.typedef("bool", bool_);
            let comm = w.array(char_, int, 16);
            let task = w.structure(
                "task_struct",
                3000,
                &[
                    ("pid", int, 1000),
                    ("exit_state", int, 996),
                    ("tgid", int, 1004),
                    ("comm", comm, 2000),
                ],
            );
            let task_ptr = w.ptr(task);
            let void_ptr = w.ptr(0);
            for (name, params) in [
                (
                    "sched_switch",
                    vec![void_ptr, bool_t, task_ptr, task_ptr, uint],
                ),
                ("sched_wakeup", vec![void_ptr, task_ptr]),
                ("sched_wakeup_new", vec![void_ptr, task_ptr]),
                ("sched_process_fork", vec![void_ptr, task_ptr, task_ptr]),
                ("sched_process_exit", vec![void_ptr, task_ptr, bool_t]),
            ] {
                let proto = w.func_proto(&params);
                let ptr = w.ptr(proto);
                w.typedef(&format!("btf_trace_{name}"), ptr);
            }
            Btf::parse(&w.bytes()).unwrap()
        };
        let offsets = raw_offsets(&build("unsigned int")).unwrap();
        assert_eq!(
            (offsets.task_pid, offsets.task_comm, offsets.task_exit_state),
            (1000, 2000, 996)
        );
        let err = raw_offsets(&build("long")).unwrap_err().to_string();
        assert!(
            err.contains(
                "sched_switch takes (bool, struct task_struct *, struct task_struct *, long)"
            ),
            "{err}"
        );
    }

    #[test]
    fn this_kernels_raw_tracepoints() {
        let Ok(btf) = Btf::from_sys_fs() else {
            eprintln!("SKIPPED this_kernels_raw_tracepoints: no kernel BTF");
            return;
        };
        let offsets = raw_offsets(&btf).unwrap();
        assert!(offsets.task_pid > 0 && offsets.task_comm > 0 && offsets.task_exit_state > 0);
        assert_eq!(
            offsets.task_tgid,
            offsets.task_pid + 4,
            "tgid follows pid in task_struct"
        );
    }
}
