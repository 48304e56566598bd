//! Kernel programs. Built for `bpfel-unknown-none` by the tracer's build script; on the host
//! this binary is an empty stub so the workspace builds and tests without the BPF toolchain.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]

#[cfg(not(target_arch = "bpf"))]
fn main() {}
