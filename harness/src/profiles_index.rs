//! `cargo xtask profiles-index`: profiles/README.md, the index of the recorded runs, generated
//! from each run's own files so that it cannot drift from them. A unit test regenerates it
//! and compares it with the committed file.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::workspace::{read_json, root as workspace_root};

#[derive(clap::Args)]
pub struct Args {
    /// Only check that profiles/README.md matches the runs; fail, writing nothing, if not.
    #[arg(long)]
    check: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let profiles = workspace_root().join("profiles");
    let index = profiles.join("README.md");
    let text = render(&profiles)?;
    if args.check {
        let committed = std::fs::read_to_string(&index)
            .with_context(|| format!("reading {}", index.display()))?;
        if committed != text {
            bail!(
                "{} is stale: run `cargo xtask profiles-index`",
                index.display()
            );
        }
        println!("{} is up to date", index.display());
    } else {
        std::fs::write(&index, text).with_context(|| format!("writing {}", index.display()))?;
        println!("wrote {}", index.display());
    }
    Ok(())
}

/// The header facts every report writes (`machine::Machine`), as far as the index needs them.
#[derive(Deserialize)]
struct Machine {
    cpu_model: String,
    cpus: usize,
    commit: String,
    date: String,
}

/// Validation runs report the ratio of the arms' medians.
#[derive(Deserialize)]
struct OfMedians {
    ratio_of_medians: f64,
}

#[derive(Deserialize)]
struct Metrics<R> {
    p50_us: R,
    p99_us: R,
    gateway_cpu_us_per_request: R,
}

#[derive(Deserialize)]
struct Comparison<R> {
    metrics: Metrics<R>,
}

#[derive(Deserialize)]
struct ValidationSettings {
    load: f64,
}

#[derive(Deserialize)]
struct Ab {
    comparison: Comparison<OfMedians>,
}

#[derive(Deserialize)]
struct MaxRate {
    ratio_traced_untraced: f64,
}

#[derive(Deserialize)]
struct ValidationCost {
    hits_per_request: HitsPerRequest,
}

/// Mean probe hits per complete request; the site hits tell tracer generations apart.
#[derive(Deserialize)]
struct HitsPerRequest {
    sites: f64,
}

/// `validation.json` of a validation run.
#[derive(Deserialize)]
struct Validation {
    machine: Machine,
    cost: ValidationCost,
    settings: ValidationSettings,
    rate: f64,
    ab: Ab,
    max_rate: MaxRate,
}

#[derive(Deserialize)]
struct Added {
    p99_us: f64,
}

#[derive(Deserialize)]
struct BenchRow {
    load: String,
    delay_ms: u32,
    /// `null` where the row is INVALID.
    added: Option<Added>,
    gate: String,
}

#[derive(Deserialize)]
struct Baseline {
    rev: String,
}

/// `results.json` of a bench run.
#[derive(Deserialize)]
struct Bench {
    machine: Machine,
    quick: bool,
    rows: Vec<BenchRow>,
    /// Only in runs with `--baseline`.
    baseline: Option<Baseline>,
}

/// One line of the index.
struct Run {
    name: String,
    /// The run's own report, relative to profiles/.
    report: String,
    kind: &'static str,
    machine: Machine,
    load: String,
    /// Probe-site hits per request: none for a bench, which runs no tracer.
    site_hits: Option<f64>,
    headline: String,
}

fn ratio(x: f64) -> String {
    format!("×{x:.2}")
}

/// The value of a `- key: value` line of a session README's header, backticks removed.
fn header_line<'a>(readme: &'a str, key: &str, path: &Path) -> anyhow::Result<&'a str> {
    let prefix = format!("- {key}: ");
    readme
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|value| value.trim().trim_matches('`'))
        .with_context(|| format!("{}: no `{prefix}` line", path.display()))
}

/// `--flag VALUE` of the command a README names (its first indented line).
fn command_flag<'a>(readme: &'a str, flag: &str, path: &Path) -> anyhow::Result<&'a str> {
    let command = readme
        .lines()
        .find_map(|line| line.strip_prefix("    cargo xtask "))
        .with_context(|| format!("{}: no `cargo xtask` command line", path.display()))?;
    let mut words = command.split_whitespace();
    words
        .find(|word| *word == flag)
        .and_then(|_| words.next())
        .with_context(|| format!("{}: its command has no `{flag}`", path.display()))
}

