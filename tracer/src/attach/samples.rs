//! Attach `programs/samples.rs`: a cpu-clock perf event per online CPU (all processes, since a
//! per-pid perf event would follow only one thread); the program keeps the target's samples.

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
    util::online_cpus,
};

/// Returns the number of CPUs sampled.
pub fn attach(ebpf: &mut Ebpf, hz: u64) -> anyhow::Result<usize> {
    let program: &mut PerfEvent = ebpf
        .program_mut("cpu_sample")
        .context("cpu_sample missing from the eBPF object")?
        .try_into()?;
    program.load().context("loading cpu_sample")?;
    let cpus = online_cpus().map_err(|(what, err)| anyhow::anyhow!("{what}: {err}"))?;
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
    Ok(cpus.len())
}
