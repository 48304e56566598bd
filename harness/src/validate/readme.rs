//! README.md of a validation run, written only from validation.json's typed figures by the
//! template `harness/templates/validation-readme.md`.
//!
//! Everything computed (verdicts, ratios, sentences that depend on a figure) is computed here;
//! the template only lays out. Verdicts come from `session::targets`: nothing compares a
//! figure with a literal.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use askama::Template;
use session::analysis::ab::Spread;
use session::analysis::accuracy::Accuracy;
use session::breakdown::{self, Calibration};
use session::targets::{
    Bound, CPU_PER_REQUEST_RATIO, MAX_RATE_RATIO, NEGATIVE_GAPS, PROBE_EFFECT_RATIO,
    PROBE_EFFECT_STRETCH, TRACER_CPU_CORES, TRACER_PEAK_RSS_MIB,
};
use session::validation::{LossRun, Mode, VALIDATION_JSON, Validation};

/// A figure the README prints: "—" when missing or not finite.
trait Figure {
    fn figure(&self) -> Option<f64>;
}

impl Figure for f64 {
    fn figure(&self) -> Option<f64> {
        Some(*self).filter(|x| x.is_finite())
    }
}

impl Figure for Option<f64> {
    fn figure(&self) -> Option<f64> {
        self.filter(|x| x.is_finite())
    }
}

impl<T: Figure> Figure for &T {
    fn figure(&self) -> Option<f64> {
        (*self).figure()
    }
}

/// A figure with `digits` decimals; "—" when missing or not finite.
fn fixed(x: impl Figure, digits: usize) -> String {
    x.figure()
        .map_or_else(|| "—".to_owned(), |x| format!("{x:.digits$}"))
}

/// A count; "—" when missing.
fn count(n: Option<u64>) -> String {
    n.map_or_else(|| "—".to_owned(), |n| n.to_string())
}

/// A figure for arithmetic: NaN when missing, so a sentence shows it did not measure.
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
fn spread(s: &Spread, digits: usize) -> String {
    format!(
        "{} ({}–{})",
        fixed(s.median, digits),
        fixed(s.min, digits),
        fixed(s.max, digits)
    )
}

/// "meets" or "misses" (an unmeasured figure misses).
fn meets(bound: Bound, value: f64) -> &'static str {
    if bound.verdict(Some(value)).met() {
        "meets"
    } else {
        "misses"
    }
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

/// Reads DIR/validation.json and writes DIR/README.md from it.
pub fn render_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let v: Validation = crate::workspace::read_json(&dir.join(VALIDATION_JSON))?;
    let path = dir.join("README.md");
    std::fs::write(&path, render(&v)).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

pub fn render(v: &Validation) -> String {
    Readme {
        v,
        r: Reading::of(v),
    }
    .render()
    .expect("the template only formats")
}

/// The figures the README's sentences are computed from.
struct Reading {
    p50: f64,
    p99: f64,
    p50_verdict: String,
    p99_verdict: String,
    cpu_untraced: f64,
    cpu_traced: f64,
    cpu_added: f64,
    bpf_us: f64,
    split: String,
    cpu0_untraced: f64,
    cpu0_traced: f64,
    cpu_ratio: f64,
    cpu_verdict: &'static str,
    cpu_target: String,
    max_ratio: f64,
    max_verdict: &'static str,
    max_target: String,
    floor: Option<Floor>,
    soak_peak_mib: f64,
    rss_target_mib: f64,
    negative_gaps_target: f64,
    probe_effect_target: String,
    probe_effect_stretch: f64,
    tracer_cores_target: String,
}

/// What the floor rows say: the cost of the kernel events alone bounds any design that keeps
/// them, whatever it does with the uprobes.
struct Floor {
    tracepoints_ratio: f64,
    tracepoints_added: f64,
    tracepoints_max_ratio: f64,
    sites_ratio: f64,
    sites_added: f64,
    empty: Option<EmptyPrograms>,
}

