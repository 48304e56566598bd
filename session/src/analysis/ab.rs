//! Probe effect as an A/B: windows of one open-loop load, alternately traced and untraced.
//! Windows run in pairs whose order flips each time (U T, T U, U T, ...), so a linear drift of
//! the machine falls on both arms alike. Each pair gives one traced/untraced ratio; the spread
//! of those ratios across pairs says how much of a ratio is noise.

use serde::{Deserialize, Serialize};

use crate::stats::median;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    Traced,
    Untraced,
}

impl Arm {
    pub fn name(self) -> &'static str {
        match self {
            Arm::Traced => "traced",
            Arm::Untraced => "untraced",
        }
    }
}

/// The arm of window `i` (0-based) in the flipping-pairs order U T T U U T T U ….
pub fn arm_of(i: usize) -> Arm {
    if i % 4 == 1 || i % 4 == 2 {
        Arm::Traced
    } else {
        Arm::Untraced
    }
}

/// The figures of one window that the arms are compared on, as measured by the client and
/// /proc. Read from a window record, whose other keys are left to its own type.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct Window {
    pub arm: Arm,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// The gateway's utime + stime over the window, per 2xx response, µs.
    pub gateway_cpu_us_per_request: f64,
    /// Share of CPU 0 (the gateway's) not idle over the window, 0..=1.
    pub cpu0_busy: f64,
}

/// What is compared between the arms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    P50,
    P99,
    P999,
    GatewayCpuPerRequest,
    Cpu0Busy,
}

impl Metric {
    pub const ALL: [Metric; 5] = [
        Metric::P50,
        Metric::P99,
        Metric::P999,
        Metric::GatewayCpuPerRequest,
        Metric::Cpu0Busy,
    ];

    fn of(self, w: &Window) -> f64 {
        match self {
            Metric::P50 => w.p50_us,
            Metric::P99 => w.p99_us,
            Metric::P999 => w.p999_us,
            Metric::GatewayCpuPerRequest => w.gateway_cpu_us_per_request,
            Metric::Cpu0Busy => w.cpu0_busy,
        }
    }
}

/// Median, min and max of a set of values; `None` where there was no finite value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let finite = values.iter().copied().filter(|x| x.is_finite());
        Spread {
            median: median(values),
            min: finite.clone().reduce(f64::min),
            max: finite.reduce(f64::max),
        }
    }
}

/// One metric across the arms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricComparison {
    /// Each arm's spread across its windows.
    pub traced: Spread,
    pub untraced: Spread,
    /// median(traced) / median(untraced).
    pub ratio_of_medians: Option<f64>,
    /// The spread of traced/untraced over the pairs.
    pub paired_ratio: Spread,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    pub p50_us: MetricComparison,
    pub p99_us: MetricComparison,
    pub p999_us: MetricComparison,
    pub gateway_cpu_us_per_request: MetricComparison,
    pub cpu0_busy: MetricComparison,
}

impl Metrics {
    pub fn get(&self, metric: Metric) -> &MetricComparison {
        match metric {
            Metric::P50 => &self.p50_us,
            Metric::P99 => &self.p99_us,
            Metric::P999 => &self.p999_us,
            Metric::GatewayCpuPerRequest => &self.gateway_cpu_us_per_request,
            Metric::Cpu0Busy => &self.cpu0_busy,
        }
    }

    fn get_mut(&mut self, metric: Metric) -> &mut MetricComparison {
        match metric {
            Metric::P50 => &mut self.p50_us,
            Metric::P99 => &mut self.p99_us,
            Metric::P999 => &mut self.p999_us,
            Metric::GatewayCpuPerRequest => &mut self.gateway_cpu_us_per_request,
            Metric::Cpu0Busy => &mut self.cpu0_busy,
        }
    }
}

/// The A/B's result, as validation.json (`ab.comparison`) and probe-effect.json hold it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    pub traced_windows: usize,
    pub untraced_windows: usize,
    pub pairs: usize,
    pub metrics: Metrics,
}

/// A ratio, or `None` when either side is missing or it is not finite.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?).filter(|r| r.is_finite())
}

