//! The session's README.md, written only from the session's own files (breakdown.json,
//! requests.csv, loadgen.json, pictures.json, probe-effect.json): every figure in it can be
//! recomputed from them.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use super::SessionFacts;
use super::effect::ProbeEffect;
use super::phases::{self, PhaseSamples};

/// The session's own A/B windows and their ratios (see `effect`).
pub const PROBE_EFFECT_JSON: &str = "probe-effect.json";

/// The Phase 0 gate: p99 overhead below 1 ms.
const GATE_US: f64 = 1_000.0;

/// Per-request overheads from the tracer's requests.csv, in ns.
#[derive(Debug, Default, PartialEq)]
pub struct Overheads {
    pub overhead: Vec<u64>,
    /// Overhead minus ledger_fsync: what the gateway adds besides the disk's fdatasync.
    pub non_fsync: Vec<u64>,
}

/// Reads requests.csv: `request_id, t_arrive_ns, t_done_ns`, then one column per part in ns
/// (named `upstream` or `upstream_ns`, and so on).
pub fn overheads(csv: &str) -> anyhow::Result<Overheads> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines
        .next()
        .context("requests.csv is empty")?
        .split(',')
        .map(str::trim)
        .collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name || h.strip_suffix("_ns") == Some(name))
            .with_context(|| {
                format!(
                    "requests.csv has no {name} column (header: {})",
                    header.join(",")
                )
            })
    };
    let (arrive, done, upstream, fsync) = (
        column("t_arrive")?,
        column("t_done")?,
        column("upstream")?,
        column("ledger_fsync")?,
    );
    let mut out = Overheads::default();
    for (number, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        let field = |i: usize| -> anyhow::Result<u64> {
            fields
                .get(i)
                .and_then(|f| f.trim().parse().ok())
                .with_context(|| {
                    format!("requests.csv line {}: bad field {}", number + 2, header[i])
                })
        };
        let total = field(done)?
            .checked_sub(field(arrive)?)
            .context("t_done before t_arrive")?;
        let overhead = total.saturating_sub(field(upstream)?);
        out.overhead.push(overhead);
        out.non_fsync.push(overhead.saturating_sub(field(fsync)?));
    }
    out.overhead.sort_unstable();
    out.non_fsync.sort_unstable();
    Ok(out)
}

/// Nearest-rank percentile (p in per mille) of sorted values, in µs.
fn pct_us(sorted: &[u64], permille: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (permille * sorted.len())
        .div_ceil(1000)
        .clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1e3
}

fn read_json(dir: &Path, name: &str) -> anyhow::Result<Value> {
    let path = dir.join(name);
    serde_json::from_slice(&fs::read(&path).with_context(|| format!("reading {}", path.display()))?)
        .with_context(|| format!("parsing {}", path.display()))
}

fn num(value: &Value) -> String {
    match value.as_f64() {
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.1}"),
        None => "–".to_owned(),
    }
}

