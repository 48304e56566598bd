//! What the machine must give us before anything is loaded: privileges and BTF.

use std::{fs, path::Path};

use anyhow::{Context as _, bail};

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";

pub fn check() -> anyhow::Result<()> {
    check_privileges()?;
    if !Path::new(BTF_VMLINUX).exists() {
        bail!(
            "{BTF_VMLINUX} is missing: this kernel was built without BTF (CONFIG_DEBUG_INFO_BTF)"
        );
    }
    Ok(())
}

/// Root, or CAP_BPF with CAP_PERFMON (uprobes, perf events) and CAP_SYS_PTRACE (the target's
/// /proc/PID/exe, maps and fds), in the effective set.
fn check_privileges() -> anyhow::Result<()> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .context("no CapEff in /proc/self/status")?;
    let effective = u64::from_str_radix(effective.trim(), 16).context("parsing CapEff")?;
    let has = |cap: u32| effective & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON) && has(CAP_SYS_PTRACE)) {
        return Ok(());
    }
    bail!(
        "tracer record needs root, or the capabilities CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE \
         (effective capabilities are {effective:#x}); run it with sudo (`sudo tracer record \
         ...` or `sudo cargo xtask run-tracer ...`)"
    )
}
