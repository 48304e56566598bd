//! Attach `programs/sites.rs`: one uprobe per probe site, at the file offset its USDT note (or
//! symbol) gives, scoped to the target.
//! Every hit is a trap, so only the sites the split needs are attached unless `--phases`.

use std::num::NonZeroU32;

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{UProbe, uprobe::UProbeScope},
};
use tracer_ebpf::sites::Site;

use super::target::Target;

/// The kernel program for a site: `gw_probe_<x>` → `site_<x>`.
pub fn program_name(site: Site) -> String {
    format!("site_{}", site.probe_name())
}

/// The sites attached: those the split needs, plus `phase` when asked for.
pub fn attached(phases: bool) -> impl Iterator<Item = Site> {
    Site::ALL
        .into_iter()
        .filter(move |site| site.needed() || phases)
}

pub fn attach(ebpf: &mut Ebpf, target: &Target, phases: bool) -> anyhow::Result<usize> {
    let mut count = 0;
    for site in attached(phases) {
        // The offset Target::open found the NOP5 at, in the file it opened: not looked up again.
        let offset = target.sites.offset(site).with_context(|| {
            format!(
                "{} lacks probe site {}",
                target.exe_name.display(),
                site.symbol()
            )
        })?;
        attach_one(ebpf, &program_name(site), offset, &target.exe, target.pid)
            .with_context(|| format!("probe site {}", site.symbol()))?;
        count += 1;
    }
    Ok(count)
}

/// Loads (once) and attaches one site program at file `offset` of `binary` for process `pid`.
pub fn attach_one(
    ebpf: &mut Ebpf,
    program: &str,
    offset: u64,
    binary: &std::path::Path,
    pid: NonZeroU32,
) -> anyhow::Result<()> {
    let uprobe: &mut UProbe = ebpf
        .program_mut(program)
        .with_context(|| format!("{program} missing from the eBPF object"))?
        .try_into()?;
    if uprobe.fd().is_err() {
        uprobe
            .load()
            .with_context(|| format!("loading {program}"))?;
    }
    uprobe
        .attach(offset, binary, UProbeScope::OneProcess(pid))
        .with_context(|| {
            format!(
                "attaching uprobe at file offset {offset:#x} of {}",
                binary.display()
            )
        })?;
    Ok(())
}
