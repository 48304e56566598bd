//! README.md of a validation run, written only from validation.json's typed figures.
//!
//! Verdicts come from `session::targets`; nothing here compares a figure with a literal.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use session::analysis::accuracy::Accuracy;
use session::targets::{
    self, CPU_PER_REQUEST_RATIO, MAX_RATE_RATIO, NEGATIVE_GAPS, PROBE_EFFECT_RATIO,
    PROBE_EFFECT_STRETCH, TRACER_CPU_CORES, TRACER_PEAK_RSS_MIB,
};
use session::validation::{Calibration, LossRun, Mode, VALIDATION_JSON, Validation};

type Out = std::fmt::Result;

/// A figure with `digits` decimals; "—" when missing or not finite.
fn num(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "—".to_owned(),
    }
}

/// A count; "—" when missing.
fn int(n: Option<u64>) -> String {
    n.map_or_else(|| "—".to_owned(), |n| n.to_string())
}

/// A figure for arithmetic: NaN when missing, so the sentence shows it did not measure.
fn f(x: Option<f64>) -> f64 {
    x.unwrap_or(f64::NAN)
}

/// ` LABEL: a, b.` for a non-empty list of kinds; nothing otherwise.
fn kinds_note(label: &str, kinds: Option<&[String]>) -> String {
    match kinds.filter(|kinds| !kinds.is_empty()) {
        Some(kinds) => format!(" {label}: {}.", kinds.join(", ")),
        None => String::new(),
    }
}

/// `median (min–max)` of a spread.
fn spread(s: &session::analysis::ab::Spread, digits: usize) -> String {
    format!(
        "{} ({}–{})",
        num(s.median, digits),
        num(s.min, digits),
        num(s.max, digits)
    )
}

/// "meets" or "misses" (an unmeasured figure misses).
fn meets(bound: targets::Bound, value: f64) -> &'static str {
    if bound.verdict(Some(value)).met() {
        "meets"
    } else {
        "misses"
    }
}

/// Reads DIR/validation.json and writes DIR/README.md from it.
pub fn render_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let v: Validation = crate::workspace::read_json(&dir.join(VALIDATION_JSON))?;
    write(dir, &v)
}

