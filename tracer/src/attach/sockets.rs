//! Attach `programs/sockets.rs`: hooks that map `struct sock` to the target's fds and report
//! data arrival on its sockets (sock:* tracepoints, or fentry or kprobes on the functions they
//! sit in), plus the `sock:inet_sock_set_state` tracepoint in every mode.

use anyhow::ensure;
use aya::{Btf, Ebpf};
use tracer_ebpf::tracepoints::{SET_STATE_LAYOUT, SOCK_IO_FUNCTIONS, SOCK_IO_LAYOUTS};

use super::{
    btf,
    hooks::{At, Hook, Kind},
    tracefs,
};

/// Where a `struct sock`'s network namespace is, for matching new connections on the target's
/// ports by namespace too: `(sock.__sk_common.skc_net.net, net.ns.inum)`. A kernel without
/// network namespaces (CONFIG_NET_NS off) has no `net` member, and one namespace.
pub fn netns_offsets(btf: &btf::Btf) -> anyhow::Result<(u32, u32)> {
    let net = btf.member("sock", &["__sk_common", "skc_net", "net"])?;
    let inum = btf.member("net", &["ns", "inum"])?;
    ensure!(
        net.size == 8 && inum.size == 4,
        "sock's net pointer is {} bytes and net.ns.inum {} on this kernel, the programs read 8 \
         and 4",
        net.size,
        inum.size
    );
    Ok((net.offset, inum.offset))
}

/// The tracepoint every mode needs.
pub fn check() -> anyhow::Result<()> {
    tracefs::check_layout(&SET_STATE_LAYOUT)?;
    Ok(())
}

/// The send, data-ready and receive tracepoints (Linux 6.3+).
pub fn check_tracepoints() -> anyhow::Result<()> {
    for layout in &SOCK_IO_LAYOUTS {
        tracefs::check_layout(layout)?;
    }
    Ok(())
}

/// Send, data-ready and receive, in that order.
pub fn io_hooks(kind: Kind) -> [Hook; 3] {
    std::array::from_fn(|i| {
        let function = SOCK_IO_FUNCTIONS[i].to_owned();
        match kind {
            Kind::Tracepoint => Hook::tracepoint("sock", SOCK_IO_LAYOUTS[i].name),
            Kind::Kprobe => Hook::new(format!("kprobe_{function}"), At::Kprobe(function)),
            Kind::Fentry => Hook::new(format!("fentry_{function}"), At::Fentry(function)),
        }
    })
}

pub fn describe(kind: Kind) -> String {
    let functions = SOCK_IO_FUNCTIONS.join(", ");
    match kind {
        Kind::Tracepoint => format!("{} sock:*", SOCK_IO_LAYOUTS.len() + 1),
        Kind::Kprobe => format!("kprobe on {functions} + tracepoint sock:inet_sock_set_state"),
        Kind::Fentry => format!("fentry on {functions} + tracepoint sock:inet_sock_set_state"),
    }
}

pub fn attach(ebpf: &mut Ebpf, kind: Kind, btf: Option<&Btf>) -> anyhow::Result<usize> {
    let set_state = Hook::tracepoint(SET_STATE_LAYOUT.category, SET_STATE_LAYOUT.name);
    for hook in io_hooks(kind).iter().chain([&set_state]) {
        hook.attach(ebpf, btf)?;
    }
    Ok(SOCK_IO_LAYOUTS.len() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_offsets_through_possible_net_t_and_ns_common() {
        let btf = btf::Btf::parse(&btf::tests::sample()).unwrap();
        assert_eq!(netns_offsets(&btf).unwrap(), (48, 32));
    }
}
