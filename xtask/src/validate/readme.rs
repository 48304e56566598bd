//! README.md of a validation run, written only from validation.json's figures.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn num(v: &Value, digits: usize) -> String {
    match v.as_f64() {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "—".to_owned(),
    }
}

/// ` LABEL: a, b.` for a non-empty list of kinds; nothing otherwise.
fn kinds_note(label: &str, kinds: &Value) -> String {
    match kinds.as_array().filter(|kinds| !kinds.is_empty()) {
        Some(kinds) => {
            let names: Vec<&str> = kinds.iter().filter_map(Value::as_str).collect();
            format!(" {label}: {}.", names.join(", "))
        }
        None => String::new(),
    }
}

fn json_f64(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

fn int(v: &Value) -> String {
    v.as_u64().map_or_else(|| num(v, 0), |n| n.to_string())
}

/// `median (min–max)` of a spread object.
fn spread(v: &Value, digits: usize) -> String {
    format!(
        "{} ({}–{})",
        num(&v["median"], digits),
        num(&v["min"], digits),
        num(&v["max"], digits)
    )
}

pub fn write(dir: &Path, v: &Value) -> anyhow::Result<PathBuf> {
    let mut md = String::new();
    render(&mut md, v).expect("writing to a String");
    let path = dir.join("README.md");
    std::fs::write(&path, md)?;
    Ok(path)
}

fn render(md: &mut String, v: &Value) -> std::fmt::Result {
    let m = &v["machine"];
    writeln!(md, "# Tracer validation\n")?;
    writeln!(
        md,
        "Every figure below is read from `validation.json` of the same run. Command: `{}`.\n",
        v["command"].as_str().unwrap_or("?")
    )?;
    writeln!(
        md,
        "- machine: {} × {}, {} GiB; kernel Linux {}",
        int(&m["cpus"]),
        m["cpu_model"].as_str().unwrap_or("?"),
        num(&m["memory_gib"], 1),
        m["kernel"].as_str().unwrap_or("?")
    )?;
    writeln!(
        md,
        "- commit `{}`, {}; load average at start {}",
        m["commit"].as_str().unwrap_or("?"),
        m["date"].as_str().unwrap_or("?"),
        m["load_average"].as_str().unwrap_or("?")
    )?;
    if let Some(note) = m["commit_note"].as_str() {
        writeln!(md, "- note on the commit: {note}")?;
    }
    if let Some(dirty) = m["uncommitted"].as_array().filter(|d| !d.is_empty()) {
        let list: Vec<String> = dirty
            .iter()
            .filter_map(Value::as_str)
            .map(|p| format!("`{p}`"))
            .collect();
        writeln!(md, "- uncommitted at run time: {}", list.join(", "))?;
    }
    let pins: Vec<String> = v["pinning"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{} on CPU {}",
                p["process"].as_str().unwrap_or("?"),
                p["applied"].as_str().unwrap_or("?")
            )
        })
        .collect();
    writeln!(md, "- pinning (as applied): {}", pins.join("; "))?;
    let s = &v["settings"];
    writeln!(
        md,
        "- load {} of the untraced max = **{} req/s** over {} connections; max untraced {} req/s ({})\n",
        num(&s["load"], 2),
        num(&v["rate"], 0),
        int(&s["connections"]),
        num(&v["max_rate"]["untraced"], 0),
        v["max_rate"]["untraced_source"].as_str().unwrap_or("?")
    )?;

    reading(md, v)?;

    // 1. Accuracy.
    let a = &v["accuracy"];
    let j = &a["join"];
    let g = &j["client_minus_tracer"];
    writeln!(
        md,
        "## 1. Accuracy against the client ({} s traced)\n",
        num(&s["accuracy_s"], 0)
    )?;
    writeln!(
        md,
        "Joined by request id on CLOCK_MONOTONIC: loadgen's `received − sent` minus the tracer's \
         `t_done − t_arrive` (loopback and client-stack time; must be ≥ 0).\n"
    )?;
    writeln!(md, "| figure | value |\n|---|---|")?;
    writeln!(
        md,
        "| 2xx responses (loadgen) | {} |",
        int(&a["loadgen"]["ok"])
    )?;
    writeln!(
        md,
        "| complete in the tracer / incomplete | {} / {} |",
        int(&a["tracer"]["requests"]),
        int(&a["tracer"]["incomplete"])
    )?;
    writeln!(md, "| matched by id | {} |", int(&j["matched"]))?;
    writeln!(
        md,
        "| client − tracer p50 / p99 / max (µs) | {} / {} / {} |",
        num(&g["p50_us"], 1),
        num(&g["p99_us"], 1),
        num(&g["max_us"], 1)
    )?;
    writeln!(
        md,
        "| client − tracer min (µs) | {} |",
        num(&g["min_us"], 1)
    )?;
    writeln!(
        md,
        "| **negative gaps** (target 0) | **{}** |",
        int(&j["negative"])
    )?;
    writeln!(
        md,
        "| t_arrive < sent / t_done > received | {} / {} |",
        int(&j["arrive_before_sent"]),
        int(&j["done_after_received"])
    )?;
    writeln!(
        md,
        "| answered by the gateway, not complete in the tracer (200s among them) | {} ({}) |",
        int(&j["client_only"]),
        int(&j["untraced_ok"])
    )?;
    writeln!(
        md,
        "| complete in the tracer, unknown to the client | {} |",
        int(&j["tracer_only"])
    )?;
    writeln!(
        md,
        "| events lost | {} |\n",
        int(&a["tracer"]["lost_events"])
    )?;
    if let Some(reasons) = a["tracer"]["incomplete_reasons"]
        .as_object()
        .filter(|r| !r.is_empty())
    {
        let list: Vec<String> = reasons
            .iter()
            .map(|(r, n)| format!("{r}: {}", int(n)))
            .collect();
        writeln!(md, "Incomplete by reason: {}.\n", list.join("; "))?;
    }

    // 2. Probe effect.
    let c = &v["ab"]["comparison"];
    writeln!(
        md,
        "## 2. Probe effect: A/B at {} req/s\n",
        num(&v["rate"], 0)
    )?;
    writeln!(
        md,
        "{} traced and {} untraced windows of {} s, in flipping pairs (U T T U U T …) so drift \
         falls on both arms. Client-side latency from the scheduled send. Values: median over \
         windows (min–max); the paired ratio is traced/untraced of neighbouring windows.\n",
        int(&c["traced_windows"]),
        int(&c["untraced_windows"]),
        num(&s["window_s"], 0)
    )?;
    writeln!(
        md,
        "| metric | untraced | traced | ratio of medians | paired ratio |\n|---|---|---|---|---|"
    )?;
    for (key, label, digits) in [
        ("p50_us", "p50 µs", 0),
        ("p99_us", "p99 µs", 0),
        ("p999_us", "p99.9 µs", 0),
        ("gateway_cpu_us_per_request", "gateway CPU µs / request", 1),
        ("cpu0_busy", "CPU 0 busy share", 3),
    ] {
        let x = &c["metrics"][key];
        writeln!(
            md,
            "| {label} | {} | {} | **{}** | {} |",
            spread(&x["untraced"], digits),
            spread(&x["traced"], digits),
            num(&x["ratio_of_medians"], 3),
            spread(&x["paired_ratio"], 3)
        )?;
    }
    writeln!(
        md,
        "\n| window | arm | p50 µs | p99 µs | p99.9 µs | 2xx | gateway CPU µs/req | gateway share of CPU 0 | CPU 0 busy |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    for w in v["ab"]["windows"].as_array().into_iter().flatten() {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            int(&w["index"]),
            w["arm"].as_str().unwrap_or("?"),
            num(&w["p50_us"], 0),
            num(&w["p99_us"], 0),
            num(&w["p999_us"], 0),
            int(&w["ok"]),
            num(&w["gateway_cpu_us_per_request"], 1),
            num(&w["gateway_cpu_share"], 3),
            num(&w["cpu0_busy"], 3)
        )?;
    }
    writeln!(
        md,
        "\nCPU 0 busy counts every process on CPU 0, the gateway's share only the gateway: the \
         difference is other work on the machine.\n"
    )?;
    write!(md, "Target: ratio ≤ 1.10 at p50 and p99 (stretch 1.03). ")?;
    match v["max_rate"]["searches"].as_array() {
        Some(searches) => {
            let list = |key: &str| {
                searches
                    .iter()
                    .map(|s| num(&s[key], if key == "ratio" { 3 } else { 0 }))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            writeln!(
                md,
                "Max throughput (closed-loop searches), untraced then traced in {} rounds: \
                 untraced {} req/s, traced {} req/s; ratio of medians **{}** (per round {}). \
                 The untraced search that set the load read {} req/s.\n",
                searches.len(),
                list("untraced"),
                list("traced"),
                num(&v["max_rate"]["ratio_traced_untraced"], 3),
                list("ratio"),
                num(&v["max_rate"]["untraced"], 0),
            )?;
        }
        // Runs recorded before the searches were paired.
        None => writeln!(
            md,
            "Max throughput: untraced {} req/s, traced {} req/s (ratio {}).\n",
            num(&v["max_rate"]["untraced"], 0),
            num(&v["max_rate"]["traced"], 0),
            num(&v["max_rate"]["ratio_traced_untraced"], 3)
        )?,
    }
    if v["max_rate"]["traced_tracepoints_only"].is_number() {
        writeln!(
            md,
            "With the tracepoints alone (`--skip sites`, the floor: no uprobe at all) the traced \
             max is {} req/s (ratio {}).\n",
            num(&v["max_rate"]["traced_tracepoints_only"], 0),
            num(&v["max_rate"]["ratio_tracepoints_only_untraced"], 3)
        )?;
    }

    // 3. Cost.
    writeln!(md, "## 3. Probe cost\n")?;
    match v["calibration"].as_object() {
        Some(cal) => {
            writeln!(
                md,
                "Calibration at the accuracy run's start, on CPU {} ({} s; median of rounds, \
                 min–max across rounds):\n",
                int(&cal["cpu"]),
                num(&cal["elapsed_s"], 1)
            )?;
            writeln!(
                md,
                "| probe kind | ns per hit | min–max | probe ns per request |\n|---|---|---|---|"
            )?;
            let by_kind = &cal["probe_ns_per_request_by_kind"];
            for (kind, ns) in cal["ns_per_hit"].as_object().into_iter().flatten() {
                let range = &cal["ns_per_hit_min_max"][kind];
                let per_request = match kind.as_str() {
                    "site" => &by_kind["sites"],
                    "syscall" => &by_kind["syscalls"],
                    other => &by_kind[other],
                };
                // null: unmeasured (older runs: a figure at or below zero).
                let per_hit = match ns.as_f64() {
                    Some(x) if x > 0.0 => num(ns, 0),
                    _ => "unmeasured".to_owned(),
                };
                writeln!(
                    md,
                    "| {kind} | {per_hit} | {}–{} | {} |",
                    num(&range[0], 0),
                    num(&range[1], 0),
                    num(per_request, 0)
                )?;
            }
            writeln!(
                md,
                "\nProbe time added per request (calibrated cost × hits per request): **{} µs**; \
                 not included: {}.{}\n",
                num(&json_f64(f(&cal["probe_ns_per_request"]) / 1000.0), 1),
                cal["not_included"].as_str().unwrap_or("?"),
                kinds_note("Noisy (rounds disagree)", &v["calibration"]["noisy"])
                    + &kinds_note(
                        "Unmeasured, left out of the sum",
                        &v["calibration"]["unmeasured"]
                    ),
            )?;
        }
        None => writeln!(
            md,
            "Calibration: the tracer reported no `calibration` section in this run (not built yet).\n"
        )?,
    }
    let h = &v["cost"]["hits_per_request"];
    writeln!(
        md,
        "Hits per complete request (accuracy run): sites {}, syscalls {}, sock {}, sched {}, samples {}.\n",
        num(&h["sites"], 1),
        num(&h["syscalls"], 1),
        num(&h["sock"], 1),
        num(&h["sched"], 1),
        num(&h["samples"], 2)
    )?;
    let cost = &v["cost"]["accuracy_run"];
    if cost.is_object() {
        writeln!(
            md,
            "BPF_ENABLE_STATS over the accuracy run ({}):\n",
            cost["bpf_stats"].as_str().unwrap_or("?")
        )?;
        writeln!(
            md,
            "| program (kernel name, 15 chars) | id | runs | mean ns |\n|---|---|---|---|"
        )?;
        for p in cost["bpf"]["programs"].as_array().into_iter().flatten() {
            writeln!(
                md,
                "| {} | {} | {} | {} |",
                p["name"].as_str().unwrap_or("?"),
                int(&p["id"]),
                int(&p["run_count"]),
                num(&p["mean_ns"], 0)
            )?;
        }
        let requests = v["accuracy"]["tracer"]["requests"].as_f64().unwrap_or(0.0);
        let bpf_ns = cost["bpf"]["total_run_time_ns"]
            .as_f64()
            .unwrap_or(f64::NAN);
        writeln!(
            md,
            "\nBPF run time per complete request: **{} µs** (all programs' run time over the \
             session / complete requests; it excludes the uprobe trap itself and the stats' own \
             clock reads).",
            num(&json_f64(bpf_ns / requests / 1000.0), 1)
        )?;
        writeln!(
            md,
            "\nPrograms' kernel time: {} of one CPU. Tracer process: {} s user + {} s system \
             (session {} s), peak RSS {} KiB; **{} of a core** from attach to the end \
             (`tracer_cpu_cores`, target ≤ 0.10). Mode: {}. Kernel-side drops: {}.\n",
            num(&cost["bpf"]["cpu_share"], 4),
            num(&cost["tracer"]["cpu_user_s"], 2),
            num(&cost["tracer"]["cpu_system_s"], 2),
            num(&cost["session_s"], 1),
            int(&cost["tracer"]["peak_rss_kib"]),
            num(&v["cost"]["tracer_cpu_cores"], 3),
            v["cost"]["mode"].as_str().unwrap_or("unknown"),
            v["cost"]["drops"],
        )?;
    } else {
        writeln!(
            md,
            "BPF program statistics: the tracer reported no `cost` section in this run.\n"
        )?;
    }

    // 3b. Cost by mode.
    if let Some(modes) = v["modes"].as_array().filter(|m| !m.is_empty()) {
        let per_arm = int(&v["settings"]["mode_windows_per_arm"]);
        writeln!(
            md,
            "Cost by mode: the gateway's CPU per request in A/B windows at the same rate (the \
             lean row is the A/B above; the others {per_arm} + {per_arm} windows of {} s each), \
             the tracer's hits per complete request in the traced windows (medians), the \
             calibrated probe time of those hits, and the BPF run time per answered request \
             from one more traced window with BPF stats on (the lean row: the accuracy run), \
             since the stats' clock reads would add to the A/B's CPU, and the tracer \
             process's CPU over the traced windows' load (median; `--wait-for` costs only \
             there). The \
             floor rows leave a group unattached (`tracer record --skip`) or attach every hook \
             with programs that return at once (`--empty-programs`): they measure cost only, \
             their requests do not rebuild, so they have no hits.\n",
            num(&v["settings"]["mode_window_s"], 0),
        )?;
        writeln!(
            md,
            "| mode | site hits / req | syscall / sock / sched hits | samples / req | probe µs / req (calibrated) | BPF µs / req | gateway CPU µs / req untraced → traced | ratio | tracer process, cores |\n|---|---|---|---|---|---|---|---|---|"
        )?;
        for m in modes {
            let h = &m["hits_per_request"];
            writeln!(
                md,
                "| {} | {} | {} / {} / {} | {} | {} | {} | {} → {} | **{}** | {} |",
                m["mode"].as_str().unwrap_or("?"),
                num(&h["sites"], 1),
                num(&h["syscalls"], 1),
                num(&h["sock"], 1),
                num(&h["sched"], 1),
                num(&h["samples"], 2),
                num(
                    &json_f64(m["probe_ns_per_request"].as_f64().unwrap_or(f64::NAN) / 1e3),
                    1
                ),
                num(
                    &json_f64(m["bpf_ns_per_request"].as_f64().unwrap_or(f64::NAN) / 1e3),
                    1
                ),
                num(&m["gateway_cpu_us_per_request"]["untraced"], 1),
                num(&m["gateway_cpu_us_per_request"]["traced"], 1),
                num(&m["cpu_ratio"], 3),
                num(&m["tracer_cpu_cores"], 3),
            )?;
        }
        writeln!(md)?;
    }

    // 4. Loss.
    writeln!(md, "## 4. Loss\n")?;
    writeln!(
        md,
        "| run | rate req/s | achieved req/s traced (untraced) | ring MiB | 2xx | events lost | complete | incomplete | 2xx never seen by the tracer | negative gaps | complete across a loss span |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    for r in v["loss"].as_array().into_iter().flatten() {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | **{}** | {} | **{}** | {} | {} | {} |",
            r["name"].as_str().unwrap_or("?"),
            num(&r["rate"], 0),
            achieved_short(r),
            r["ring_mib"]
                .as_u64()
                .map_or("default".to_owned(), |n| n.to_string()),
            int(&r["loadgen"]["ok"]),
            int(&r["lost_events"]),
            int(&r["requests"]),
            int(&r["incomplete"]),
            never_seen(&r["accuracy"]),
            int(&r["accuracy"]["negative"]),
            if r["complete_crossing_loss"].is_null() {
                "not reported".to_owned()
            } else {
                int(&r["complete_crossing_loss"])
            }
        )?;
    }
    writeln!(
        md,
        "\nRequests overlapping a loss span are counted incomplete and excluded from every \
         percentile; none is attributed from partial events. A request all of whose events fell \
         in a loss span is not known to the tracer at all: it is among the lost events, and \
         shows only as a 2xx the tracer never saw. The forced-loss run stops the tracer's reader \
         (SIGSTOP) for {} s with a {} MiB ring. The runs at the traced max each follow the same \
         open loop untraced (in brackets): what loadgen and the gateway achieve at that rate \
         without the tracer.\n",
        num(&s["forced_stall_s"], 1),
        int(&s["forced_ring_mib"])
    )?;

    // 5. Soak.
    let k = &v["soak"];
    writeln!(
        md,
        "## 5. Soak: {} s at {} req/s\n",
        num(&k["seconds"], 0),
        num(&k["rate"], 0)
    )?;
    let peak = k["tracer_peak_rss_kib"].as_f64();
    writeln!(
        md,
        "Tracer peak RSS (VmHWM) **{} MiB** (target < 256 MiB); {} complete, {} incomplete, {} events lost.\n",
        peak.map_or("—".to_owned(), |kib| format!("{:.1}", kib / 1024.0)),
        int(&k["requests"]),
        int(&k["incomplete"]),
        int(&k["lost_events"])
    )?;
    writeln!(
        md,
        "| minute | tracer CPU s | share of one CPU |\n|---|---|---|"
    )?;
    for p in k["cpu_per_minute"].as_array().into_iter().flatten() {
        writeln!(
            md,
            "| {} | {} | {} |",
            int(&p["minute"]),
            num(&p["cpu_s"], 2),
            num(&p["cpu_share"], 3)
        )?;
    }
    writeln!(md)?;

    // 6. Cross-check.
    writeln!(md, "## 6. Independent cross-check (accuracy run)\n")?;
    writeln!(
        md,
        "`crosscheck` aggregates the raw event dump by itself (fsync = SYSCALL exit − enter; \
         run-queue delay = wakeup of a blocked thread or preemption → switch-in), beside the \
         model's figures from breakdown.json `kernel`.\n"
    )?;
    match v["crosscheck"]["comparison"].as_object() {
        Some(cmp) => {
            writeln!(
                md,
                "| distribution | source | count | p50 µs | p99 µs | max µs |\n|---|---|---|---|---|---|"
            )?;
            for (name, x) in cmp {
                for source in ["independent", "model"] {
                    let d = &x[source];
                    writeln!(
                        md,
                        "| {name} | {source} | {} | {} | {} | {} |",
                        int(&d["count"]),
                        num(&d["p50_us"], 1),
                        num(&d["p99_us"], 1),
                        num(&d["max_us"], 1)
                    )?;
                }
            }
        }
        None => writeln!(md, "No comparison in this run.")?,
    }
    writeln!(
        md,
        "\nWall time of the whole validation: {} s.",
        num(&v["wall_time_s"], 0)
    )?;
    Ok(())
}

