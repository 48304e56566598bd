//! Attach `programs/samples.rs`: a cpu-clock perf event per CPU the target may run on (all
//! processes, since a per-pid perf event would follow only one thread); the program keeps the
//! target's samples. A CPU the target cannot run on would only pay for the timer.

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
    util::online_cpus,
};

/// Samples the online CPUs among `allowed` (the target's affinity at attach; all online CPUs
/// if it names none of them). Returns the CPUs sampled.
pub fn attach(ebpf: &mut Ebpf, hz: u64, allowed: &[u32]) -> anyhow::Result<Vec<u32>> {
    let program: &mut PerfEvent = ebpf
        .program_mut("cpu_sample")
        .context("cpu_sample missing from the eBPF object")?
        .try_into()?;
    program.load().context("loading cpu_sample")?;
    let online = online_cpus().map_err(|(what, err)| anyhow::anyhow!("{what}: {err}"))?;
    let mut cpus: Vec<u32> = online
        .iter()
        .copied()
        .filter(|c| allowed.contains(c))
        .collect();
    if cpus.is_empty() {
        cpus = online;
    }
    for &cpu in &cpus {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(hz),
                false,
            )
            .with_context(|| format!("perf_event cpu-clock on CPU {cpu}"))?;
    }
    Ok(cpus)
}