struct EmptyPrograms {
    ratio: f64,
    added: f64,
    lean_added: f64,
}

/// A mode row whose name starts with `name`.
fn mode<'a>(v: &'a Validation, name: &str) -> Option<&'a Mode> {
    v.modes.iter().flatten().find(|m| m.mode.starts_with(name))
}

/// What the gateway's CPU per request gained in a mode row, µs.
fn added_cpu(m: &Mode) -> f64 {
    f(m.gateway_cpu_us_per_request.traced) - f(m.gateway_cpu_us_per_request.untraced)
}

impl Floor {
    fn of(v: &Validation) -> Option<Floor> {
        let (tracepoints, sites) = (mode(v, "tracepoints only")?, mode(v, "sites only")?);
        Some(Floor {
            tracepoints_ratio: f(tracepoints.cpu_ratio),
            tracepoints_added: added_cpu(tracepoints),
            tracepoints_max_ratio: f(v.max_rate.ratio_tracepoints_only_untraced),
            sites_ratio: f(sites.cpu_ratio),
            sites_added: added_cpu(sites),
            empty: mode(v, "hooks only").map(|empty| EmptyPrograms {
                ratio: f(empty.cpu_ratio),
                added: added_cpu(empty),
                lean_added: mode(v, "lean").map_or(f64::NAN, added_cpu),
            }),
        })
    }
}

impl Reading {
    fn of(v: &Validation) -> Reading {
        let m = &v.ab.comparison.metrics;
        let (p50, p99) = (f(m.p50_us.ratio_of_medians), f(m.p99_us.ratio_of_medians));
        let cpu = &m.gateway_cpu_us_per_request;
        let (cpu_untraced, cpu_traced) = (f(cpu.untraced.median), f(cpu.traced.median));
        let bpf_ns = f(v
            .cost
            .accuracy_run
            .as_ref()
            .and_then(breakdown::Cost::bpf_run_time_ns));
        let bpf_us = bpf_ns / v.accuracy.tracer.requests as f64 / 1000.0;
        let cpu_added = cpu_traced - cpu_untraced;
        let split = if bpf_us < cpu_added {
            format!(
                "the remaining {:.1} µs is entry cost BPF stats do not see (uprobe trap, \
                 tracepoint dispatch) and cache effects",
                cpu_added - bpf_us
            )
        } else {
            "BPF time exceeds the gateway's added CPU because part of it is not charged to the \
             gateway (programs on the other CPU, data-ready in the client's context, other \
             tasks' switches)"
                .to_owned()
        };
        let max_ratio = f(v.max_rate.ratio_traced_untraced);
        let cpu_ratio = cpu_traced / cpu_untraced;
        Reading {
            p50,
            p99,
            p50_verdict: probe_effect_verdict(p50),
            p99_verdict: probe_effect_verdict(p99),
            cpu_untraced,
            cpu_traced,
            cpu_added,
            bpf_us,
            split,
            cpu0_untraced: f(m.cpu0_busy.untraced.median),
            cpu0_traced: f(m.cpu0_busy.traced.median),
            cpu_ratio,
            cpu_verdict: meets(CPU_PER_REQUEST_RATIO, cpu_ratio),
            cpu_target: CPU_PER_REQUEST_RATIO.describe(2),
            max_ratio,
            max_verdict: meets(MAX_RATE_RATIO, max_ratio),
            max_target: MAX_RATE_RATIO.describe(2),
            floor: Floor::of(v),
            soak_peak_mib: f(v.soak.tracer_peak_rss_kib.map(|kib| kib as f64)) / 1024.0,
            rss_target_mib: TRACER_PEAK_RSS_MIB.limit(),
            negative_gaps_target: NEGATIVE_GAPS.limit(),
            probe_effect_target: PROBE_EFFECT_RATIO.describe(2),
            probe_effect_stretch: PROBE_EFFECT_STRETCH.limit(),
            tracer_cores_target: TRACER_CPU_CORES.describe(2),
        }
    }
}

