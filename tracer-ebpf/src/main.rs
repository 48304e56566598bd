//! Kernel programs. Built for `bpfel-unknown-none` by the tracer's build script; on the host
//! this binary is an empty stub so the workspace builds and tests without the BPF toolchain.
//!
//! Every program filters to the target (`CONFIG.tgid`), or to the target's sockets and threads
//! where it runs outside the target's context, and writes [`tracer_ebpf::abi::Event`]s to the
//! one ring buffer `EVENTS`. The semantics of each event are in `docs/events.md` and `abi.rs`.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
// The BPF target has no atomic read-modify-write in `core::sync::atomic` (no CAS), but LLVM
// lowers the fetch-add intrinsic to BPF's atomic add; the counters need it (programs/maps.rs).
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(internal_features, reason = "atomic_xadd, see above")
)]

#[cfg(target_arch = "bpf")]
mod programs;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed.
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
