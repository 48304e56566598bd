//! Builds the kernel programs (`tracer-ebpf`, target bpfel-unknown-none, nightly + bpf-linker)
//! and leaves the object in OUT_DIR for `aya::include_bytes_aligned!`.
//!
//! With `AYA_BUILD_SKIP=1` (no BPF toolchain, e.g. `cargo check` elsewhere) an empty object is
//! written instead, and `tracer record` refuses to run with a message saying so.
//!
//! The inner build is run here rather than by `aya_build::build_ebpf`, which relays every line
//! of it as a `cargo:warning`, and cargo replays those on every build that reuses this script's
//! output: ~40 lines of "Compiling …" on each `cargo xtask run-tracer`. Here its progress is
//! printed only when it fails (or with `TRACER_EBPF_VERBOSE=1`); rustc's warnings on the
//! kernel programs are still passed on. Otherwise it builds as aya-build 0.2.0 does.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

const PACKAGE: &str = "tracer-ebpf";
const TOOLCHAIN: &str = "nightly";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=TRACER_EBPF_VERBOSE");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let object = out_dir.join(PACKAGE);
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        println!("cargo:warning=AYA_BUILD_SKIP is set: the eBPF programs are not built");
        if !object.exists() {
            fs::write(&object, b"")?;
        }
        return Ok(());
    }
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../tracer-ebpf");
    // The build-dependency on tracer-ebpf covers its library; this covers its binary.
    println!("cargo:rerun-if-changed={}", ebpf_dir.display());
    build_ebpf(&out_dir, &object)
        .context("building the eBPF programs (run `cargo xtask setup` for the toolchain)")
}

/// `cargo build` of the kernel programs with the nightly toolchain, output captured.
fn build_ebpf(out_dir: &Path, object: &Path) -> anyhow::Result<()> {
    let target = match env::var("CARGO_CFG_TARGET_ENDIAN")?.as_str() {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        other => bail!("unsupported endianness {other}"),
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH")?;
    let arch = if arch.starts_with("riscv64") {
        "riscv64"
    } else {
        &arch
    };
    let rustflags = [
        &format!("--cfg=bpf_target_arch=\"{arch}\""),
        "-Cdebuginfo=2",
        "-Clink-arg=--btf",
    ]
    .join("\x1f");
    let mut cargo = Command::new("rustup");
    cargo
        .args(["run", TOOLCHAIN, "cargo", "build"])
        .args(["--package", PACKAGE, "--bins"])
        .args(["--message-format=json", "--release"])
        .args(["--target", target, "-Z", "build-std=core"])
        // Its own target dir: the outer cargo holds the lock on ours.
        .arg("--target-dir")
        .arg(out_dir.join("aya-build/target").join(PACKAGE))
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        // The outer build's compiler is not the nightly one.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    let output = cargo
        .output()
        .with_context(|| format!("running {cargo:?} (is rustup installed?)"))?;
    let mut built = None;
    let mut diagnostics = String::new();
    for line in output.stdout.split(|&b| b == b'\n') {
        let Ok(message) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        match message["reason"].as_str() {
            Some("compiler-artifact") if message["target"]["name"] == PACKAGE => {
                built = message["executable"].as_str().map(PathBuf::from);
            }
            Some("compiler-message") => {
                diagnostics += message["message"]["rendered"].as_str().unwrap_or_default();
            }
            _ => {}
        }
    }
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        // cargo shows a failing build script's stderr.
        eprintln!("{diagnostics}{log}");
        bail!("{cargo:?} failed ({})", output.status);
    }
    let verbose = env::var("TRACER_EBPF_VERBOSE").is_ok_and(|v| v == "1");
    for line in diagnostics.lines().chain(log.lines().filter(|_| verbose)) {
        println!("cargo:warning={line}");
    }
    let built = built.with_context(|| format!("cargo build produced no {PACKAGE} binary"))?;
    fs::copy(&built, object)
        .with_context(|| format!("copying {} to {}", built.display(), object.display()))?;
    Ok(())
}