/// Compares the arms. Pairs are the k-th traced with the k-th untraced window, which in the
/// flipping-pairs order are neighbours.
pub fn compare(windows: &[Window]) -> Comparison {
    let traced: Vec<&Window> = windows.iter().filter(|w| w.arm == Arm::Traced).collect();
    let untraced: Vec<&Window> = windows.iter().filter(|w| w.arm == Arm::Untraced).collect();
    let spread =
        |arm: &[&Window], m: Metric| Spread::of(&arm.iter().map(|w| m.of(w)).collect::<Vec<_>>());
    let mut c = Comparison {
        traced_windows: traced.len(),
        untraced_windows: untraced.len(),
        pairs: traced.len().min(untraced.len()),
        metrics: Metrics::default(),
    };
    for m in Metric::ALL {
        let (t, u) = (spread(&traced, m), spread(&untraced, m));
        let ratios: Vec<f64> = traced
            .iter()
            .zip(&untraced)
            .map(|(t, u)| m.of(t) / m.of(u))
            .collect();
        *c.metrics.get_mut(m) = MetricComparison {
            traced: t,
            untraced: u,
            ratio_of_medians: ratio(t.median, u.median),
            paired_ratio: Spread::of(&ratios),
        };
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(arm: Arm, p50: f64, p99: f64) -> Window {
        Window {
            arm,
            p50_us: p50,
            p99_us: p99,
            p999_us: p99 * 2.0,
            gateway_cpu_us_per_request: p50 / 10.0,
            cpu0_busy: 0.25,
        }
    }

    #[test]
    fn pairs_flip_order() {
        let arms: Vec<Arm> = (0..8).map(arm_of).collect();
        use Arm::{Traced as T, Untraced as U};
        assert_eq!(arms, vec![U, T, T, U, U, T, T, U]);
    }

    #[test]
    fn ratios_and_spread() {
        // Untraced p50 100, 110, 90; traced 103, 111, 99 → paired ratios 1.03, 1.009.., 1.1.
        let windows: Vec<Window> = [100.0, 110.0, 90.0]
            .into_iter()
            .zip([103.0, 111.0, 99.0])
            .flat_map(|(u, t)| {
                [
                    window(Arm::Untraced, u, 10.0 * u),
                    window(Arm::Traced, t, 10.0 * t),
                ]
            })
            .collect();
        let c = compare(&windows);
        assert_eq!((c.traced_windows, c.untraced_windows, c.pairs), (3, 3, 3));
        let p50 = c.metrics.get(Metric::P50);
        assert_eq!(
            p50.untraced,
            Spread {
                median: Some(100.0),
                min: Some(90.0),
                max: Some(110.0)
            }
        );
        assert!((p50.ratio_of_medians.unwrap() - 1.03).abs() < 1e-12);
        let p = p50.paired_ratio;
        assert!((p.median.unwrap() - 1.03).abs() < 1e-12, "{p:?}");
        assert!((p.min.unwrap() - 111.0 / 110.0).abs() < 1e-12);
        assert!((p.max.unwrap() - 1.1).abs() < 1e-12);
        assert_eq!(c.metrics.cpu0_busy.ratio_of_medians, Some(1.0));
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(v["metrics"]["p99_us"]["untraced"]["median"], 1000.0);
    }

    #[test]
    fn an_empty_arm_gives_nulls_not_a_panic() {
        let c = compare(&[window(Arm::Traced, 1.0, 2.0)]);
        assert_eq!(c.pairs, 0);
        assert_eq!(c.metrics.p50_us.ratio_of_medians, None);
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(
            v["metrics"]["p50_us"]["ratio_of_medians"],
            serde_json::Value::Null
        );
        assert_eq!(serde_json::from_value::<Comparison>(v).unwrap(), c);
    }

    #[test]
    fn a_window_record_is_read_by_its_compared_figures() {
        let w: Window = serde_json::from_str(
            r#"{"index": 1, "arm": "traced", "p50_us": 1, "p99_us": 2, "p999_us": 3,
                "gateway_cpu_us_per_request": 4, "cpu0_busy": 0.5, "ok": 9}"#,
        )
        .unwrap();
        assert_eq!(w.arm, Arm::Traced);
        let bad = r#"{"arm": "both", "p50_us": 1}"#;
        assert!(serde_json::from_str::<Window>(bad).is_err());
    }
}
