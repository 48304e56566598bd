//! Builds the kernel programs (`tracer-ebpf`, target bpfel-unknown-none, nightly + bpf-linker)
//! and leaves the object in OUT_DIR for `aya::include_bytes_aligned!`.
//!
//! With `AYA_BUILD_SKIP=1` (no BPF toolchain, e.g. `cargo check` elsewhere) an empty object is
//! written instead, and `tracer record` refuses to run with a message saying so.

use std::{env, fs, path::PathBuf};

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../tracer-ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("tracer-ebpf path is not UTF-8")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF programs (run `cargo xtask setup` for the toolchain)")?;
    let object = PathBuf::from(env::var("OUT_DIR")?).join("tracer-ebpf");
    if !object.exists() {
        fs::write(&object, b"")?;
    }
    Ok(())
}