/// A tail session of `cargo xtask profile`: its README's header names the machine; the rest
/// comes from its JSON files.
fn session(dir: &Path, name: &str) -> anyhow::Result<Run> {
    let readme_path = dir.join("README.md");
    let readme = std::fs::read_to_string(&readme_path)
        .with_context(|| format!("reading {}", readme_path.display()))?;
    let machine_line = header_line(&readme, "machine", &readme_path)?;
    // "2 × AMD EPYC, 23.5 GiB": the count and the model, as `Machine` holds them.
    let (cpus, rest) = machine_line
        .split_once(" × ")
        .with_context(|| format!("{}: machine line `{machine_line}`", readme_path.display()))?;
    let machine = Machine {
        cpus: cpus
            .parse()
            .with_context(|| format!("{}: cpu count `{cpus}`", readme_path.display()))?,
        cpu_model: rest.split(',').next().unwrap_or(rest).to_owned(),
        commit: header_line(&readme, "commit", &readme_path)?.to_owned(),
        date: header_line(&readme, "date", &readme_path)?.to_owned(),
    };
    let delay_ms = command_flag(&readme, "--delay-ms", &readme_path)?;
    let loadgen: session::loadgen::Summary = read_json(&dir.join("loadgen.json"))?;
    let requested_rate = (loadgen.requested_rate)
        .with_context(|| format!("{}: not an open loop", dir.join("loadgen.json").display()))?;
    // A session given `--max-rate` searched nothing and has no find-max.json.
    let max_rate = match command_flag(&readme, "--max-rate", &readme_path) {
        Ok(given) => given
            .parse::<f64>()
            .with_context(|| format!("{}: --max-rate `{given}`", readme_path.display()))?,
        Err(_) => read_json::<session::loadgen::FindMax>(&dir.join("find-max.json"))?.max_rate,
    };
    let breakdown: session::breakdown::Breakdown = read_json(&dir.join("breakdown.json"))?;
    let load = format!(
        "{:.0}% of max ({:.0} req/s), {delay_ms} ms upstream",
        requested_rate / max_rate * 100.0,
        requested_rate
    );
    // By name, so a tie goes to the same part whatever order the file lists them in.
    let mut parts: Vec<_> = breakdown.tail.parts.iter().collect();
    parts.sort_by(|a, b| a.0.cmp(b.0));
    let (top, top_share) = parts
        .into_iter()
        .filter_map(|(part, p)| p.share.map(|share| (part, share)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .with_context(|| {
            format!(
                "{}: tail.parts has no share",
                dir.join("breakdown.json").display()
            )
        })?;
    // A kernel-only session (a proxy, or `--kernel-only`) has no site hits and says so first.
    let kernel_only = breakdown.kernel_only.is_some();
    let target = match read_json::<crate::profile::SessionFacts>(&dir.join("profile.json")) {
        Ok(profile) if kernel_only => format!("{}, kernel-only: ", profile.target.name()),
        _ if kernel_only => "kernel-only: ".to_owned(),
        _ => String::new(),
    };
    let mut headline = format!(
        "{target}{} requests, {} events lost; tail mostly `{top}` ({:.0}%)",
        breakdown.requests,
        breakdown.lost_events,
        top_share * 100.0
    );
    let effect_path = dir.join("probe-effect.json");
    if effect_path.exists() {
        // Read as the session's README reads it: the median of the paired ratios.
        let effect: session::effect::ProbeEffect = read_json(&effect_path)?;
        let m = &effect.comparison.metrics;
        let paired = |metric: &session::effect::MetricComparison| {
            (metric.paired_ratio.median)
                .map(ratio)
                .with_context(|| format!("{}: an unmeasured paired ratio", effect_path.display()))
        };
        let _ = write!(
            headline,
            "; probe effect p50 {}, p99 {}, CPU/request {}",
            paired(&m.p50_us)?,
            paired(&m.p99_us)?,
            paired(&m.gateway_cpu_us_per_request)?,
        );
    }
    Ok(Run {
        name: name.to_owned(),
        report: format!("{name}/README.md"),
        kind: "session",
        machine,
        load,
        site_hits: (!kernel_only).then_some(breakdown.hits_per_request.sites),
        headline,
    })
}

fn validation(dir: &Path, name: &str) -> anyhow::Result<Run> {
    let v: Validation = read_json(&dir.join("validation.json"))?;
    let m = &v.ab.comparison.metrics;
    Ok(Run {
        name: name.to_owned(),
        report: format!("{name}/README.md"),
        kind: "validation",
        load: format!(
            "{:.0}% of untraced max ({:.0} req/s)",
            v.settings.load * 100.0,
            v.rate
        ),
        site_hits: Some(v.cost.hits_per_request.sites),
        headline: format!(
            "traced/untraced: p50 {}, p99 {}, CPU/request {}, max throughput {}",
            ratio(m.p50_us.ratio_of_medians),
            ratio(m.p99_us.ratio_of_medians),
            ratio(m.gateway_cpu_us_per_request.ratio_of_medians),
            ratio(v.max_rate.ratio_traced_untraced),
        ),
        machine: v.machine,
    })
}

fn bench(dir: &Path, name: &str) -> anyhow::Result<Run> {
    let b: Bench = read_json(&dir.join("results.json"))?;
    let at_quarter: Vec<String> = b
        .rows
        .iter()
        .filter(|row| row.load == "25%")
        .map(|row| match &row.added {
            Some(added) => format!(
                "{:.0} µs at {} ms ({})",
                added.p99_us, row.delay_ms, row.gate
            ),
            None => format!("{} at {} ms", row.gate, row.delay_ms),
        })
        .collect();
    if at_quarter.is_empty() {
        bail!("{}: no 25% row", dir.join("results.json").display());
    }
    let mut headline = format!("added p99 at 25% of max: {}", at_quarter.join(", "));
    if let Some(baseline) = &b.baseline {
        let _ = write!(headline, "; beside the gateway of {}", baseline.rev);
    }
    Ok(Run {
        name: name.to_owned(),
        report: format!("{name}/RESULTS.md"),
        kind: "bench",
        load: if b.quick {
            "matrix, 2 s rows (--quick)".to_owned()
        } else {
            "matrix: c1, c16, c64; 25, 50, 75% of max".to_owned()
        },
        site_hits: None,
        headline,
        machine: b.machine,
    })
}

/// One run directory, by the files it holds.
fn read_run(dir: &Path) -> anyhow::Result<Run> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: not a UTF-8 name", dir.display()))?;
    if dir.join("validation.json").exists() {
        validation(dir, name)
    } else if dir.join("results.json").exists() {
        bench(dir, name)
    } else if dir.join("breakdown.json").exists() {
        session(dir, name)
    } else {
        bail!(
            "{}: neither a session (breakdown.json), a validation (validation.json) nor a bench \
             (results.json)",
            dir.display()
        )
    }
}

/// The run directories under `profiles`, but `local/` (git-ignored: a user's own runs).
fn run_dirs(profiles: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for entry in
        std::fs::read_dir(profiles).with_context(|| format!("reading {}", profiles.display()))?
    {
        let path = entry?.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "local") {
            dirs.push(path);
        }
    }
    Ok(dirs)
}