pub fn write(dir: &Path, v: &Validation) -> anyhow::Result<PathBuf> {
    let path = dir.join("README.md");
    std::fs::write(&path, render(v)).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

pub fn render(v: &Validation) -> String {
    let mut md = String::new();
    let sections: [fn(&mut String, &Validation) -> Out; 9] = [
        header,
        reading,
        accuracy,
        probe_effect,
        probe_cost,
        cost_by_mode,
        loss,
        soak,
        cross_check,
    ];
    for section in sections {
        section(&mut md, v).expect("writing to a String");
    }
    md
}

fn header(md: &mut String, v: &Validation) -> Out {
    let m = &v.machine;
    writeln!(md, "# Tracer validation\n")?;
    writeln!(
        md,
        "Every figure below is read from `validation.json` of the same run. Command: `{}`.\n",
        v.command
    )?;
    writeln!(
        md,
        "- machine: {} × {}, {} GiB; kernel Linux {}",
        m.cpus,
        m.cpu_model,
        num(Some(m.memory_gib), 1),
        m.kernel
    )?;
    writeln!(
        md,
        "- commit `{}`, {}; load average at start {}",
        m.commit, m.date, m.load_average
    )?;
    if let Some(note) = &m.commit_note {
        writeln!(md, "- note on the commit: {note}")?;
    }
    if !m.uncommitted.is_empty() {
        let list: Vec<String> = m.uncommitted.iter().map(|p| format!("`{p}`")).collect();
        writeln!(md, "- uncommitted at run time: {}", list.join(", "))?;
    }
    let pins: Vec<String> = v
        .pinning
        .iter()
        .map(|p| format!("{} on CPU {}", p.process, p.applied))
        .collect();
    writeln!(md, "- pinning (as applied): {}", pins.join("; "))?;
    let s = &v.settings;
    writeln!(
        md,
        "- load {} of the untraced max = **{} req/s** over {} connections; max untraced {} req/s ({})\n",
        num(Some(s.load), 2),
        num(Some(v.rate), 0),
        s.connections,
        num(Some(v.max_rate.untraced), 0),
        v.max_rate.untraced_source
    )
}

fn accuracy(md: &mut String, v: &Validation) -> Out {
    let a = &v.accuracy;
    let (j, t) = (&a.join, &a.tracer);
    let g = &j.client_minus_tracer;
    writeln!(
        md,
        "## 1. Accuracy against the client ({} s traced)\n",
        num(Some(v.settings.accuracy_s), 0)
    )?;
    writeln!(
        md,
        "Joined by request id on CLOCK_MONOTONIC: loadgen's `received − sent` minus the tracer's \
         `t_done − t_arrive` (loopback and client-stack time; must be ≥ 0).\n"
    )?;
    writeln!(md, "| figure | value |\n|---|---|")?;
    writeln!(md, "| 2xx responses (loadgen) | {} |", a.loadgen.ok)?;
    writeln!(
        md,
        "| complete in the tracer / incomplete | {} / {} |",
        t.requests, t.incomplete
    )?;
    writeln!(md, "| matched by id | {} |", j.matched)?;
    writeln!(
        md,
        "| client − tracer p50 / p99 / max (µs) | {} / {} / {} |",
        num(Some(g.p50_us), 1),
        num(Some(g.p99_us), 1),
        num(Some(g.max_us), 1)
    )?;
    writeln!(
        md,
        "| client − tracer min (µs) | {} |",
        num(Some(g.min_us), 1)
    )?;
    writeln!(
        md,
        "| **negative gaps** (target {}) | **{}** |",
        NEGATIVE_GAPS.limit(),
        j.negative
    )?;
    writeln!(
        md,
        "| t_arrive < sent / t_done > received | {} / {} |",
        j.arrive_before_sent, j.done_after_received
    )?;
    writeln!(
        md,
        "| answered by the gateway, not complete in the tracer (200s among them) | {} ({}) |",
        j.client_only, j.untraced_ok
    )?;
    writeln!(
        md,
        "| complete in the tracer, unknown to the client | {} |",
        j.tracer_only
    )?;
    writeln!(md, "| events lost | {} |\n", t.lost_events)?;
    if !t.incomplete_reasons.is_empty() {
        let list: Vec<String> = t
            .incomplete_reasons
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        writeln!(md, "Incomplete by reason: {}.\n", list.join("; "))?;
    }
    Ok(())
}

fn probe_effect(md: &mut String, v: &Validation) -> Out {
    let c = &v.ab.comparison;
    writeln!(
        md,
        "## 2. Probe effect: A/B at {} req/s\n",
        num(Some(v.rate), 0)
    )?;
    writeln!(
        md,
        "{} traced and {} untraced windows of {} s, in flipping pairs (U T T U U T …) so drift \
         falls on both arms. Client-side latency from the scheduled send. Values: median over \
         windows (min–max); the paired ratio is traced/untraced of neighbouring windows.\n",
        c.traced_windows,
        c.untraced_windows,
        num(Some(v.settings.window_s), 0)
    )?;
    writeln!(
        md,
        "| metric | untraced | traced | ratio of medians | paired ratio |\n|---|---|---|---|---|"
    )?;
    let m = &c.metrics;
    for (x, label, digits) in [
        (&m.p50_us, "p50 µs", 0),
        (&m.p99_us, "p99 µs", 0),
        (&m.p999_us, "p99.9 µs", 0),
        (&m.gateway_cpu_us_per_request, "gateway CPU µs / request", 1),
        (&m.cpu0_busy, "CPU 0 busy share", 3),
    ] {
        writeln!(
            md,
            "| {label} | {} | {} | **{}** | {} |",
            spread(&x.untraced, digits),
            spread(&x.traced, digits),
            num(x.ratio_of_medians, 3),
            spread(&x.paired_ratio, 3)
        )?;
    }
    writeln!(
        md,
        "\n| window | arm | p50 µs | p99 µs | p99.9 µs | 2xx | gateway CPU µs/req | gateway share of CPU 0 | CPU 0 busy |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    for w in &v.ab.windows {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            w.index,
            w.arm.name(),
            num(w.p50_us, 0),
            num(w.p99_us, 0),
            num(w.p999_us, 0),
            w.ok,
            num(w.gateway_cpu_us_per_request, 1),
            num(w.gateway_cpu_share, 3),
            num(w.cpu0_busy, 3)
        )?;
    }
    writeln!(
        md,
        "\nCPU 0 busy counts every process on CPU 0, the gateway's share only the gateway: the \
         difference is other work on the machine.\n"
    )?;
    write!(
        md,
        "Target: ratio {} at p50 and p99 (stretch {:.2}). ",
        PROBE_EFFECT_RATIO.describe(2),
        PROBE_EFFECT_STRETCH.limit()
    )?;
    max_throughput(md, v)
}

