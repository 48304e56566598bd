//! `cargo xtask vmtest`: the tracer's root tests in a guest kernel that has kprobes and fentry
//! (this host's has neither). The guest is QEMU under TCG with the host's root shared over
//! virtiofs: the test binaries are built here and run there unchanged; nothing is compiled in
//! the guest. QEMU, virtiofsd and a static busybox are installed with apt when missing; the
//! kernel package is downloaded and unpacked under the target directory, not installed.

mod initramfs;
mod kernel;
mod qemu;

use std::{
    env,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use harness::procs;

use crate::setup;

#[derive(clap::Args)]
pub struct Args {
    /// The guest kernel.
    #[arg(long, value_enum, default_value = "debian-6.1")]
    kernel: kernel::Choice,
    /// The tracer's `--attach` modes to run each test with, comma-separated (auto, tracepoint,
    /// kprobe, fentry).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    attach: Vec<String>,
    /// Root test targets of the tracer package to run in the guest, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "e2e_gateway")]
    tests: Vec<String>,
    /// The e2e test's request rate in the guest (its default, 300/s, is past what the
    /// gateway serves under emulation).
    #[arg(long, default_value_t = 50)]
    rate: u32,
    /// Give up on the guest after this many seconds.
    #[arg(long, default_value_t = 1200)]
    timeout: u64,
}

const PACKAGES: [&str; 2] = ["qemu-system-x86", "busybox-static"];
const BUSYBOX: &str = "/bin/busybox";
/// 2 matches the tests' CPU 0 / CPU 1 pinning (one host thread emulates both: `qemu.rs`).
const GUEST_CPUS: u32 = 2;
const GUEST_MIB: u32 = 2048;

pub fn run(args: Args) -> anyhow::Result<()> {
    for mode in &args.attach {
        ensure!(
            ["auto", "tracepoint", "kprobe", "fentry"].contains(&mode.as_str()),
            "--attach {mode}: expected auto, tracepoint, kprobe or fentry"
        );
    }
    ensure!(
        rustix::process::geteuid().is_root(),
        "vmtest needs root (apt-get, and virtiofsd sharing /)"
    );
    setup::ensure()?;
    let virtiofsd = ensure_packages()?;
    let cache = target_dir().join("vmtest");
    let kernel = kernel::fetch(args.kernel, &cache.join("kernels"))?;

    let bins = procs::Binaries::build()?;
    let bin_dir = bins
        .gateway
        .parent()
        .context("gateway's dir")?
        .to_path_buf();
    let tests = build_tests(&args.tests)?;

    let run_dir = cache.join(format!("run-{}", std::process::id()));
    fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let initramfs = run_dir.join("initramfs.cpio");
    initramfs::write(Path::new(BUSYBOX), &kernel.modules, &initramfs)?;
    let script = run_dir.join("guest.sh");
    fs::write(&script, guest_script(&args, &tests, &bin_dir))?;
    let console_log = cache.join("console.log");

    eprintln!(
        "vmtest: booting {} under QEMU TCG ({GUEST_CPUS} CPUs): {} with --attach {}",
        kernel.package,
        args.tests.join(", "),
        args.attach.join(", ")
    );
    let started = Instant::now();
    let status = qemu::Guest {
        vmlinuz: &kernel.vmlinuz,
        initramfs: &initramfs,
        script: &script,
        virtiofsd: &virtiofsd,
        run_dir: &run_dir,
        console_log: &console_log,
        memory_mib: GUEST_MIB,
        cpus: GUEST_CPUS,
        timeout: Duration::from_secs(args.timeout),
    }
    .run()
    .with_context(|| format!("virtiofsd's log is in {}", run_dir.display()))?;
    let elapsed = started.elapsed().as_secs_f64();
    if status != 0 {
        bail!(
            "the guest's tests failed (exit {status}) after {elapsed:.0}s; console: {}",
            console_log.display()
        );
    }
    let _ = fs::remove_dir_all(&run_dir);
    eprintln!("vmtest: passed in {elapsed:.0}s (boot to power-off)");
    Ok(())
}

/// QEMU and a static busybox, installed when missing; returns virtiofsd's path.
fn ensure_packages() -> anyhow::Result<PathBuf> {
    let missing: Vec<&str> = PACKAGES
        .into_iter()
        .filter(|package| !installed(package))
        .collect();
    if !missing.is_empty() {
        eprintln!("vmtest: installing {}", missing.join(" "));
        // Without recommends: QEMU's pull in a desktop's worth of packages.
        harness::install::apt_install(&missing, false)?;
    }
    if let Some(path) = qemu::find_virtiofsd() {
        return Ok(path);
    }
    // Debian 13 ships it apart from QEMU.
    eprintln!("vmtest: installing virtiofsd");
    harness::install::apt_install(&["virtiofsd"], false)?;
    qemu::find_virtiofsd().context("virtiofsd not found after installing it")
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
}

/// Where cargo builds: `CARGO_TARGET_DIR`, else the workspace's `target/`.
fn target_dir() -> PathBuf {
    let root = harness::workspace::root();
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

/// `cargo test --no-run` of the tracer's `tests`; returns (name, executable) in that order.
fn build_tests(tests: &[String]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(harness::workspace::root())
        .args(["test", "--no-run", "-p", "tracer"]);
    for test in tests {
        command.args(["--test", test]);
    }
    let out = command
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    ensure!(
        out.status.success(),
        "cargo test --no-run failed ({})",
        out.status
    );
    let messages: Vec<serde_json::Value> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect();
    tests
        .iter()
        .map(|test| {
            messages
                .iter()
                .find(|m| m["target"]["name"] == test.as_str() && m["profile"]["test"] == true)
                .and_then(|m| m["executable"].as_str())
                .map(|exe| (test.clone(), PathBuf::from(exe)))
                .with_context(|| format!("cargo built no test binary `{test}`"))
        })
        .collect()
}

/// Runs every test with every mode, says how each went, and exits non-zero if any failed.
fn guest_script(args: &Args, tests: &[(String, PathBuf)], bin_dir: &Path) -> String {
    let mut script = String::from(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export HOME=/root TMPDIR=/dev/shm/tmp RUST_BACKTRACE=1 TRACER_E2E_RATE=@RATE@\n\
         mkdir -p \"$TMPDIR\"\n\
         echo \"vmtest: guest up: Linux $(uname -r), $(nproc) CPUs, kprobe PMU: \
         $([ -e /sys/bus/event_source/devices/kprobe ] && echo yes || echo no)\"\n\
         failed=0\n",
    )
    .replace("@RATE@", &args.rate.to_string());
    let quote = |text: &str| format!("'{}'", text.replace('\'', r"'\''"));
    for mode in &args.attach {
        for (name, exe) in tests {
            let _ = write!(
                script,
                "start=$(date +%s)\n\
                 TRACER_ATTACH={mode} TRACER_E2E_BIN_DIR={bins} {exe} --nocapture --test-threads=1\n\
                 rc=$?\n\
                 echo \"vmtest: {name} --attach {mode}: $([ $rc = 0 ] && echo ok || echo FAILED) \
                 in $(( $(date +%s) - start ))s\"\n\
                 [ $rc = 0 ] || failed=1\n",
                bins = quote(&bin_dir.to_string_lossy()),
                exe = quote(&exe.to_string_lossy()),
            );
        }
    }
    script.push_str("exit $failed\n");
    script
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn the_script_runs_every_test_in_every_mode_and_fails_if_any_did() {
        let cli = Cli::parse_from(["vmtest", "--attach", "fentry,kprobe", "--rate", "40"]);
        let tests = [
            ("e2e_gateway".to_owned(), PathBuf::from("/t/e2e")),
            ("calibrate".to_owned(), PathBuf::from("/t/cal")),
        ];
        let script = guest_script(&cli.args, &tests, Path::new("/t/release"));
        for mode in ["fentry", "kprobe"] {
            assert!(
                script.contains(&format!(
                    "TRACER_ATTACH={mode} TRACER_E2E_BIN_DIR='/t/release' '/t/e2e'"
                )),
                "{script}"
            );
            assert!(
                script.contains(&format!("calibrate --attach {mode}")),
                "{script}"
            );
        }
        assert!(script.contains("TRACER_E2E_RATE=40"), "{script}");
        assert!(script.ends_with("exit $failed\n"), "{script}");
    }

    #[test]
    fn defaults_are_the_smoke_test() {
        let cli = Cli::parse_from(["vmtest"]);
        assert_eq!(cli.args.attach, ["auto"]);
        assert_eq!(cli.args.tests, ["e2e_gateway"]);
    }
}