/// A loss run's achieved rate, and the same open loop's untraced, in brackets.
fn achieved_short(run: &Value) -> String {
    let traced = int(&run["loadgen"]["achieved_rate"]);
    let untraced = &run["untraced"]["achieved_rate"];
    if untraced.is_number() {
        format!("{traced} ({})", int(untraced))
    } else {
        traced
    }
}

/// A loss run's achieved rate as a share of the traced max, beside the untraced open loop's.
fn achieved(run: &Value) -> String {
    let (traced, untraced) = (
        &run["loadgen"]["achieved_rate"],
        &run["untraced"]["achieved_rate"],
    );
    let traced_max = f(&run["rate"]) / f(&run["of_traced_max"]);
    if !untraced.is_number() || !traced_max.is_finite() {
        return format!("{} req/s", int(traced));
    }
    let share = |rate: &Value| {
        format!(
            "{} req/s, {:.0}% of the traced max",
            int(rate),
            100.0 * f(rate) / traced_max
        )
    };
    format!(
        "{} (the same open loop untraced: {})",
        share(traced),
        share(untraced)
    )
}

/// 2xx responses neither complete nor listed incomplete by the tracer.
fn never_seen(join: &Value) -> String {
    let listed: u64 = join["client_only_incomplete"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
    match join["untraced_ok"].as_u64() {
        Some(n) => n.saturating_sub(listed).to_string(),
        None => "—".to_owned(),
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// What the floor rows say: the cost of the kernel events alone bounds any design that keeps
/// them, whatever it does with the uprobes.
fn floor(md: &mut String, v: &Value) -> std::fmt::Result {
    let modes = v["modes"].as_array().into_iter().flatten();
    let row = |name: &str| {
        modes
            .clone()
            .find(|m| m["mode"].as_str().is_some_and(|n| n.starts_with(name)))
    };
    let (Some(tracepoints), Some(sites)) = (row("tracepoints only"), row("sites only")) else {
        return Ok(());
    };
    let added = |m: &Value| {
        f(&m["gateway_cpu_us_per_request"]["traced"])
            - f(&m["gateway_cpu_us_per_request"]["untraced"])
    };
    writeln!(
        md,
        "- The floor: the tracepoints alone (no uprobe) cost ×{:.3} CPU per request (+{:.1} µs) \
         and take max throughput to ×{:.2}; the uprobe sites alone cost ×{:.3} (+{:.1} µs). No \
         arrangement of the sites can bring the lean set below the first figures while it keeps \
         the kernel events the split needs.",
        f(&tracepoints["cpu_ratio"]),
        added(tracepoints),
        f(&v["max_rate"]["ratio_tracepoints_only_untraced"]),
        f(&sites["cpu_ratio"]),
        added(sites),
    )?;
    if let Some(empty) = row("hooks only") {
        writeln!(
            md,
            "- With every hook of the lean set attached and every program returning at once \
             (`--empty-programs`), the gateway pays ×{:.3} CPU per request (+{:.1} µs): the \
             uprobe traps and the tracepoint dispatch alone, before any program work. The rest \
             of the lean row's +{:.1} µs is what the programs do.",
            f(&empty["cpu_ratio"]),
            added(empty),
            row("lean").map_or(f64::NAN, added),
        )?;
    }
    Ok(())
}

/// A few sentences computed from the figures: what holds, what misses, and what the CPU
/// figures say about why.
fn reading(md: &mut String, v: &Value) -> std::fmt::Result {
    writeln!(md, "## Reading (computed from the figures below)\n")?;
    let j = &v["accuracy"]["join"];
    writeln!(
        md,
        "- Accuracy: {} requests matched by id; {} negative `client − tracer` gaps; {} 200s \
         not traced complete.",
        int(&j["matched"]),
        int(&j["negative"]),
        int(&j["untraced_ok"])
    )?;
    let m = &v["ab"]["comparison"]["metrics"];
    let (p50, p99) = (
        f(&m["p50_us"]["ratio_of_medians"]),
        f(&m["p99_us"]["ratio_of_medians"]),
    );
    let verdict = |r: f64| match r {
        r if r <= 1.03 => "meets the 1.03 stretch target",
        r if r <= 1.10 => "meets the 1.10 target",
        _ => "misses the 1.10 target",
    };
    writeln!(
        md,
        "- Probe effect: traced/untraced p50 ×{p50:.2} ({}), p99 ×{p99:.2} ({}).",
        verdict(p50),
        verdict(p99)
    )?;
    let cpu = &m["gateway_cpu_us_per_request"];
    let (cpu_u, cpu_t) = (f(&cpu["untraced"]["median"]), f(&cpu["traced"]["median"]));
    let cost = &v["cost"]["accuracy_run"];
    let requests = f(&v["accuracy"]["tracer"]["requests"]);
    let bpf_us = f(&cost["bpf"]["total_run_time_ns"]) / requests / 1000.0;
    let added = cpu_t - cpu_u;
    let split = if bpf_us < added {
        format!(
            "the remaining {:.1} µs is entry cost BPF stats do not see (uprobe trap, tracepoint \
             dispatch) and cache effects",
            added - bpf_us
        )
    } else {
        "BPF time exceeds the gateway's added CPU because part of it is not charged to the \
         gateway (programs on the other CPU, data-ready in the client's context, other tasks' \
         switches)"
            .to_owned()
    };
    writeln!(
        md,
        "- Why: the gateway's CPU per request goes from {cpu_u:.1} µs untraced to {cpu_t:.1} µs \
         traced (+{added:.1} µs). BPF run time per complete request is {bpf_us:.1} µs (all \
         programs, any CPU); {split}. CPU 0 busy share goes from {:.2} to {:.2}: an open loop \
         near saturation turns added CPU into queueing, so latency ratios exceed the CPU ratio.",
        f(&m["cpu0_busy"]["untraced"]["median"]),
        f(&m["cpu0_busy"]["traced"]["median"])
    )?;
    let max_ratio = f(&v["max_rate"]["ratio_traced_untraced"]);
    let cpu_ratio = cpu_t / cpu_u;
    let meets = |ok: bool| if ok { "meets" } else { "misses" };
    writeln!(
        md,
        "- Targets: CPU per request ×{cpu_ratio:.3} ({} ≤ 1.05); max throughput ×{max_ratio:.2} \
         ({} ≥ 0.90).",
        meets(cpu_ratio <= 1.05),
        meets(max_ratio >= 0.90)
    )?;
    floor(md, v)?;
    for r in v["loss"].as_array().into_iter().flatten() {
        writeln!(
            md,
            "- Loss, {}: asked {} req/s, achieved {}, {} events/s; {} events lost, {} \
             requests incomplete, {} complete requests across a loss span.",
            r["name"].as_str().unwrap_or("?"),
            int(&r["rate"]),
            achieved(r),
            int(&r["events_per_s"]),
            int(&r["lost_events"]),
            int(&r["incomplete"]),
            int(&r["complete_crossing_loss"])
        )?;
    }
    let k = &v["soak"];
    writeln!(
        md,
        "- Soak: tracer peak RSS {:.1} MiB over {} s (target < 256 MiB).\n",
        f(&k["tracer_peak_rss_kib"]) / 1024.0,
        num(&k["seconds"], 0)
    )?;
    writeln!(
        md,
        "The machine is shared: the load average at start is in the header; the A/B windows' \
         spread shows how much of a ratio is noise.\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_figures_render_as_dashes_not_panics() {
        let mut md = String::new();
        render(&mut md, &serde_json::json!({})).unwrap();
        for heading in [
            "## 1. Accuracy",
            "## 2. Probe effect",
            "## 4. Loss",
            "## 6. Independent",
        ] {
            assert!(md.contains(heading), "{heading}");
        }
        assert!(
            md.contains("| **negative gaps** (target 0) | **—** |"),
            "{md}"
        );
    }

    #[test]
    fn calibration_table() {
        let v = serde_json::json!({"calibration": {
            "cpu": 1, "elapsed_s": 2.5,
            "ns_per_hit": {"site": 900.0, "syscall": 120.0},
            "ns_per_hit_min_max": {"site": [850.0, 990.0], "syscall": [100.0, 150.0]},
            "probe_ns_per_request": 61200.0,
            "probe_ns_per_request_by_kind": {"sites": 60000.0, "syscalls": 1200.0},
            "noisy": [], "not_included": "cpu-clock samples",
        }});
        let mut md = String::new();
        render(&mut md, &v).unwrap();
        assert!(md.contains("| site | 900 | 850–990 | 60000 |"), "{md}");
        assert!(md.contains("**61.2 µs**"), "{md}");
    }

    #[test]
    fn an_unmeasured_kind_is_said_not_printed_as_a_figure() {
        let v = serde_json::json!({"calibration": {
            "cpu": 1, "elapsed_s": 2.5,
            "ns_per_hit": {"site": 900.0, "sock": null},
            "ns_per_hit_min_max": {"site": [850.0, 990.0], "sock": [-290.0, 1841.0]},
            "probe_ns_per_request": 60000.0,
            "probe_ns_per_request_by_kind": {"sites": 60000.0, "sock": null},
            "noisy": [], "unmeasured": ["sock"], "not_included": "cpu-clock samples",
        }});
        let mut md = String::new();
        render(&mut md, &v).unwrap();
        assert!(md.contains("| sock | unmeasured | -290–1841 | — |"), "{md}");
        assert!(
            md.contains("Unmeasured, left out of the sum: sock."),
            "{md}"
        );
    }

    #[test]
    fn paired_max_searches_and_the_hooks_only_floor() {
        let cpu = |u: f64, t: f64| serde_json::json!({"untraced": u, "traced": t});
        let v = serde_json::json!({
            "max_rate": {
                "untraced": 20000.0,
                "searches": [
                    {"untraced": 19000.0, "traced": 17100.0, "ratio": 0.9},
                    {"untraced": 21000.0, "traced": 16800.0, "ratio": 0.8},
                ],
                "traced": 16950.0, "ratio_traced_untraced": 0.8475,
                "ratio_tracepoints_only_untraced": 0.9,
            },
            "modes": [
                {"mode": "lean (default)", "gateway_cpu_us_per_request": cpu(100.0, 110.0)},
                {"mode": "tracepoints only (floor)", "cpu_ratio": 1.05,
                 "gateway_cpu_us_per_request": cpu(100.0, 105.0)},
                {"mode": "sites only (floor)", "cpu_ratio": 1.06,
                 "gateway_cpu_us_per_request": cpu(100.0, 106.0)},
                {"mode": "hooks only, programs empty (floor)", "cpu_ratio": 1.04,
                 "gateway_cpu_us_per_request": cpu(100.0, 104.0)},
            ],
        });
        let mut md = String::new();
        render(&mut md, &v).unwrap();
        assert!(
            md.contains(
                "untraced then traced in 2 rounds: untraced 19000, 21000 req/s, traced 17100, \
                 16800 req/s; ratio of medians **0.848** (per round 0.900, 0.800). The untraced \
                 search that set the load read 20000 req/s."
            ),
            "{md}"
        );
        assert!(
            md.contains("(`--empty-programs`), the gateway pays ×1.040 CPU per request (+4.0 µs)"),
            "{md}"
        );
        assert!(md.contains("The rest of the lean row's +10.0 µs"), "{md}");
    }

    #[test]
    fn loss_runs_at_the_traced_max_beside_the_same_load_untraced() {
        let run = |name: &str, rate: f64, share: f64, achieved: f64, untraced: Value| {
            serde_json::json!({
                "name": name, "rate": rate, "of_traced_max": share,
                "loadgen": {"achieved_rate": achieved}, "untraced": untraced,
                "lost_events": 0, "incomplete": 0, "complete_crossing_loss": 0,
            })
        };
        let v = serde_json::json!({"loss": [
            run("load-100pct", 10000.0, 1.0, 6000.0, serde_json::json!({"achieved_rate": 6500.0})),
            run("forced-loss", 2500.0, 0.25, 2490.0, Value::Null),
        ]});
        let mut md = String::new();
        render(&mut md, &v).unwrap();
        assert!(
            md.contains(
                "- Loss, load-100pct: asked 10000 req/s, achieved 6000 req/s, 60% of the traced \
                 max (the same open loop untraced: 6500 req/s, 65% of the traced max),"
            ),
            "{md}"
        );
        assert!(md.contains("| load-100pct | 10000 | 6000 (6500) |"), "{md}");
        assert!(
            md.contains("- Loss, forced-loss: asked 2500 req/s, achieved 2490 req/s,"),
            "{md}"
        );
        assert!(md.contains("| forced-loss | 2500 | 2490 |"), "{md}");
    }
}

/// Golden tests: every committed run's README.md is what its validation.json renders to.
#[cfg(test)]
mod golden {
    use super::*;

    #[test]
    fn every_committed_validation_re_renders_byte_for_byte() {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(crate::workspace::root().join("profiles"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("validation-"))
            })
            .collect();
        dirs.sort();
        assert!(!dirs.is_empty(), "no profiles/validation-* directory");
        let mut differing = Vec::new();
        for dir in &dirs {
            let v: Value = crate::workspace::read_json(&dir.join("validation.json")).unwrap();
            let mut md = String::new();
            render(&mut md, &v).unwrap();
            let committed = std::fs::read_to_string(dir.join("README.md")).unwrap();
            if md != committed {
                differing.push(dir.display().to_string());
            }
        }
        assert!(
            differing.is_empty(),
            "re-rendered READMEs differ: {differing:?}"
        );
    }
}