fn max_throughput(md: &mut String, v: &Validation) -> Out {
    let r = &v.max_rate;
    match &r.searches {
        Some(searches) => {
            let list = |pick: fn(&session::validation::Search) -> Option<f64>, digits| {
                searches
                    .iter()
                    .map(|s| num(pick(s), digits))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            writeln!(
                md,
                "Max throughput (closed-loop searches), untraced then traced in {} rounds: \
                 untraced {} req/s, traced {} req/s; ratio of medians **{}** (per round {}). \
                 The untraced search that set the load read {} req/s.\n",
                searches.len(),
                list(|s| Some(s.untraced), 0),
                list(|s| Some(s.traced), 0),
                num(r.ratio_traced_untraced, 3),
                list(|s| s.ratio, 3),
                num(Some(r.untraced), 0),
            )?;
        }
        // Runs recorded before the searches were paired.
        None => writeln!(
            md,
            "Max throughput: untraced {} req/s, traced {} req/s (ratio {}).\n",
            num(Some(r.untraced), 0),
            num(Some(r.traced), 0),
            num(r.ratio_traced_untraced, 3)
        )?,
    }
    if let Some(floor) = r.traced_tracepoints_only {
        writeln!(
            md,
            "With the tracepoints alone (`--skip sites`, the floor: no uprobe at all) the traced \
             max is {} req/s (ratio {}).\n",
            num(Some(floor), 0),
            num(r.ratio_tracepoints_only_untraced, 3)
        )?;
    }
    Ok(())
}

fn probe_cost(md: &mut String, v: &Validation) -> Out {
    writeln!(md, "## 3. Probe cost\n")?;
    match &v.calibration {
        Some(cal) => calibration(md, cal)?,
        None => writeln!(
            md,
            "Calibration: the tracer reported no `calibration` section in this run (not built yet).\n"
        )?,
    }
    let h = &v.cost.hits_per_request;
    writeln!(
        md,
        "Hits per complete request (accuracy run): sites {}, syscalls {}, sock {}, sched {}, samples {}.\n",
        num(h.sites, 1),
        num(h.syscalls, 1),
        num(h.sock, 1),
        num(h.sched, 1),
        num(h.samples, 2)
    )?;
    let Some(cost) = &v.cost.accuracy_run else {
        return writeln!(
            md,
            "BPF program statistics: the tracer reported no `cost` section in this run.\n"
        );
    };
    writeln!(
        md,
        "BPF_ENABLE_STATS over the accuracy run ({}):\n",
        cost.bpf_stats
    )?;
    writeln!(
        md,
        "| program (kernel name, 15 chars) | id | runs | mean ns |\n|---|---|---|---|"
    )?;
    for p in cost.bpf.iter().flat_map(|b| &b.programs) {
        writeln!(
            md,
            "| {} | {} | {} | {} |",
            p.name,
            p.id,
            p.run_count,
            num(p.mean_ns, 0)
        )?;
    }
    let requests = v.accuracy.tracer.requests as f64;
    writeln!(
        md,
        "\nBPF run time per complete request: **{} µs** (all programs' run time over the \
         session / complete requests; it excludes the uprobe trap itself and the stats' own \
         clock reads).",
        num(Some(f(cost.bpf_run_time_ns()) / requests / 1000.0), 1)
    )?;
    writeln!(
        md,
        "\nPrograms' kernel time: {} of one CPU. Tracer process: {} s user + {} s system \
         (session {} s), peak RSS {} KiB; **{} of a core** from attach to the end \
         (`tracer_cpu_cores`, target {}). Mode: {}. Kernel-side drops: {}.\n",
        num(cost.bpf.as_ref().and_then(|b| b.cpu_share), 4),
        num(Some(cost.tracer.cpu_user_s), 2),
        num(Some(cost.tracer.cpu_system_s), 2),
        num(Some(cost.session_s), 1),
        int(cost.tracer.peak_rss_kib),
        num(v.cost.tracer_cpu_cores, 3),
        TRACER_CPU_CORES.describe(2),
        v.cost.mode.as_deref().unwrap_or("unknown"),
        serde_json::to_string(&v.cost.drops).expect("counters serialize"),
    )
}

fn calibration(md: &mut String, cal: &Calibration) -> Out {
    writeln!(
        md,
        "Calibration at the accuracy run's start, on CPU {} ({} s; median of rounds, \
         min–max across rounds):\n",
        cal.cpu,
        num(Some(cal.elapsed_s), 1)
    )?;
    writeln!(
        md,
        "| probe kind | ns per hit | min–max | probe ns per request |\n|---|---|---|---|"
    )?;
    for (kind, ns) in &cal.ns_per_hit {
        let [min, max] = cal
            .ns_per_hit_min_max
            .get(kind)
            .copied()
            .unwrap_or_default();
        // null: unmeasured (older runs: a figure at or below zero).
        let per_hit = match ns {
            Some(x) if *x > 0.0 => num(Some(*x), 0),
            _ => "unmeasured".to_owned(),
        };
        writeln!(
            md,
            "| {kind} | {per_hit} | {}–{} | {} |",
            num(min, 0),
            num(max, 0),
            num(cal.per_request(kind), 0)
        )?;
    }
    writeln!(
        md,
        "\nProbe time added per request (calibrated cost × hits per request): **{} µs**; \
         not included: {}.{}\n",
        num(cal.probe_ns_per_request.map(|ns| ns / 1000.0), 1),
        cal.not_included,
        kinds_note("Noisy (rounds disagree)", Some(&cal.noisy))
            + &kinds_note("Unmeasured, left out of the sum", cal.unmeasured.as_deref()),
    )
}

fn cost_by_mode(md: &mut String, v: &Validation) -> Out {
    let Some(modes) = v.modes.as_ref().filter(|m| !m.is_empty()) else {
        return Ok(());
    };
    let per_arm = int(v.settings.mode_windows_per_arm);
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
        num(v.settings.mode_window_s, 0),
    )?;
    writeln!(
        md,
        "| mode | site hits / req | syscall / sock / sched hits | samples / req | probe µs / req (calibrated) | BPF µs / req | gateway CPU µs / req untraced → traced | ratio | tracer process, cores |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    for m in modes {
        let h = m.hits_per_request.unwrap_or_default();
        let us = |ns: Option<f64>| num(ns.map(|ns| ns / 1e3), 1);
        writeln!(
            md,
            "| {} | {} | {} / {} / {} | {} | {} | {} | {} → {} | **{}** | {} |",
            m.mode,
            num(h.sites, 1),
            num(h.syscalls, 1),
            num(h.sock, 1),
            num(h.sched, 1),
            num(h.samples, 2),
            us(m.probe_ns_per_request),
            us(m.bpf_ns_per_request),
            num(m.gateway_cpu_us_per_request.untraced, 1),
            num(m.gateway_cpu_us_per_request.traced, 1),
            num(m.cpu_ratio, 3),
            num(m.tracer_cpu_cores, 3),
        )?;
    }
    writeln!(md)
}

