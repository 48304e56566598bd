//! The session's own probe effect (probe-effect.json, `session::effect`): windows of the
//! session's open loop with and without the session's tracer, and what the README says of
//! them. The verdicts are the model's (`ProbeEffect::over_budget`, against
//! `session::targets::PROBE_EFFECT_RATIO`); this only words them.

use askama::Template as _;
use session::effect::{MetricComparison, ProbeEffect, Ratio, Spread};

/// Formatting the templates share.
trait Words {
    /// `×1.03 (0.97–1.10)`, or "unmeasured".
    fn spread(&self, s: &Spread) -> String {
        match (s.median, s.min, s.max) {
            (Some(m), Some(lo), Some(hi)) => format!("×{m:.2} ({lo:.2}–{hi:.2})"),
            _ => "unmeasured".to_owned(),
        }
    }

    /// `x` to `digits` decimals, "–" when missing.
    fn opt(&self, x: &Option<f64>, digits: usize) -> String {
        x.map_or("–".to_owned(), |x| format!("{x:.digits$}"))
    }
}

/// The WARNING the README opens with when the effect is over budget.
#[derive(askama::Template)]
#[template(path = "profile/effect_warning.md", escape = "none")]
struct Warning {
    budget: f64,
    /// What the traced figures describe: "the gateway", "nginx".
    the: &'static str,
    /// The ratios that do not meet it, with their figure (none: unmeasured).
    over: Vec<(&'static str, Option<f64>)>,
}

impl Warning {
    /// A ratio over the budget, to 2 decimals, or to as many more (up to 4) as it takes not
    /// to read as the budget itself (×1.1003 against ×1.10).
    fn over_figure(&self, x: &f64) -> String {
        (2..=4)
            .map(|digits| (format!("{x:.digits$}"), format!("{:.digits$}", self.budget)))
            .find(|(figure, budget)| figure != budget)
            .map_or_else(|| format!("{x:.4}"), |(figure, _)| figure)
    }
}

/// The one-paragraph **Probe effect** line at the top of the README.
#[derive(askama::Template)]
#[template(path = "profile/effect_line.md", escape = "none")]
struct Line<'a> {
    e: &'a ProbeEffect,
    c: &'a session::effect::Comparison,
    ratios: [Ratio<'a>; 4],
}

impl Words for Line<'_> {}

/// The ratios per metric, then the windows one by one, for the README's probe-effect
/// section.
#[derive(askama::Template)]
#[template(path = "profile/effect_table.md", escape = "none")]
struct Table<'a> {
    e: &'a ProbeEffect,
    metrics: Vec<(&'static str, &'a MetricComparison)>,
}

impl Words for Table<'_> {}

pub fn warning(effect: &ProbeEffect) -> Option<String> {
    let over = effect.over_budget();
    (!over.is_empty()).then(|| {
        Warning {
            budget: ProbeEffect::BUDGET.limit(),
            the: effect.target.the(),
            over,
        }
        .render()
        .expect("the warning template renders")
    })
}

pub fn line(effect: &ProbeEffect) -> String {
    Line {
        e: effect,
        c: &effect.comparison,
        ratios: effect.ratios(),
    }
    .render()
    .expect("the probe-effect line renders")
}

pub fn table(effect: &ProbeEffect) -> String {
    let metrics = (effect.ratios().iter())
        .map(|r| (r.name, r.metric))
        .chain([("CPU 0 busy share", &effect.comparison.metrics.cpu0_busy)])
        .collect();
    Table { e: effect, metrics }
        .render()
        .expect("the probe-effect table renders")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn an_over_budget_ratio_never_reads_as_the_budget() {
        let w = Warning {
            budget: 1.10,
            the: "the gateway",
            over: vec![],
        };
        assert_eq!(w.over_figure(&1.12), "1.12");
        assert_eq!(w.over_figure(&1.103), "1.103");
        assert_eq!(w.over_figure(&1.100314), "1.1003");
    }
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
        assert_eq!(warning(&e), None);
        let line = line(&e);
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
        let table = table(&e);
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
        let warning = warning(&e).expect("a CPU ratio of 1.30 is over budget");
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
