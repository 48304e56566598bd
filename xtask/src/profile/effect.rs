//! The session's own probe effect (probe-effect.json): windows of the session's open loop with
//! and without the session's tracer, and what the README says of them.

use std::fmt::Write as _;

use serde::Deserialize;

/// A traced/untraced ratio above this (p50, p99, p99.9, or the gateway's CPU per request) puts
/// a WARNING at the top of the session's README.
pub const BUDGET: f64 = 1.10;

/// probe-effect.json.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeEffect {
    /// The `tracer record` flags of the windows and of the session alike.
    pub tracer_flags: Vec<String>,
    pub windows_per_arm: u64,
    pub window_s: f64,
    pub comparison: Comparison,
    pub windows: Vec<Window>,
}

/// The A/B comparison (`session::analysis::ab`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    pub traced_windows: usize,
    pub untraced_windows: usize,
    pub pairs: usize,
    pub metrics: Metrics,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    pub p50_us: Metric,
    pub p99_us: Metric,
    pub p999_us: Metric,
    pub gateway_cpu_us_per_request: Metric,
    pub cpu0_busy: Metric,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    pub traced: Spread,
    pub untraced: Spread,
    pub ratio_of_medians: Option<f64>,
    /// traced/untraced of neighbouring windows, over the pairs.
    pub paired_ratio: Spread,
}

/// Median, min and max; null where an arm had no finite value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// One window, as `ab::windows` writes it.
#[derive(Debug, Deserialize)]
pub struct Window {
    pub index: usize,
    pub arm: Arm,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub ok: u64,
    pub achieved_rate: f64,
    pub gateway_cpu_us_per_request: Option<f64>,
    pub tracer_cpu_cores: Option<f64>,
    pub tracer_lost_events: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    Traced,
    Untraced,
}

/// One budgeted ratio, by name.
pub struct Ratio<'a> {
    pub name: &'static str,
    pub metric: &'a Metric,
}

impl ProbeEffect {
    /// The ratios the budget applies to, in the order the README gives them.
    pub fn ratios(&self) -> [Ratio<'_>; 4] {
        let m = &self.comparison.metrics;
        [
            Ratio {
                name: "client p50",
                metric: &m.p50_us,
            },
            Ratio {
                name: "client p99",
                metric: &m.p99_us,
            },
            Ratio {
                name: "client p99.9",
                metric: &m.p999_us,
            },
            Ratio {
                name: "gateway CPU per request",
                metric: &m.gateway_cpu_us_per_request,
            },
        ]
    }

    /// The ratios whose median over the pairs exceeds [`BUDGET`], or that could not be
    /// measured (an arm without a finite figure counts as over: nothing says it is within).
    pub fn over_budget(&self) -> Vec<(&'static str, Option<f64>)> {
        self.ratios()
            .iter()
            .map(|r| (r.name, r.metric.paired_ratio.median))
            .filter(|(_, ratio)| ratio.is_none_or(|x| x > BUDGET))
            .collect()
    }

    /// Median over the traced windows of the tracer process's CPU, in cores.
    pub fn tracer_cores(&self) -> Option<f64> {
        let cores = crate::ab::median(self.traced().filter_map(|w| w.tracer_cpu_cores).collect());
        cores.is_finite().then_some(cores)
    }

    /// Events lost in the traced windows, summed.
    pub fn lost_events(&self) -> u64 {
        self.traced().filter_map(|w| w.tracer_lost_events).sum()
    }

    fn traced(&self) -> impl Iterator<Item = &Window> {
        self.windows.iter().filter(|w| w.arm == Arm::Traced)
    }

    /// The WARNING the README opens with when the effect is over budget.
    pub fn warning(&self) -> Option<String> {
        let over = self.over_budget();
        (!over.is_empty()).then(|| {
            let list: Vec<String> = over
                .iter()
                .map(|(name, ratio)| match ratio {
                    Some(x) => format!("{name} ×{x:.2}"),
                    None => format!("{name} (not measured)"),
                })
                .collect();
            format!(
                "**WARNING: this session's tracer exceeds the ×{BUDGET:.2} probe-effect budget**: \
                 {}. The traced figures below describe the gateway with the tracer's cost in \
                 them; the Reading compares the traced tail with the untraced client tail first.",
                list.join(", ")
            )
        })
    }

