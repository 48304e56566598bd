//! Attach `programs/sockets.rs`: sock:* tracepoints that map `struct sock` to the target's fds
//! and report data arrival on its sockets.

use aya::Ebpf;
use tracer_ebpf::tracepoints::SOCK_LAYOUTS;

use super::{attach_tracepoint, tracefs};

pub fn check() -> anyhow::Result<()> {
    for layout in &SOCK_LAYOUTS {
        tracefs::check_layout(layout)?;
    }
    Ok(())
}

pub fn attach(ebpf: &mut Ebpf) -> anyhow::Result<usize> {
    for layout in &SOCK_LAYOUTS {
        attach_tracepoint(ebpf, layout.name, layout.category, layout.name)?;
    }
    Ok(SOCK_LAYOUTS.len())
}