fn loss(md: &mut String, v: &Validation) -> Out {
    writeln!(md, "## 4. Loss\n")?;
    writeln!(
        md,
        "| run | rate req/s | achieved req/s traced (untraced) | ring MiB | 2xx | events lost | complete | incomplete | 2xx never seen by the tracer | negative gaps | complete across a loss span |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    for r in &v.loss {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | **{}** | {} | **{}** | {} | {} | {} |",
            r.name,
            num(Some(r.rate), 0),
            achieved_short(r),
            r.ring_mib
                .map_or_else(|| "default".to_owned(), |n| n.to_string()),
            r.loadgen.ok,
            r.lost_events,
            r.requests,
            r.incomplete,
            never_seen(&r.accuracy),
            r.accuracy.negative,
            r.complete_crossing_loss
                .map_or_else(|| "not reported".to_owned(), |n| n.to_string())
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
        num(Some(v.settings.forced_stall_s), 1),
        v.settings.forced_ring_mib
    )
}

fn soak(md: &mut String, v: &Validation) -> Out {
    let k = &v.soak;
    writeln!(
        md,
        "## 5. Soak: {} s at {} req/s\n",
        num(Some(k.seconds), 0),
        num(Some(k.rate), 0)
    )?;
    writeln!(
        md,
        "Tracer peak RSS (VmHWM) **{} MiB** (target < {:.0} MiB); {} complete, {} incomplete, {} events lost.\n",
        num(k.tracer_peak_rss_kib.map(|kib| kib as f64 / 1024.0), 1),
        TRACER_PEAK_RSS_MIB.limit(),
        k.requests,
        k.incomplete,
        k.lost_events
    )?;
    writeln!(
        md,
        "| minute | tracer CPU s | share of one CPU |\n|---|---|---|"
    )?;
    for p in &k.cpu_per_minute {
        writeln!(
            md,
            "| {} | {} | {} |",
            p.minute,
            num(Some(p.cpu_s), 2),
            num(Some(p.cpu_share), 3)
        )?;
    }
    writeln!(md)
}