/// A part's tail (or median) entries: either `tail.parts.NAME` or `tail.NAME`.
fn view_parts(view: &Value) -> Vec<(String, f64, f64)> {
    let parts = view.get("parts").filter(|p| p.is_object()).unwrap_or(view);
    let mut rows: Vec<(String, f64, f64)> = parts
        .as_object()
        .map(|map| {
            map.iter()
                .filter_map(|(name, v)| {
                    Some((
                        name.clone(),
                        v.get("mean_us")?.as_f64()?,
                        v.get("share")?.as_f64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    rows
}

/// Writes `dir/README.md` and returns its path.
pub fn write(dir: &Path, facts: &SessionFacts) -> anyhow::Result<PathBuf> {
    let breakdown = read_json(dir, "breakdown.json")?;
    let loadgen = read_json(dir, "loadgen.json")?;
    let pictures = read_json(dir, "pictures.json")?;
    let effect: ProbeEffect = serde_json::from_value(read_json(dir, PROBE_EFFECT_JSON)?)
        .with_context(|| format!("reading {PROBE_EFFECT_JSON}"))?;
    let csv = fs::read_to_string(dir.join("requests.csv")).context("reading requests.csv")?;
    let overheads = overheads(&csv)?;
    ensure!(
        !overheads.overhead.is_empty(),
        "requests.csv has no complete request"
    );
    let phase_samples = phases::read(&pictures)?;
    let text = render(
        facts,
        &effect,
        &breakdown,
        &loadgen,
        &pictures,
        phase_samples.as_ref(),
        &overheads,
    );
    let path = dir.join("README.md");
    fs::write(&path, text)?;
    Ok(path)
}

/// Sends more than this late (p99 of sent − scheduled) mean the open loop fell behind.
const SEND_LAG_LIMIT_US: f64 = 1000.0;

/// A warning when the gateway did not keep up with the open loop: requests never sent, a
/// send lag over [`SEND_LAG_LIMIT_US`] at p99, or under 95% of the target rate achieved. The
/// figures then describe a saturated gateway, not the load fraction asked for.
fn overload_warning(loadgen: &Value, target_rate: f64) -> Option<String> {
    let unsent = loadgen["errors"]["unsent"].as_u64().unwrap_or(0);
    let lag_p99 = loadgen["send_lag_us"]["p99"].as_f64().unwrap_or(0.0);
    let achieved = loadgen["achieved_rate"].as_f64().unwrap_or(0.0);
    let behind = unsent > 0 || lag_p99 > SEND_LAG_LIMIT_US || achieved < 0.95 * target_rate;
    behind.then(|| {
        format!(
            "**WARNING: the open loop fell behind** ({unsent} requests unsent, send lag p99 \
             {lag_p99:.0} µs, {achieved:.0} of {target_rate:.0} req/s achieved): requests waited in \
             loadgen for a free connection or for its CPU. Latencies still count from the \
             scheduled send, but the traced gateway was at or near saturation at this rate, not \
             at the load fraction asked for; see the load average below, and compare a lower \
             --load."
        )
    })
}

/// `{"site": 410.0, ...}` as `site 410 ns, ...`.
/// `site 410 ns, sock unmeasured`: a kind calibration could not measure is null (or, in a
/// session recorded before that, a figure at or below zero).
fn ns_by_kind(map: &Value) -> String {
    map.as_object()
        .map(|costs| {
            costs
                .iter()
                .map(|(kind, ns)| match ns.as_f64() {
                    Some(ns) if ns > 0.0 => format!("{kind} {} ns", num(&Value::from(ns))),
                    _ => format!("{kind} unmeasured"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// "Tracer cost and loss": what the tracer lost and what it cost, all from breakdown.json
/// (`lost_events`, `incomplete`, `calibration`, `hits_per_request`, `cost`). Loss comes first
/// and is flagged when non-zero.
fn cost_and_loss(breakdown: &Value) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "\n## Tracer cost and loss (breakdown.json)\n");
    let lost = breakdown["lost_events"].as_u64().unwrap_or(0);
    let incomplete = breakdown["incomplete"].as_u64().unwrap_or(0);
    if lost > 0 || incomplete > 0 {
        let _ = writeln!(
            w,
            "- **WARNING: {lost} lost events, {incomplete} incomplete requests** (reasons: {}). \
             Incomplete requests are counted, never attributed: every figure above covers the {} \
             complete requests only.",
            breakdown["incomplete_reasons"], breakdown["requests"]
        );
    } else {
        let _ = writeln!(w, "- Loss: 0 lost events, 0 incomplete requests.");
    }
    let hits = &breakdown["hits_per_request"];
    let hits_text = ["sites", "syscalls", "sock", "sched", "samples"]
        .iter()
        .map(|kind| format!("{kind} {:.2}", hits[*kind].as_f64().unwrap_or(f64::NAN)))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(w, "- Hits per complete request: {hits_text}.");
    let calibration = &breakdown["calibration"];
    if calibration.is_object() {
        let per_hit = ns_by_kind(&calibration["ns_per_hit"]);
        let noisy = calibration["noisy"]
            .as_array()
            .filter(|kinds| !kinds.is_empty())
            .map(|kinds| format!(" (noisy: {})", Value::Array(kinds.clone())))
            .unwrap_or_default();
        let left_out = calibration["unmeasured"]
            .as_array()
            .filter(|kinds| !kinds.is_empty())
            .map(|kinds| {
                let names: Vec<&str> = kinds.iter().filter_map(Value::as_str).collect();
                format!("; left out, unmeasured: {}", names.join(", "))
            })
            .unwrap_or_default();
        let _ = writeln!(
            w,
            "- Probe cost, calibrated on CPU {} before attaching: {per_hit} per hit{noisy}; \
             × the hits above = **{} ns of probe time per request** (by kind: {}{left_out}).",
            calibration["cpu"],
            num(&calibration["probe_ns_per_request"]),
            ns_by_kind(&calibration["probe_ns_per_request_by_kind"])
        );
    } else {
        let _ = writeln!(
            w,
            "- Probe cost: not calibrated in this session (no `calibration` section)."
        );
    }
    let cost = &breakdown["cost"];
    let bpf = &cost["bpf"];
    match (
        bpf["total_run_time_ns"].as_f64(),
        breakdown["requests"].as_f64(),
    ) {
        (Some(run_ns), Some(requests)) if requests > 0.0 => {
            let _ = writeln!(
                w,
                "- BPF run time: {} ns per complete request ({:.1} ms over {} program runs, {:.1}% \
                 of one CPU over the session).",
                num(&Value::from(run_ns / requests)),
                run_ns / 1e6,
                bpf["total_run_count"],
                bpf["cpu_share"].as_f64().unwrap_or(f64::NAN) * 100.0,
            );
        }
        _ => {
            let _ = writeln!(
                w,
                "- BPF run time: not measured (bpf_stats: {}).",
                cost["bpf_stats"].as_str().unwrap_or("no `cost` section")
            );
        }
    }
    let tracer = &cost["tracer"];
    let own = &breakdown["tracer"];
    let _ = writeln!(
        w,
        "- The tracer process: {} s CPU during the session ({} s user + {} s system in all), \
         peak RSS {:.1} MiB.",
        num(&tracer["cpu_session_s"]),
        num(tracer.get("cpu_user_s").unwrap_or(&own["cpu_user_s"])),
        num(tracer.get("cpu_system_s").unwrap_or(&own["cpu_system_s"])),
        tracer["peak_rss_kib"].as_f64().unwrap_or(f64::NAN) / 1024.0
    );
    let _ = writeln!(
        w,
        "- Probe effect on the gateway's latency and CPU (traced vs untraced windows): \
         `cargo xtask validate`, recorded in profiles/validation-*/."
    );
    md
}

fn render(
    facts: &SessionFacts,
    effect: &ProbeEffect,
    breakdown: &Value,
    loadgen: &Value,
    pictures: &Value,
    phase_samples: Option<&PhaseSamples>,
    o: &Overheads,
) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "# Tail session: {:.0}% of max load, {} ms upstream\n",
        facts.load * 100.0,
        facts.delay_ms
    );
    let _ = writeln!(w, "    {}\n", facts.command);
    let _ = writeln!(
        w,
        "Generated by `cargo xtask profile` from the files beside it; every figure below is read or"
    );
    let _ = writeln!(
        w,
        "computed from breakdown.json, requests.csv.gz, loadgen.json, pictures.json and probe-effect.json.\n"
    );
    let _ = writeln!(w, "{}\n", effect.line());
    let warning = effect.warning();
    if let Some(warning) = &warning {
        let _ = writeln!(w, "{warning}\n");
    }

    let _ = writeln!(w, "## Settings\n");
    let _ = writeln!(
        w,
        "- max rate: {:.0} req/s, from {}",
        facts.max_rate, facts.max_rate_source
    );
    let _ = writeln!(
        w,
        "- target: {:.2} × max = {:.0} req/s open loop (latency from the scheduled send), {} connections",
        facts.load, facts.target_rate, facts.connections
    );
    let _ = writeln!(
        w,
        "- achieved: {} req/s, {} requests sent, {} ok (loadgen.json)",
        num(&loadgen["achieved_rate"]),
        loadgen["sent"],
        loadgen["ok"]
    );
    let overloaded = overload_warning(loadgen, facts.target_rate);
    if let Some(warning) = &overloaded {
        let _ = writeln!(w, "- {warning}");
    }
    let _ = writeln!(
        w,
        "- traced window: {} s, after an untraced {} s warm-up at the target rate; the tracer attached before the traced load started",
        facts.duration_s, facts.warmup_s
    );
    let _ = writeln!(
        w,
        "- upstream delay {} ms; gateway tokio workers {}",
        facts.delay_ms, facts.workers
    );
    let _ = writeln!(
        w,
        "- tracer mode: {}; its effect on the gateway is the **Probe effect** line above (windows under *Probe effect windows*)",
        breakdown["attach_modes"]["mode"]
            .as_str()
            .unwrap_or("unknown")
    );
    let _ = writeln!(w, "\n## Machine\n");
    let _ = write!(w, "{}", facts.machine.markdown());
    let _ = writeln!(w, "\n## CPU pinning\n");
    let _ = writeln!(
        w,
        "| process | taskset -c | Cpus_allowed_list |\n|---|---|---|"
    );
    for (name, asked, applied) in &facts.pinning {
        let _ = writeln!(w, "| {name} | {asked} | {applied} |");
    }

    let _ = writeln!(
        w,
        "\n## Probe effect windows\n\nThe session's open loop at its rate, {} s a window, the tracer attached (`tracer record {}`) in the traced ones only, in flipping pairs (U T T U …) so drift falls on both arms. Latency from the scheduled send (loadgen); CPU from /proc.\n",
        effect.window_s,
        effect.tracer_flags.join(" ")
    );
    w.push_str(&effect.table());

    let _ = writeln!(w, "\n## Breakdown (tracer, breakdown.json)\n");
    let _ = writeln!(
        w,
        "{} complete requests, {} incomplete, {} lost events.\n",
        breakdown["requests"], breakdown["incomplete"], breakdown["lost_events"]
    );
    let _ = writeln!(
        w,
        "| part | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | mean µs |\n|---|---|---|---|---|---|---|"
    );
    if let Some(parts) = breakdown["parts"].as_object() {
        for (name, p) in parts {
            let _ = writeln!(
                w,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                num(&p["p50_us"]),
                num(&p["p90_us"]),
                num(&p["p99_us"]),
                num(&p["p999_us"]),
                num(&p["max_us"]),
                num(&p["mean_us"])
            );
        }
    }

    w.push_str(&cost_and_loss(breakdown));

    let tail = &breakdown["tail"];
    let tail_rows = view_parts(tail);
    let median = breakdown.get("median").map(view_parts).unwrap_or_default();
    let _ = writeln!(
        w,
        "\n## Tail view\n\nThe {} requests with overhead above the p99 ({} µs): each part's mean and share of their overhead{}.\n",
        tail["requests"],
        num(&tail["threshold_us"]),
        if median.is_empty() {
            ""
        } else {
            ", beside the median band's"
        }
    );
    let _ = writeln!(
        w,
        "| part | tail mean µs | tail share | median mean µs | median share |\n|---|---|---|---|---|"
    );
    for (name, mean, share) in &tail_rows {
        let m = median.iter().find(|(n, _, _)| n == name);
        // Parts this session cannot have (`cpu.<phase>` without --phases) are all zeros.
        if *mean == 0.0 && m.is_none_or(|(_, mean, _)| *mean == 0.0) {
            continue;
        }
        let _ = writeln!(
            w,
            "| {name} | {mean:.1} | {:.1}% | {} | {} |",
            share * 100.0,
            m.map_or("–".to_owned(), |(_, mean, _)| format!("{mean:.1}")),
            m.map_or("–".to_owned(), |(_, _, share)| format!(
                "{:.1}%",
                share * 100.0
            ))
        );
    }

    if let Some(sampled) = phase_samples {
        let mode = breakdown["attach_modes"]["mode"].as_str().unwrap_or("");
        let count = |v: &Value| v.as_u64().unwrap_or(0);
        let bands = [
            phases::Band {
                name: "tail",
                samples: &sampled.tail,
                requests: count(&pictures["tail"]["requests"]),
                exact: Some(tail),
            },
            phases::Band {
                name: "median",
                samples: &sampled.median,
                requests: count(&pictures["median_band"]["requests"]),
                exact: breakdown.get("median"),
            },
            phases::Band {
                name: "all",
                samples: &sampled.all,
                requests: count(&pictures["requests"]),
                exact: Some(breakdown),
            },
        ];
        w.push_str(&phases::section(sampled, &bands, mode.contains("phases")));
    }

    w.push_str(&wait_tables(
        &pictures["wait"],
        &pictures["wait_all"],
        &tail["requests"],
    ));

    let _ = writeln!(w, "\n## Client view (loadgen.json)\n");
    let latency = &loadgen["latency_us"];
    if latency.is_object() {
        let _ = writeln!(
            w,
            "Latency from the scheduled send: p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs; errors: {}.",
            num(&latency["p50"]),
            num(&latency["p99"]),
            num(&latency["p999"]),
            num(&latency["max"]),
            loadgen["errors"]
        );
    } else {
        let _ = writeln!(
            w,
            "See loadgen.json (no `latency_us` object found to quote)."
        );
    }

    let _ = writeln!(w, "\n## Pictures\n");
    let tail_n = &pictures["tail"]["requests"];
    let median_n = &pictures["median_band"]["requests"];
    for (file, what) in [
        ("tail-oncpu.svg", format!("on-CPU samples of the {tail_n} tail requests ({} samples)", pictures["tail"]["samples"])),
        ("all-oncpu.svg", format!("on-CPU samples of all {} requests ({} samples)", pictures["requests"], pictures["all_samples"])),
        ("tail-offcpu.svg", format!("off-CPU ns of the tail requests, writer fsync and signing included ({:.1} ms), {}", pictures["tail"]["offcpu_ns"].as_f64().unwrap_or(0.0) / 1e6, offcpu_stacks_note(breakdown))),
        ("tail-wait.svg", format!("what ran on the CPU while the tail requests were ready but not running ({:.1} ms of scheduling; see *While the tail waited*)", pictures["wait"]["scheduling_ns"].as_f64().unwrap_or(0.0) / 1e6)),
        ("tail-diff.svg", format!("tail vs the {median_n} median-band requests (p45..p55), differential")),
        ("trace.json", "the 20 slowest and 20 median requests on a timeline: open in https://ui.perfetto.dev or chrome://tracing".to_owned()),
    ] {
        let _ = writeln!(w, "- [{file}]({file}): {what}");
    }
    let _ = writeln!(
        w,
        "- folded stacks: tail-oncpu.folded, all-oncpu.folded, tail-offcpu.folded, tail-wait.folded, median-oncpu.folded"
    );
    if pictures["kernel_symbols"] == Value::Bool(false) {
        let _ = writeln!(
            w,
            "- kernel frames are unnamed: /proc/kallsyms showed no addresses to the tracer"
        );
    }

    let _ = writeln!(w, "\n## Reading\n");
    let _ = writeln!(
        w,
        "- {}",
        tail_against_untraced(effect, warning.is_some(), loadgen)
    );
    if let Some(warning) = &overloaded {
        let _ = writeln!(w, "- {warning}");
    }
    let (p50, p99, p999) = (
        pct_us(&o.overhead, 500),
        pct_us(&o.overhead, 990),
        pct_us(&o.overhead, 999),
    );
    let (nf50, nf99) = (pct_us(&o.non_fsync, 500), pct_us(&o.non_fsync, 990));
    let _ = writeln!(
        w,
        "- Overhead (total − upstream) over {} requests: p50 {p50:.1} µs, p99 {p99:.1} µs, p99.9 {p999:.1} µs (requests.csv).",
        o.overhead.len()
    );
    if let [first, rest @ ..] = tail_rows.as_slice() {
        let others: Vec<String> = rest
            .iter()
            .take(2)
            .map(|(n, mean, share)| format!("{n} {:.0}% ({mean:.0} µs)", share * 100.0))
            .collect();
        let _ = writeln!(
            w,
            "- The tail is dominated by **{}**: {:.0}% of tail overhead on average ({:.0} µs per tail request); next: {}.",
            first.0,
            first.2 * 100.0,
            first.1,
            if others.is_empty() {
                "none".to_owned()
            } else {
                others.join(", ")
            }
        );
    }
    if let Some(sampled) = phase_samples {
        let _ = writeln!(
            w,
            "- {}",
            phases::reading(sampled, pictures["tail"]["requests"].as_u64().unwrap_or(0))
        );
    }
    if let Some((then, link)) = &facts.compare {
        match super::compare::TailFacts::from_session(breakdown, pictures) {
            Ok(now) => {
                let _ = writeln!(w, "- {}", super::compare::reading(&now, then, link));
            }
            Err(e) => {
                let _ = writeln!(w, "- No comparison with {link}: {e}");
            }
        }
    }
    let _ = writeln!(
        w,
        "- Without ledger_fsync (the disk's fdatasync, charged to the requests that waited on it), overhead is p50 {nf50:.1} µs, p99 {nf99:.1} µs: the 1 ms p99 gate {} for the non-fsync part.",
        if nf99 < GATE_US {
            "holds"
        } else {
            "does not hold"
        }
    );
    let _ = writeln!(
        w,
        "- Loss: {} lost events, {} incomplete requests (never attributed); the tracer's own cost is under *Tracer cost and loss*, its effect on the gateway in the **Probe effect** line.",
        breakdown["lost_events"], breakdown["incomplete"]
    );
    md
}

/// Whether the off-CPU picture has stacks: only a session with `--offcpu-stacks` takes them.
fn offcpu_stacks_note(breakdown: &Value) -> &'static str {
    let mode = breakdown["attach_modes"]["mode"].as_str().unwrap_or("");
    if mode.contains("offcpu-stacks") {
        "by stack at switch-out"
    } else {
        "by part only: this session took no switch-out stacks (`--offcpu-stacks`); tail-wait.svg is its off-CPU view"
    }
}

/// The Reading's first point: the traced tail beside the untraced client tail, and whether
/// the conclusions after it describe the untraced gateway.
fn tail_against_untraced(effect: &ProbeEffect, over_budget: bool, loadgen: &Value) -> String {
    let m = &effect.comparison.metrics;
    let us = |x: Option<f64>| x.map_or("–".to_owned(), |x| format!("{x:.0} µs"));
    let session_p99 = loadgen["latency_us"]["p99"].as_f64();
    let verdict = if over_budget {
        "over budget (see the WARNING at the top): read the parts below as the traced gateway's, and weigh each against the untraced client tail".to_owned()
    } else {
        format!(
            "within the ×{:.2} budget, so the ranking of parts below describes the gateway as it runs untraced",
            super::effect::BUDGET
        )
    };
    format!(
        "Traced against untraced first: the client's p99 was {} in the untraced windows and {} in the traced ones (medians), p99.9 {} and {}; the session's own traced run read p99 {}. The effect is {verdict}.",
        us(m.p99_us.untraced.median),
        us(m.p99_us.traced.median),
        us(m.p999_us.untraced.median),
        us(m.p999_us.traced.median),
        us(session_p99),
    )
}

/// Holder rows shown before the rest is summed into one.
const TOP_HOLDERS: usize = 12;
/// The wait-for total may differ from the tail's scheduling by this much before the README
/// names the remainder.
const COVER_TOLERANCE: f64 = 0.05;

/// "While the tail waited": pictures.json's `wait` section as two tables, what held the CPU
/// during the tail's `scheduling` and what the writer did during its receipt wait.
fn wait_tables(wait: &Value, wait_all: &Value, tail_requests: &Value) -> String {
    let mut md = String::new();
    let w = &mut md;
    let ns = |v: &Value| v.as_f64().unwrap_or(0.0);
    let scheduling = ns(&wait["scheduling_ns"]);
    let Some(holders) = wait["holders"].as_array() else {
        let _ = writeln!(
            w,
            "\n## While the tail waited, the CPU ran\n\npictures.json has no `wait` section: the session ran without `--wait-for` (or before the view existed)."
        );
        return md;
    };
    let per_request = tail_requests.as_f64().filter(|n| *n > 0.0).unwrap_or(1.0);
    let _ = writeln!(
        w,
        "\n## While the tail waited, the CPU ran\n\nThe {tail_requests} tail requests were ready but not running (`scheduling`) for {:.2} ms in all. \
         Each such interval is charged to what ran on the CPU they waited for ([tail-wait.svg](tail-wait.svg), pictures.json `wait`):\n",
        scheduling / 1e6
    );
    let _ = writeln!(
        w,
        "| holder | ms | share of the tail's scheduling | µs per tail request |\n|---|---|---|---|"
    );
    let share = |x: f64| {
        if scheduling > 0.0 {
            format!("{:.1}%", x / scheduling * 100.0)
        } else {
            "–".to_owned()
        }
    };
    let row = |w: &mut String, name: &str, x: f64| {
        let _ = writeln!(
            w,
            "| {name} | {:.3} | {} | {:.1} |",
            x / 1e6,
            share(x),
            x / 1e3 / per_request
        );
    };
    for h in holders.iter().take(TOP_HOLDERS) {
        row(w, h["holder"].as_str().unwrap_or("?"), ns(&h["ns"]));
    }
    if holders.len() > TOP_HOLDERS {
        let rest: f64 = holders[TOP_HOLDERS..].iter().map(|h| ns(&h["ns"])).sum();
        row(
            w,
            &format!("{} other holders", holders.len() - TOP_HOLDERS),
            rest,
        );
    }
    let charged = ns(&wait["charged_ns"]);
    row(w, "**total charged**", charged);
    let unknown = ns(&wait["unknown_ns"]);
    let uncovered = (scheduling - charged).abs() + unknown;
    if scheduling > 0.0 && uncovered / scheduling > COVER_TOLERANCE {
        let _ = writeln!(
            w,
            "\n**Uncovered: {:.3} ms ({}) of the tail's scheduling** has no known holder: {:.3} ms on a CPU with no switch seen yet (`[cpu not seen]`), {:.3} ms not charged at all.",
            uncovered / 1e6,
            share(uncovered),
            unknown / 1e6,
            (scheduling - charged).abs() / 1e6
        );
    } else {
        let _ = writeln!(
            w,
            "\nThe holders cover the tail's scheduling to within {:.0}% ({} has no known holder).",
            COVER_TOLERANCE * 100.0,
            share(uncovered)
        );
    }
    if let Some(n) = wait["uncharged_requests"].as_u64().filter(|n| *n > 0) {
        let _ = writeln!(
            w,
            "**{n} tail requests had no waits charged** (the tracer charges a request's waits only when its overhead reaches the running p95, or it is in the uniform sample): they are left out of the figures above."
        );
    }
    if let Some(all) = wait_all["holders"].as_array().filter(|h| !h.is_empty()) {
        let total = ns(&wait_all["scheduling_ns"]);
        let top: Vec<String> = all
            .iter()
            .take(3)
            .map(|h| {
                format!(
                    "{} {:.1}%",
                    h["holder"].as_str().unwrap_or("?"),
                    ns(&h["ns"]) / total.max(1.0) * 100.0
                )
            })
            .collect();
        let _ = writeln!(
            w,
            "Over a uniform sample of complete requests ({} requests, {:.2} ms of scheduling, pictures.json `wait_all`), the largest holders: {}.",
            wait_all["requests"],
            total / 1e6,
            top.join(", ")
        );
    }
    let all_holders = wait_all["holders"].as_array().into_iter().flatten();
    if holders.iter().chain(all_holders).any(|h| {
        h["holder"]
            .as_str()
            .is_some_and(|name| name.starts_with("idle"))
    }) {
        let _ = writeln!(
            w,
            "`idle` means nothing ran while the request was ready: that wait had another cause (wakeup latency), not a busy CPU."
        );
    }

    if let Some(receipt) = wait["receipt"].as_array().filter(|r| !r.is_empty()) {
        let total = ns(&wait["receipt_ns"]);
        let _ = writeln!(
            w,
            "\n### While the tail waited for its receipt, the writer\n\nThe tail's receipt wait ({:.2} ms: `ledger_fsync`, `signing`, `ledger_other`) by what the ledger writer did; \
             in `ledger_other`, a writer waiting for the CPU is charged to what held it:\n",
            total / 1e6
        );
        let _ = writeln!(
            w,
            "| part | writer / holder | ms | share of the receipt wait |\n|---|---|---|---|"
        );
        for r in receipt.iter().take(TOP_HOLDERS) {
            let x = ns(&r["ns"]);
            let _ = writeln!(
                w,
                "| {} | {} | {:.3} | {} |",
                r["part"].as_str().unwrap_or("?"),
                r["holder"].as_str().unwrap_or("?"),
                x / 1e6,
                if total > 0.0 {
                    format!("{:.1}%", x / total * 100.0)
                } else {
                    "–".to_owned()
                }
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_json(unknown_ns: u64) -> Value {
        serde_json::json!({
            "scheduling_ns": 10_000_000u64,
            "charged_ns": 10_000_000u64,
            "unknown_ns": unknown_ns,
            "holders": [
                {"holder": "other process · sh (pid 7)", "ns": 6_000_000u64 - unknown_ns},
                {"holder": "ledger-writer · sign", "ns": 4_000_000u64},
                {"holder": "[cpu not seen]", "ns": unknown_ns},
            ],
            "receipt_ns": 2_000_000u64,
            "receipt": [{"part": "ledger_fsync", "holder": "ledger-writer · fdatasync", "ns": 2_000_000u64}],
        })
    }

    #[test]
    fn the_wait_table_ranks_holders_and_names_an_uncovered_remainder() {
        let all = serde_json::json!({
            "scheduling_ns": 20_000_000u64,
            "holders": [{"holder": "idle (the wait had another cause)", "ns": 5_000_000u64}],
        });
        let md = wait_tables(&wait_json(0), &all, &Value::from(4));
        assert!(
            md.contains("| other process · sh (pid 7) | 6.000 | 60.0% | 1500.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| **total charged** | 10.000 | 100.0% |"),
            "{md}"
        );
        assert!(md.contains("to within 5%"), "{md}");
        assert!(
            md.contains("the largest holders: idle (the wait had another cause) 25.0%."),
            "{md}"
        );
        assert!(md.contains("`idle` means nothing ran"), "{md}");
        assert!(
            md.contains("| ledger_fsync | ledger-writer · fdatasync | 2.000 | 100.0% |"),
            "{md}"
        );
        let md = wait_tables(&wait_json(1_000_000), &Value::Null, &Value::from(4));
        assert!(md.contains("**Uncovered: 1.000 ms (10.0%)"), "{md}");
        let md = wait_tables(&Value::Null, &Value::Null, &Value::from(4));
        assert!(md.contains("no `wait` section"), "{md}");
    }

    #[test]
    fn a_loop_that_fell_behind_is_flagged() {
        let kept_up = serde_json::json!({
            "achieved_rate": 3890.0, "errors": {}, "send_lag_us": {"p99": 40.0}
        });
        assert_eq!(overload_warning(&kept_up, 3898.0), None);
        let behind = serde_json::json!({
            "achieved_rate": 3502.0, "errors": {"unsent": 4864}, "send_lag_us": {"p99": 3.3e6}
        });
        let warning = overload_warning(&behind, 3898.0).unwrap();
        assert!(warning.contains("4864 requests unsent"), "{warning}");
    }

    fn breakdown(lost: u64, incomplete: u64) -> Value {
        serde_json::json!({
            "requests": 1000, "incomplete": incomplete, "lost_events": lost,
            "incomplete_reasons": if incomplete > 0 { serde_json::json!({"lost_events": incomplete}) } else { serde_json::json!({}) },
            "hits_per_request": {"sites": 76.5, "syscalls": 6.9, "sock": 2.0, "sched": 17.2, "samples": 0.06},
            "tracer": {"cpu_user_s": 2.8, "cpu_system_s": 3.7},
            "calibration": {
                "cpu": 1, "noisy": ["sock"],
                "ns_per_hit": {"sched": 157.5, "site": 410.0, "sock": 605.9, "syscall": 350.8},
                "probe_ns_per_request": 37733.1,
                "probe_ns_per_request_by_kind": {"sites": 31392.8}
            },
            "cost": {
                "bpf_stats": "enabled",
                "bpf": {"cpu_share": 0.224, "total_run_count": 9301492, "total_run_time_ns": 4950391u64},
                "tracer": {"cpu_session_s": 5.978, "cpu_user_s": 2.826, "cpu_system_s": 3.766, "peak_rss_kib": 167492}
            }
        })
    }

    #[test]
    fn cost_and_loss_quotes_calibration_bpf_time_and_the_tracer_process() {
        let text = cost_and_loss(&breakdown(0, 0));
        assert!(text.contains("## Tracer cost and loss"), "{text}");
        assert!(text.contains("0 lost events, 0 incomplete"), "{text}");
        assert!(!text.contains("WARNING"), "{text}");
        assert!(text.contains("site 410 ns"), "{text}");
        assert!(text.contains("(noisy: [\"sock\"])"), "{text}");
        assert!(
            text.contains("**37733 ns of probe time per request**"),
            "{text}"
        );
        assert!(text.contains("by kind: sites 31393 ns"), "{text}");
        assert!(text.contains("sites 76.50, syscalls 6.90"), "{text}");
        assert!(text.contains("samples 0.06"), "{text}");
        // 4.95 ms of BPF run time over 1000 complete requests.
        assert!(text.contains("4950 ns per complete request"), "{text}");
        assert!(text.contains("22.4% of one CPU"), "{text}");
        assert!(text.contains("6.0 s CPU during the session"), "{text}");
        assert!(text.contains("peak RSS 163.6 MiB"), "{text}");
        assert!(text.contains("profiles/validation-*/"), "{text}");
    }

    #[test]
    fn an_unmeasured_kind_renders_as_unmeasured_and_left_out() {
        let mut session = breakdown(0, 0);
        let calibration = &mut session["calibration"];
        calibration["ns_per_hit"]["sock"] = Value::Null;
        calibration["unmeasured"] = serde_json::json!(["sock"]);
        calibration["probe_ns_per_request_by_kind"] =
            serde_json::json!({"sites": 31392.8, "sock": null});
        let text = cost_and_loss(&session);
        assert!(text.contains("sock unmeasured, syscall 351 ns"), "{text}");
        assert!(
            text.contains("(by kind: sites 31393 ns, sock unmeasured; left out, unmeasured: sock)"),
            "{text}"
        );
        // A session recorded before `unmeasured` existed: its negative figure is not repeated.
        session["calibration"]["ns_per_hit"]["sock"] = Value::from(-79.0);
        let text = cost_and_loss(&session);
        assert!(text.contains("sock unmeasured"), "{text}");
        assert!(!text.contains("-79"), "{text}");
    }

    #[test]
    fn cost_and_loss_flags_loss_and_a_missing_calibration() {
        let mut lossy = breakdown(12, 3);
        lossy.as_object_mut().unwrap().remove("calibration");
        let text = cost_and_loss(&lossy);
        assert!(
            text.contains("**WARNING: 12 lost events, 3 incomplete requests**"),
            "{text}"
        );
        assert!(text.contains("{\"lost_events\":3}"), "{text}");
        assert!(text.contains("not calibrated in this session"), "{text}");
    }

    #[test]
    fn overheads_come_from_the_part_columns() {
        let csv = "request_id,t_arrive_ns,t_done_ns,upstream_ns,scheduling_ns,ledger_fsync_ns\n\
                   1,1000,5000,1000,2000,1000\n2,0,3000,0,1000,2000\n";
        let o = overheads(csv).unwrap();
        assert_eq!(o.overhead, [3000, 3000]);
        assert_eq!(o.non_fsync, [1000, 2000]);
        assert!(
            overheads("request_id,t_arrive_ns\n").is_err(),
            "missing columns are an error"
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=200).map(|v| v * 1000).collect();
        assert_eq!(pct_us(&values, 990), 198.0);
        assert_eq!(pct_us(&values, 550), 110.0);
    }

    #[test]
    fn tail_parts_sort_by_share_in_either_layout() {
        let nested: Value = serde_json::json!({ "parts": { "a": { "mean_us": 1.0, "share": 0.2 }, "b": { "mean_us": 3.0, "share": 0.8 } } });
        let flat: Value = serde_json::json!({ "threshold_us": 5.0, "a": { "mean_us": 1.0, "share": 0.2 }, "b": { "mean_us": 3.0, "share": 0.8 } });
        for view in [nested, flat] {
            let names: Vec<String> = view_parts(&view).into_iter().map(|(n, _, _)| n).collect();
            assert_eq!(names, ["b", "a"]);
        }
    }
}