    /// The one-paragraph **Probe effect** line at the top of the README.
    pub fn line(&self) -> String {
        let c = &self.comparison;
        let ratios: Vec<String> = self
            .ratios()
            .iter()
            .map(|r| format!("{} {}", r.name, spread(&r.metric.paired_ratio)))
            .collect();
        format!(
            "**Probe effect** (traced/untraced, median of {} window pairs (min–max); {} traced \
             and {} untraced windows of {} s of the session's own open loop, in flipping \
             pairs, the tracer attached with the session's flags `{}` in the traced ones only; \
             probe-effect.json): {}; tracer process {} of a core (median of the traced \
             windows); {} events lost in the traced windows.",
            c.pairs,
            c.traced_windows,
            c.untraced_windows,
            self.window_s,
            self.tracer_flags.join(" "),
            ratios.join(", "),
            self.tracer_cores()
                .map_or("unmeasured".to_owned(), |x| format!("{x:.3}")),
            self.lost_events(),
        )
    }

    /// The ratios per metric, then the windows one by one, for the README's probe-effect
    /// section.
    pub fn table(&self) -> String {
        let mut md = String::new();
        let opt2 = |x: Option<f64>| x.map_or("–".to_owned(), |x| format!("{x:.3}"));
        let _ = writeln!(
            md,
            "{} windows per arm. Values: median over an arm's windows; the paired ratio is traced/untraced of neighbouring windows, median (min–max).\n",
            self.windows_per_arm
        );
        let _ = writeln!(
            md,
            "| metric | untraced | traced | ratio of medians | paired ratio |\n|---|---|---|---|---|"
        );
        let m = &self.comparison.metrics;
        for (name, metric) in self
            .ratios()
            .iter()
            .map(|r| (r.name, r.metric))
            .chain([("CPU 0 busy share", &m.cpu0_busy)])
        {
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} | {} |",
                opt2(metric.untraced.median),
                opt2(metric.traced.median),
                opt2(metric.ratio_of_medians),
                spread(&metric.paired_ratio),
            );
        }
        md.push('\n');
        let _ = writeln!(
            md,
            "| window | arm | p50 µs | p99 µs | p99.9 µs | 2xx | req/s | gateway CPU µs/req | tracer cores | events lost |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        let opt =
            |x: Option<f64>, digits: usize| x.map_or("–".to_owned(), |x| format!("{x:.digits$}"));
        for w in &self.windows {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.0} | {} | {} | {} |",
                w.index,
                match w.arm {
                    Arm::Traced => "traced",
                    Arm::Untraced => "untraced",
                },
                w.p50_us,
                w.p99_us,
                w.p999_us,
                w.ok,
                w.achieved_rate,
                opt(w.gateway_cpu_us_per_request, 1),
                opt(w.tracer_cpu_cores, 3),
                w.tracer_lost_events
                    .map_or("–".to_owned(), |n| n.to_string()),
            );
        }
        md
    }
}

