//! The fuzz targets in `fuzz/` (cargo-fuzz, nightly): `cargo xtask fuzz` for a campaign, and
//! [`ci_step`], the brief run on the committed seeds that `cargo xtask test` makes.
//!
//! The targets are `fuzz/Cargo.toml`'s `[[bin]]` entries, as `cargo fuzz list` reads them, so
//! adding one is its file and its entry. Neither command writes into `fuzz/corpus/`:
//! libFuzzer writes new inputs only into the first corpus directory it is given, and the
//! committed seeds always come second. Crash inputs go to `fuzz/target/artifacts/<target>/`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

use harness::workspace::{log_dir, log_tail, root};

use crate::setup;

/// Seconds of mutation per target in `cargo xtask test`, after its seeds have run.
const CI_SECONDS: u64 = 10;

#[derive(clap::Args)]
pub struct Args {
    /// Only this target (repeatable); default every target.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

/// How the targets are built.
#[derive(Clone, Copy)]
enum Build {
    /// For the brief CI run: dev profile (debug assertions, overflow checks), no sanitizer. A
    /// clean build takes a fraction of the optimized one's time.
    Quick,
    /// For campaigns: optimized, with debug assertions and AddressSanitizer, as cargo-fuzz
    /// builds by default.
    Campaign,
}

impl Build {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Build::Quick => &["--dev", "--sanitizer", "none"],
            Build::Campaign => &["-O", "--debug-assertions"],
        }
    }

    fn profile_dir(self) -> &'static str {
        match self {
            Build::Quick => "debug",
            Build::Campaign => "release",
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    setup::ensure()?;
    setup::ensure_fuzz()?;
    let all = targets()?;
    let chosen = if args.targets.is_empty() {
        all
    } else {
        if let Some(unknown) = args.targets.iter().find(|t| !all.contains(t)) {
            bail!(
                "no fuzz target {unknown:?}; the targets: {}",
                all.join(", ")
            );
        }
        args.targets
    };
    // Kept between campaigns, so the next one starts where this one stopped.
    let result = fuzz_all(
        Build::Campaign,
        &chosen,
        args.seconds,
        &fuzz_dir().join("target/corpus"),
    );
    println!(
        "new inputs are in fuzz/target/corpus/<target>/; to keep some as seeds, copy them into \
         fuzz/corpus/<target>/ (cargo fuzz cmin shrinks a corpus)"
    );
    result
}

/// `cargo xtask test`'s step: every target replays its seeds, then mutates them for
/// [`CI_SECONDS`], in a temporary corpus.
pub fn ci_step() -> anyhow::Result<()> {
    setup::ensure_fuzz()?;
    let work = tempfile::tempdir().context("creating a temp dir for the fuzz corpus")?;
    fuzz_all(Build::Quick, &targets()?, CI_SECONDS, work.path())
}