fn cross_check(md: &mut String, v: &Validation) -> Out {
    writeln!(md, "## 6. Independent cross-check (accuracy run)\n")?;
    writeln!(
        md,
        "`crosscheck` aggregates the raw event dump by itself (fsync = SYSCALL exit − enter; \
         run-queue delay = wakeup of a blocked thread or preemption → switch-in), beside the \
         model's figures from breakdown.json `kernel`.\n"
    )?;
    writeln!(
        md,
        "| distribution | source | count | p50 µs | p99 µs | max µs |\n|---|---|---|---|---|---|"
    )?;
    for (name, pair) in v.crosscheck.comparison.named() {
        let mine = &pair.independent;
        let rows = [
            (
                "independent",
                Some(mine.count),
                Some(mine.p50_us),
                Some(mine.p99_us),
                Some(mine.max_us),
            ),
            (
                "model",
                pair.model.map(|d| d.count),
                pair.model.map(|d| d.p50_us),
                pair.model.map(|d| d.p99_us),
                pair.model.map(|d| d.max_us),
            ),
        ];
        for (source, count, p50, p99, max) in rows {
            writeln!(
                md,
                "| {name} | {source} | {} | {} | {} | {} |",
                int(count),
                num(p50, 1),
                num(p99, 1),
                num(max, 1)
            )?;
        }
    }
    writeln!(
        md,
        "\nWall time of the whole validation: {} s.",
        num(Some(v.wall_time_s), 0)
    )
}

/// A loss run's achieved rate, and the same open loop's untraced, in brackets.
fn achieved_short(run: &LossRun) -> String {
    let traced = num(run.loadgen.achieved_rate, 0);
    match run.untraced.and_then(|u| u.achieved_rate) {
        Some(untraced) => format!("{traced} ({})", num(Some(untraced), 0)),
        None => traced,
    }
}