/// `×1.03 (0.97–1.10)`.
fn spread(s: &Spread) -> String {
    match (s.median, s.min, s.max) {
        (Some(m), Some(lo), Some(hi)) => format!("×{m:.2} ({lo:.2}–{hi:.2})"),
        _ => "unmeasured".to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// probe-effect.json for windows U T T U …, each traced window `ratio` × its untraced
    /// neighbour in every figure.
    pub(crate) fn effect_json(pairs: usize, ratio: f64, cpu_ratio: f64) -> serde_json::Value {
        let windows: Vec<serde_json::Value> = (0..2 * pairs)
            .map(|i| {
                let traced = i % 4 == 1 || i % 4 == 2;
                let (r, c) = if traced {
                    (ratio, cpu_ratio)
                } else {
                    (1.0, 1.0)
                };
                json!({
                    "index": i, "arm": if traced { "traced" } else { "untraced" },
                    "p50_us": 500.0 * r, "p99_us": 2000.0 * r, "p999_us": 5000.0 * r,
                    "max_us": 9000.0, "ok": 30000, "errors": {}, "achieved_rate": 5000.0,
                    "gateway_cpu_s": 4.0 * c, "gateway_cpu_us_per_request": 130.0 * c,
                    "gateway_cpu_share": 0.6, "cpu0_busy": 0.7,
                    "tracer_cpu_cores": traced.then_some(0.08),
                    "tracer_lost_events": traced.then_some(0),
                    "tracer_requests": traced.then_some(30000),
                    "tracer_hits_per_request": null,
                })
            })
            .collect();
        let metric = |u: f64, r: f64| {
            json!({
                "traced": {"median": u * r, "min": u * r, "max": u * r},
                "untraced": {"median": u, "min": u, "max": u},
                "ratio_of_medians": r,
                "paired_ratio": {"median": r, "min": r, "max": r},
            })
        };
        json!({
            "tracer_flags": ["--sample-hz", "999", "--wait-for"],
            "windows_per_arm": pairs,
            "window_s": 6.0,
            "comparison": {
                "traced_windows": pairs, "untraced_windows": pairs, "pairs": pairs,
                "metrics": {
                    "p50_us": metric(500.0, ratio),
                    "p99_us": metric(2000.0, ratio),
                    "p999_us": metric(5000.0, ratio),
                    "gateway_cpu_us_per_request": metric(130.0, cpu_ratio),
                    "cpu0_busy": metric(0.7, 1.0),
                },
            },
            "windows": windows,
        })
    }

    fn effect(pairs: usize, ratio: f64, cpu_ratio: f64) -> ProbeEffect {
        serde_json::from_value(effect_json(pairs, ratio, cpu_ratio)).unwrap()
    }

    #[test]
    fn within_budget_has_no_warning_and_states_each_ratio() {
        let e = effect(8, 1.04, 1.09);
        assert_eq!(e.warning(), None);
        let line = e.line();
        for part in [
            "client p50 ×1.04 (1.04–1.04)",
            "client p99 ×1.04",
            "client p99.9 ×1.04",
            "gateway CPU per request ×1.09",
            "median of 8 window pairs",
            "`--sample-hz 999 --wait-for`",
            "tracer process 0.080 of a core",
            "0 events lost",
        ] {
            assert!(line.contains(part), "{part} not in {line}");
        }
        let table = e.table();
        assert!(
            table.contains(
                "| gateway CPU per request | 130.000 | 141.700 | 1.090 | ×1.09 (1.09–1.09) |"
            ),
            "{table}"
        );
        assert_eq!(
            table
                .lines()
                .filter(|l| l.starts_with("| ") && l[2..].starts_with(|c: char| c.is_ascii_digit()))
                .count(),
            16
        );
    }

    #[test]
    fn over_budget_names_what_exceeds_it() {
        let e = effect(8, 1.02, 1.30);
        let warning = e.warning().expect("a CPU ratio of 1.30 is over budget");
        assert!(warning.starts_with("**WARNING"), "{warning}");
        assert!(
            warning.contains("gateway CPU per request ×1.30"),
            "{warning}"
        );
        assert!(!warning.contains("client p50"), "{warning}");
    }

    #[test]
    fn an_unmeasured_ratio_is_not_within_budget() {
        let mut v = effect_json(8, 1.0, 1.0);
        v["comparison"]["metrics"]["p99_us"]["paired_ratio"]["median"] = json!(null);
        let e: ProbeEffect = serde_json::from_value(v).unwrap();
        assert_eq!(e.over_budget(), vec![("client p99", None)]);
    }

    #[test]
    fn a_renamed_key_is_an_error_not_a_dash() {
        let mut v = effect_json(8, 1.0, 1.0);
        let metrics = v["comparison"]["metrics"].as_object_mut().unwrap();
        let p99 = metrics.remove("p99_us").unwrap();
        metrics.insert("p99".to_owned(), p99);
        assert!(serde_json::from_value::<ProbeEffect>(v).is_err());
    }
}