/// The whole of profiles/README.md.
pub fn render(profiles: &Path) -> anyhow::Result<String> {
    use askama::Template as _;
    let mut runs = run_dirs(profiles)?
        .iter()
        .map(|dir| read_run(dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    runs.sort_by(|a, b| (&a.machine.date, &a.name).cmp(&(&b.machine.date, &b.name)));
    Ok(Index {
        runs,
        gate_ms: session::targets::GATE_P99_ADDED_US.limit() / 1e3,
    }
    .render()?)
}

/// profiles/README.md: `templates/profiles_index.md` over the runs.
#[derive(askama::Template)]
#[template(path = "profiles_index.md", escape = "none")]
struct Index {
    runs: Vec<Run>,
    /// The bench's gate, in ms.
    gate_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_index_matches_the_runs() {
        let profiles = workspace_root().join("profiles");
        let committed = std::fs::read_to_string(profiles.join("README.md")).unwrap();
        assert!(
            committed == render(&profiles).unwrap(),
            "profiles/README.md is stale: run `cargo xtask profiles-index`"
        );
    }

    #[test]
    fn a_missing_field_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("validation-x");
        std::fs::create_dir(&run).unwrap();
        // A validation.json without `max_rate`.
        std::fs::write(
            run.join("validation.json"),
            r#"{"machine": {"cpu_model": "m", "cpus": 2, "commit": "c", "date": "d"},
                "cost": {"hits_per_request": {"sites": 9.0}},
                "settings": {"load": 0.25}, "rate": 1.0,
                "ab": {"comparison": {"metrics": {
                    "p50_us": {"ratio_of_medians": 1.0},
                    "p99_us": {"ratio_of_medians": 1.0},
                    "gateway_cpu_us_per_request": {"ratio_of_medians": 1.0}}}}}"#,
        )
        .unwrap();
        let err = format!("{:#}", render(dir.path()).unwrap_err());
        assert!(err.contains("validation-x/validation.json"), "{err}");
        assert!(err.contains("max_rate"), "{err}");
    }

    #[test]
    fn a_directory_of_no_known_kind_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("stray")).unwrap();
        let err = format!("{:#}", render(dir.path()).unwrap_err());
        assert!(err.contains("stray"), "{err}");
    }

    #[test]
    fn a_session_readme_without_its_commit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("s");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(run.join("breakdown.json"), "{}").unwrap();
        std::fs::write(
            run.join("README.md"),
            "    cargo xtask profile --delay-ms 0\n\n- machine: 2 × M, 1 GiB\n- date: d\n",
        )
        .unwrap();
        let err = format!("{:#}", render(dir.path()).unwrap_err());
        assert!(
            err.contains("s/README.md") && err.contains("commit"),
            "{err}"
        );
    }
}