/// A loss run's achieved rate as a share of the traced max, beside the untraced open loop's.
fn achieved(run: &LossRun) -> String {
    let traced = run.loadgen.achieved_rate;
    let untraced = run.untraced.and_then(|u| u.achieved_rate);
    let traced_max = run.rate / f(run.of_traced_max);
    if untraced.is_none() || !traced_max.is_finite() {
        return format!("{} req/s", num(traced, 0));
    }
    let share = |rate: Option<f64>| {
        format!(
            "{} req/s, {:.0}% of the traced max",
            num(rate, 0),
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
fn never_seen(join: &Accuracy) -> String {
    let listed: u64 = join.client_only_incomplete.values().sum();
    join.untraced_ok.saturating_sub(listed).to_string()
}

/// A mode row whose name starts with `name`.
fn mode<'a>(v: &'a Validation, name: &str) -> Option<&'a Mode> {
    v.modes.iter().flatten().find(|m| m.mode.starts_with(name))
}

/// What the gateway's CPU per request gained in a mode row, µs.
fn added_cpu(m: &Mode) -> f64 {
    f(m.gateway_cpu_us_per_request.traced) - f(m.gateway_cpu_us_per_request.untraced)
}

/// What the floor rows say: the cost of the kernel events alone bounds any design that keeps
/// them, whatever it does with the uprobes.
fn floor(md: &mut String, v: &Validation) -> Out {
    let (Some(tracepoints), Some(sites)) = (mode(v, "tracepoints only"), mode(v, "sites only"))
    else {
        return Ok(());
    };
    writeln!(
        md,
        "- The floor: the tracepoints alone (no uprobe) cost ×{:.3} CPU per request (+{:.1} µs) \
         and take max throughput to ×{:.2}; the uprobe sites alone cost ×{:.3} (+{:.1} µs). No \
         arrangement of the sites can bring the lean set below the first figures while it keeps \
         the kernel events the split needs.",
        f(tracepoints.cpu_ratio),
        added_cpu(tracepoints),
        f(v.max_rate.ratio_tracepoints_only_untraced),
        f(sites.cpu_ratio),
        added_cpu(sites),
    )?;
    if let Some(empty) = mode(v, "hooks only") {
        writeln!(
            md,
            "- With every hook of the lean set attached and every program returning at once \
             (`--empty-programs`), the gateway pays ×{:.3} CPU per request (+{:.1} µs): the \
             uprobe traps and the tracepoint dispatch alone, before any program work. The rest \
             of the lean row's +{:.1} µs is what the programs do.",
            f(empty.cpu_ratio),
            added_cpu(empty),
            mode(v, "lean").map_or(f64::NAN, added_cpu),
        )?;
    }
    Ok(())
}

/// The probe-effect verdict on a traced/untraced ratio, in words.
fn probe_effect_verdict(ratio: f64) -> String {
    if PROBE_EFFECT_STRETCH.verdict(Some(ratio)).met() {
        format!(
            "meets the {:.2} stretch target",
            PROBE_EFFECT_STRETCH.limit()
        )
    } else {
        format!(
            "{} the {:.2} target",
            meets(PROBE_EFFECT_RATIO, ratio),
            PROBE_EFFECT_RATIO.limit()
        )
    }
}

/// A few sentences computed from the figures: what holds, what misses, and what the CPU
/// figures say about why.
fn reading(md: &mut String, v: &Validation) -> Out {
    writeln!(md, "## Reading (computed from the figures below)\n")?;
    let j = &v.accuracy.join;
    writeln!(
        md,
        "- Accuracy: {} requests matched by id; {} negative `client − tracer` gaps; {} 200s \
         not traced complete.",
        j.matched, j.negative, j.untraced_ok
    )?;
    let m = &v.ab.comparison.metrics;
    let (p50, p99) = (f(m.p50_us.ratio_of_medians), f(m.p99_us.ratio_of_medians));
    writeln!(
        md,
        "- Probe effect: traced/untraced p50 ×{p50:.2} ({}), p99 ×{p99:.2} ({}).",
        probe_effect_verdict(p50),
        probe_effect_verdict(p99)
    )?;
    let cpu = &m.gateway_cpu_us_per_request;
    let (cpu_u, cpu_t) = (f(cpu.untraced.median), f(cpu.traced.median));
    let bpf_ns = f(v
        .cost
        .accuracy_run
        .as_ref()
        .and_then(|c| c.bpf_run_time_ns()));
    let bpf_us = bpf_ns / v.accuracy.tracer.requests as f64 / 1000.0;
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
        f(m.cpu0_busy.untraced.median),
        f(m.cpu0_busy.traced.median)
    )?;
    let max_ratio = f(v.max_rate.ratio_traced_untraced);
    let cpu_ratio = cpu_t / cpu_u;
    writeln!(
        md,
        "- Targets: CPU per request ×{cpu_ratio:.3} ({} {}); max throughput ×{max_ratio:.2} \
         ({} {}).",
        meets(CPU_PER_REQUEST_RATIO, cpu_ratio),
        CPU_PER_REQUEST_RATIO.describe(2),
        meets(MAX_RATE_RATIO, max_ratio),
        MAX_RATE_RATIO.describe(2),
    )?;
    floor(md, v)?;
    for r in &v.loss {
        writeln!(
            md,
            "- Loss, {}: asked {} req/s, achieved {}, {} events/s; {} events lost, {} \
             requests incomplete, {} complete requests across a loss span.",
            r.name,
            num(Some(r.rate), 0),
            achieved(r),
            num(r.events_per_s, 0),
            r.lost_events,
            r.incomplete,
            int(r.complete_crossing_loss)
        )?;
    }
    let k = &v.soak;
    writeln!(
        md,
        "- Soak: tracer peak RSS {:.1} MiB over {} s (target < {:.0} MiB).\n",
        f(k.tracer_peak_rss_kib.map(|kib| kib as f64)) / 1024.0,
        num(Some(k.seconds), 0),
        TRACER_PEAK_RSS_MIB.limit()
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

    /// A committed run, to vary one figure of.
    fn recorded() -> Validation {
        let path = crate::workspace::root().join("profiles/validation-2026-12-02-verdict");
        crate::workspace::read_json(&path.join(VALIDATION_JSON)).unwrap()
    }

    #[test]
    fn a_renamed_key_fails_naming_it_instead_of_rendering_a_dash() {
        let dir = tempfile::tempdir().unwrap();
        let path = crate::workspace::root().join("profiles/validation-2026-12-02-verdict");
        let text = std::fs::read_to_string(path.join(VALIDATION_JSON)).unwrap();
        let renamed = text.replacen("\"untraced_ok\"", "\"untraced_200\"", 1);
        std::fs::write(dir.path().join(VALIDATION_JSON), renamed).unwrap();
        let err = format!("{:#}", render_dir(dir.path()).unwrap_err());
        assert!(err.contains("untraced_200"), "{err}");
        assert!(!dir.path().join("README.md").exists());
    }

    #[test]
    fn an_unmeasured_kind_is_said_not_printed_as_a_figure() {
        let mut v = recorded();
        let cal = v.calibration.as_mut().unwrap();
        cal.ns_per_hit.insert("sock".into(), None);
        cal.ns_per_hit_min_max
            .insert("sock".into(), [Some(-290.0), Some(1841.0)]);
        cal.probe_ns_per_request_by_kind.insert("sock".into(), None);
        cal.unmeasured = Some(vec!["sock".into()]);
        let md = render(&v);
        assert!(md.contains("| sock | unmeasured | -290–1841 | — |"), "{md}");
        assert!(
            md.contains("Unmeasured, left out of the sum: sock."),
            "{md}"
        );
    }

    #[test]
    fn probe_effect_verdicts_follow_the_targets() {
        let mut v = recorded();
        let m = &mut v.ab.comparison.metrics;
        m.p50_us.ratio_of_medians = Some(1.02);
        m.p99_us.ratio_of_medians = Some(1.10);
        let md = render(&v);
        assert!(
            md.contains(
                "p50 ×1.02 (meets the 1.03 stretch target), p99 ×1.10 (meets the 1.10 target)"
            ),
            "{md}"
        );
        v.ab.comparison.metrics.p99_us.ratio_of_medians = None;
        let md = render(&v);
        assert!(md.contains("p99 ×NaN (misses the 1.10 target)"), "{md}");
    }

    #[test]
    fn paired_max_searches_and_the_hooks_only_floor() {
        let v = recorded();
        let md = render(&v);
        let searches = v.max_rate.searches.as_ref().unwrap();
        assert!(
            md.contains(&format!(
                "untraced then traced in {} rounds: untraced {:.0}, {:.0} req/s",
                searches.len(),
                searches[0].untraced,
                searches[1].untraced
            )),
            "{md}"
        );
        let empty = mode(&v, "hooks only").unwrap();
        assert!(
            md.contains(&format!(
                "(`--empty-programs`), the gateway pays ×{:.3} CPU per request (+{:.1} µs)",
                f(empty.cpu_ratio),
                added_cpu(empty)
            )),
            "{md}"
        );
    }

    #[test]
    fn loss_runs_at_the_traced_max_beside_the_same_load_untraced() {
        let mut v = recorded();
        let run = &mut v.loss[0];
        run.rate = 10000.0;
        run.of_traced_max = Some(1.0);
        run.loadgen.achieved_rate = Some(6000.0);
        run.untraced = Some(session::validation::Untraced {
            achieved_rate: Some(6500.0),
            p99_us: None,
        });
        let name = run.name.clone();
        let md = render(&v);
        assert!(
            md.contains(&format!(
                "- Loss, {name}: asked 10000 req/s, achieved 6000 req/s, 60% of the traced \
                 max (the same open loop untraced: 6500 req/s, 65% of the traced max),"
            )),
            "{md}"
        );
        assert!(
            md.contains(&format!("| {name} | 10000 | 6000 (6500) |")),
            "{md}"
        );
        v.loss[0].untraced = None;
        let md = render(&v);
        assert!(md.contains(&format!("| {name} | 10000 | 6000 |")), "{md}");
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
            let v: Validation = crate::workspace::read_json(&dir.join(VALIDATION_JSON))
                .unwrap_or_else(|err| panic!("{err:#}"));
            let md = render(&v);
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