#[derive(Template)]
#[template(path = "validation-readme.md")]
struct Readme<'a> {
    v: &'a Validation,
    r: Reading,
}

struct MetricRow {
    label: &'static str,
    untraced: String,
    traced: String,
    ratio: String,
    paired: String,
}

struct CalibrationRow<'a> {
    kind: &'a str,
    per_hit: String,
    min: String,
    max: String,
    per_request: String,
}

struct HitsRow {
    sites: String,
    syscalls: String,
    sock: String,
    sched: String,
    samples: String,
}

struct DistRow {
    name: &'static str,
    source: &'static str,
    count: String,
    p50: String,
    p99: String,
    max: String,
}

/// What the template calls; arguments come by reference.
impl Readme<'_> {
    fn num<X: Figure + Copy>(&self, x: &X, digits: usize) -> String {
        fixed(*x, digits)
    }

    fn int(&self, n: &Option<u64>) -> String {
        count(*n)
    }

    /// ns as µs, one decimal.
    fn us(&self, ns: &Option<f64>) -> String {
        fixed(ns.map(|ns| ns / 1e3), 1)
    }

    fn uncommitted(&self) -> String {
        let list: Vec<String> = self
            .v
            .machine
            .uncommitted
            .iter()
            .map(|p| format!("`{p}`"))
            .collect();
        list.join(", ")
    }

    fn pins(&self) -> String {
        let pins: Vec<String> = self
            .v
            .pinning
            .iter()
            .map(|p| format!("{} on CPU {}", p.process, p.applied))
            .collect();
        pins.join("; ")
    }

    fn incomplete_reasons(&self) -> String {
        let reasons = &self.v.accuracy.tracer.incomplete_reasons;
        let list: Vec<String> = reasons.iter().map(|(r, n)| format!("{r}: {n}")).collect();
        list.join("; ")
    }

    fn metrics(&self) -> Vec<MetricRow> {
        let m = &self.v.ab.comparison.metrics;
        [
            (&m.p50_us, "p50 µs", 0),
            (&m.p99_us, "p99 µs", 0),
            (&m.p999_us, "p99.9 µs", 0),
            (&m.gateway_cpu_us_per_request, "gateway CPU µs / request", 1),
            (&m.cpu0_busy, "CPU 0 busy share", 3),
        ]
        .into_iter()
        .map(|(x, label, digits)| MetricRow {
            label,
            untraced: spread(&x.untraced, digits),
            traced: spread(&x.traced, digits),
            ratio: fixed(x.ratio_of_medians, 3),
            paired: spread(&x.paired_ratio, 3),
        })
        .collect()
    }

    /// The paired searches' untraced (0), traced (1) or ratio (2) figures, listed.
    fn searches(&self, which: usize) -> String {
        let searches = self.v.max_rate.searches.iter().flatten();
        let list: Vec<String> = searches
            .map(|s| match which {
                0 => fixed(s.untraced, 0),
                1 => fixed(s.traced, 0),
                _ => fixed(s.ratio, 3),
            })
            .collect();
        list.join(", ")
    }

    fn calibration_rows<'c>(&self, cal: &'c Calibration) -> Vec<CalibrationRow<'c>> {
        cal.ns_per_hit
            .iter()
            .map(|(kind, ns)| {
                let [min, max] = cal
                    .ns_per_hit_min_max
                    .get(kind)
                    .copied()
                    .unwrap_or_default();
                CalibrationRow {
                    kind,
                    // null: unmeasured (older runs: a figure at or below zero).
                    per_hit: match ns {
                        Some(x) if *x > 0.0 => fixed(*x, 0),
                        _ => "unmeasured".to_owned(),
                    },
                    min: fixed(min, 0),
                    max: fixed(max, 0),
                    per_request: fixed(cal.per_request(kind), 0),
                }
            })
            .collect()
    }

    fn probe_us(&self, cal: &Calibration) -> String {
        fixed(Some(cal.probe_ns_per_request / 1000.0), 1)
    }

    fn kinds_notes(&self, cal: &Calibration) -> String {
        kinds_note("Noisy (rounds disagree)", Some(&cal.noisy))
            + &kinds_note("Unmeasured, left out of the sum", cal.unmeasured.as_deref())
    }

    fn programs<'c>(&self, cost: &'c breakdown::Cost) -> &'c [breakdown::BpfProgram] {
        cost.bpf.as_ref().map_or(&[], |b| &b.programs)
    }

    fn bpf_cpu_share(&self, cost: &breakdown::Cost) -> String {
        fixed(cost.bpf.as_ref().and_then(|b| b.cpu_share), 4)
    }

    fn mode(&self) -> &str {
        self.v.cost.mode.as_deref().unwrap_or("unknown")
    }

    /// The kernel-side drop counters as breakdown.json writes them (null: not reported).
    fn drops(&self) -> String {
        serde_json::to_string(&self.v.cost.drops).expect("counters serialize")
    }

    fn modes(&self) -> Option<&Vec<Mode>> {
        self.v.modes.as_ref().filter(|m| !m.is_empty())
    }

    fn hits(&self, m: &Mode) -> HitsRow {
        let h = m.hits_per_request.unwrap_or_default();
        HitsRow {
            sites: fixed(h.sites, 1),
            syscalls: fixed(h.syscalls, 1),
            sock: fixed(h.sock, 1),
            sched: fixed(h.sched, 1),
            samples: fixed(h.samples, 2),
        }
    }

    fn ring(&self, run: &LossRun) -> String {
        run.ring_mib
            .map_or_else(|| "default".to_owned(), |n| n.to_string())
    }

    fn crossing(&self, run: &LossRun) -> String {
        run.complete_crossing_loss
            .map_or_else(|| "not reported".to_owned(), |n| n.to_string())
    }

    fn soak_peak_mib(&self) -> String {
        fixed(
            self.v
                .soak
                .tracer_peak_rss_kib
                .map(|kib| kib as f64 / 1024.0),
            1,
        )
    }

    /// A loss run's achieved rate, and the same open loop's untraced, in brackets.
    fn achieved_short(&self, run: &LossRun) -> String {
        let traced = fixed(run.loadgen.achieved_rate, 0);
        match run.untraced.and_then(|u| u.achieved_rate) {
            Some(untraced) => format!("{traced} ({})", fixed(untraced, 0)),
            None => traced,
        }
    }

    /// A loss run's achieved rate as a share of the traced max, beside the untraced open
    /// loop's.
    fn achieved(&self, run: &LossRun) -> String {
        let traced = run.loadgen.achieved_rate;
        let untraced = run.untraced.and_then(|u| u.achieved_rate);
        let traced_max = run.rate / f(run.of_traced_max);
        if untraced.is_none() || !traced_max.is_finite() {
            return format!("{} req/s", fixed(traced, 0));
        }
        let share = |rate: Option<f64>| {
            format!(
                "{} req/s, {:.0}% of the traced max",
                fixed(rate, 0),
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
    fn never_seen(&self, join: &Accuracy) -> String {
        let listed: u64 = join.client_only_incomplete.values().sum();
        join.untraced_ok.saturating_sub(listed).to_string()
    }

    fn crosscheck_rows(&self) -> Vec<DistRow> {
        let mut rows = Vec::new();
        for (name, pair) in self.v.crosscheck.comparison.named() {
            let mine = &pair.independent;
            rows.push(DistRow {
                name,
                source: "independent",
                count: mine.count.to_string(),
                p50: fixed(mine.p50_us, 1),
                p99: fixed(mine.p99_us, 1),
                max: fixed(mine.max_us, 1),
            });
            let model = pair.model;
            rows.push(DistRow {
                name,
                source: "model",
                count: count(model.map(|d| d.count)),
                p50: fixed(model.map(|d| d.p50_us), 1),
                p99: fixed(model.map(|d| d.p99_us), 1),
                max: fixed(model.map(|d| d.max_us), 1),
            });
        }
        rows
    }
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