/// Builds the targets, then runs each for `seconds` with its working corpus in
/// `work/<target>/`; prints a line for each.
fn fuzz_all(build: Build, targets: &[String], seconds: u64, work: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let binaries = build_targets(build)?;
    println!(
        "fuzz: {} targets built in {:.0} s",
        targets.len(),
        started.elapsed().as_secs_f64()
    );
    let mut failed = Vec::new();
    for target in targets {
        let run = fuzz(&binaries, target, seconds, &work.join(target))?;
        println!("{}", run.summary(target, build));
        if !run.ok {
            failed.push(target.as_str());
        }
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

fn fuzz_dir() -> PathBuf {
    root().join("fuzz")
}

/// `cargo +nightly fuzz ARGS`, from the workspace root.
fn cargo_fuzz(args: &[&str]) -> Command {
    let mut command = Command::new("rustup");
    command
        .args(["run", "nightly", "cargo", "fuzz"])
        .args(args)
        .current_dir(root())
        // The outer cargo's compiler is the stable one.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        // The targets never load the kernel programs: the tracer's build script leaves them
        // out (an empty object) instead of compiling them again for this target dir.
        .env("AYA_BUILD_SKIP", "1");
    command
}

/// The targets: fuzz/Cargo.toml's `[[bin]]` entries.
fn targets() -> anyhow::Result<Vec<String>> {
    let out = cargo_fuzz(&["list"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo fuzz list")?;
    if !out.status.success() {
        bail!("cargo fuzz list failed ({})", out.status);
    }
    let targets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| line.trim().to_owned())
        .filter(|line| !line.is_empty())
        .collect();
    if targets.is_empty() {
        bail!("cargo fuzz list found no targets in fuzz/Cargo.toml");
    }
    Ok(targets)
}

/// Builds every target; returns the directory of the binaries. cargo's output goes to a log,
/// quoted when the build fails.
fn build_targets(build: Build) -> anyhow::Result<PathBuf> {
    // fuzz/Cargo.lock is untracked: started from the workspace's each time, so the crates both
    // use are the versions main locks, and a dependency change never edits a tracked file.
    let (lock, fuzz_lock) = (root().join("Cargo.lock"), fuzz_dir().join("Cargo.lock"));
    fs::copy(&lock, &fuzz_lock)
        .with_context(|| format!("copying {} to {}", lock.display(), fuzz_lock.display()))?;
    let log = log_dir()?.join("fuzz-build.log");
    println!(
        "fuzz: building the targets (cargo fuzz build {}); log: {}",
        build.flags().join(" "),
        log.display()
    );
    harness::install::run_logged(&mut cargo_fuzz(&[&["build"], build.flags()].concat()), &log)?;
    Ok(fuzz_dir()
        .join("target")
        .join(host_triple()?)
        .join(build.profile_dir()))
}

/// cargo-fuzz builds for the host triple by default.
fn host_triple() -> anyhow::Result<String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .context("rustc -vV printed no host triple")
}

/// What one target's run did.
struct Run {
    /// Committed seeds replayed first.
    seeds: usize,
    execs: Option<u64>,
    seconds: f64,
    /// The input that failed (a panic, a timeout, out of memory), as libFuzzer wrote it.
    failing_input: Option<PathBuf>,
    /// libFuzzer exited 0.
    ok: bool,
    log: PathBuf,
}

impl Run {
    fn summary(&self, target: &str, build: Build) -> String {
        let execs = self
            .execs
            .map_or_else(|| "? execs".to_owned(), |n| format!("{n} execs"));
        if self.ok {
            return format!(
                "fuzz {target}: ok, {} seeds then {execs} in all, {:.0} s",
                self.seeds, self.seconds
            );
        }
        let mut text = format!(
            "fuzz {target}: FAILED after {execs} in {:.0} s; from {}:\n{}",
            self.seconds,
            self.log.display(),
            excerpt(&self.log)
        );
        if let Some(input) = &self.failing_input {
            let input = input.strip_prefix(root()).unwrap_or(input);
            text += &format!(
                "\nthe failing input: {}\nreproduce (from the workspace root): \
                 AYA_BUILD_SKIP=1 cargo +nightly fuzz run {} {target} {}",
                input.display(),
                build.flags().join(" "),
                input.display()
            );
        }
        text
    }
}

/// The panic's message when the target panicked, else the log's last lines (a timeout, an
/// out-of-memory, a crash in unsafe code).
fn excerpt(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let panic: Vec<String> = (text.lines())
        .skip_while(|line| !line.contains("panicked at"))
        .take_while(|line| !line.starts_with("stack backtrace:"))
        .take(20)
        .map(|line| format!("    {line}"))
        .collect();
    if panic.is_empty() {
        log_tail(log, 30)
    } else {
        panic.join("\n")
    }
}

/// Runs `target` for `seconds` on a working corpus `work` (created; new inputs go there)
/// after replaying the committed seeds in fuzz/corpus/<target>/ (read, never written).
fn fuzz(binaries: &Path, target: &str, seconds: u64, work: &Path) -> anyhow::Result<Run> {
    let seeds = fuzz_dir().join("corpus").join(target);
    let artifacts = fuzz_dir().join("target/artifacts").join(target);
    for dir in [work, &artifacts] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let log = log_dir()?.join(format!("fuzz-{target}.log"));
    let file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let started = Instant::now();
    let mut command = Command::new(binaries.join(target));
    command
        .arg(format!("-max_total_time={seconds}"))
        // A single input that runs this long is a hang.
        .arg("-timeout=10")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(work);
    let seed_count = fs::read_dir(&seeds).map_or(0, |dir| dir.count());
    if seed_count > 0 {
        command.arg(&seeds);
    }
    let status = command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("running fuzz target {target}"))?;
    let text = fs::read_to_string(&log).unwrap_or_default();
    Ok(Run {
        seeds: seed_count,
        execs: text.lines().find_map(|line| {
            let n = line.strip_prefix("stat::number_of_executed_units:")?;
            n.trim().parse().ok()
        }),
        seconds: started.elapsed().as_secs_f64(),
        failing_input: text.lines().find_map(|line| {
            let (_, path) = line.split_once("Test unit written to ")?;
            Some(PathBuf::from(path.trim()))
        }),
        ok: status.success(),
        log,
    })
}
