//! Probe effect as an A/B: windows of one open-loop load, alternately traced and untraced.
//! Windows run in pairs whose order flips each time (U T, T U, U T, ...), so a linear drift of
//! the machine falls on both arms alike. Each pair gives one traced/untraced ratio; the spread
//! of those ratios across pairs says how much of a ratio is noise.

use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

    pub fn parse(text: &str) -> Option<Arm> {
        match text {
            "traced" => Some(Arm::Traced),
            "untraced" => Some(Arm::Untraced),
            _ => None,
        }
    }
}

/// The arm of window `i` (0-based) in the flipping-pairs order.
pub fn arm_of(i: usize) -> Arm {
    let flipped = (i / 2) % 2 == 1;
    match (i.is_multiple_of(2), flipped) {
        (true, false) | (false, true) => Arm::Untraced,
        _ => Arm::Traced,
    }
}

/// The figures of one window, as measured by the client and /proc.
#[derive(Clone, Copy, Debug, PartialEq)]
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

/// Median, min and max of a set of values.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Spread {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }

    fn to_json(self) -> Value {
        let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
        json!({ "median": num(self.median), "min": num(self.min), "max": num(self.max) })
    }
}

/// What is compared between the arms.
pub const METRICS: [&str; 5] = [
    "p50_us",
    "p99_us",
    "p999_us",
    "gateway_cpu_us_per_request",
    "cpu0_busy",
];

fn metric(w: &Window, i: usize) -> f64 {
    [
        w.p50_us,
        w.p99_us,
        w.p999_us,
        w.gateway_cpu_us_per_request,
        w.cpu0_busy,
    ][i]
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    pub traced_windows: usize,
    pub untraced_windows: usize,
    /// Per metric (in [`METRICS`] order): each arm's spread across its windows.
    pub traced: Vec<Spread>,
    pub untraced: Vec<Spread>,
    /// Per metric: median(traced) / median(untraced).
    pub ratio_of_medians: Vec<f64>,
    /// Per metric: the spread of traced/untraced over the pairs.
    pub paired_ratio: Vec<Spread>,
    pub pairs: usize,
}

/// Compares the arms. Pairs are the k-th traced with the k-th untraced window, which in the
/// flipping-pairs order are neighbours.
pub fn compare(windows: &[Window]) -> Comparison {
    let traced: Vec<&Window> = windows.iter().filter(|w| w.arm == Arm::Traced).collect();
    let untraced: Vec<&Window> = windows.iter().filter(|w| w.arm == Arm::Untraced).collect();
    let spread =
        |arm: &[&Window], i| Spread::of(&arm.iter().map(|w| metric(w, i)).collect::<Vec<_>>());
    let mut c = Comparison {
        traced_windows: traced.len(),
        untraced_windows: untraced.len(),
        pairs: traced.len().min(untraced.len()),
        ..Comparison::default()
    };
    for i in 0..METRICS.len() {
        let (t, u) = (spread(&traced, i), spread(&untraced, i));
        c.ratio_of_medians.push(t.median / u.median);
        let ratios: Vec<f64> = traced
            .iter()
            .zip(&untraced)
            .map(|(t, u)| metric(t, i) / metric(u, i))
            .collect();
        c.paired_ratio.push(Spread::of(&ratios));
        c.traced.push(t);
        c.untraced.push(u);
    }
    c
}

impl Comparison {
    pub fn to_json(&self) -> Value {
        let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
        let mut metrics = serde_json::Map::new();
        for (i, name) in METRICS.iter().enumerate() {
            metrics.insert(
                (*name).to_owned(),
                json!({
                    "traced": self.traced[i].to_json(),
                    "untraced": self.untraced[i].to_json(),
                    "ratio_of_medians": num(self.ratio_of_medians[i]),
                    "paired_ratio": self.paired_ratio[i].to_json(),
                }),
            );
        }
        json!({
            "traced_windows": self.traced_windows,
            "untraced_windows": self.untraced_windows,
            "pairs": self.pairs,
            "metrics": metrics,
        })
    }
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
        assert_eq!(
            c.untraced[0],
            Spread {
                median: 100.0,
                min: 90.0,
                max: 110.0
            }
        );
        assert!((c.ratio_of_medians[0] - 1.03).abs() < 1e-12);
        let p = c.paired_ratio[0];
        assert!((p.median - 1.03).abs() < 1e-12, "{p:?}");
        assert!((p.min - 111.0 / 110.0).abs() < 1e-12 && (p.max - 1.1).abs() < 1e-12);
        assert_eq!(c.ratio_of_medians[4], 1.0);
        let v = c.to_json();
        assert_eq!(v["metrics"]["p99_us"]["untraced"]["median"], 1000.0);
    }

    #[test]
    fn an_empty_arm_gives_nulls_not_a_panic() {
        let c = compare(&[window(Arm::Traced, 1.0, 2.0)]);
        assert_eq!(c.pairs, 0);
        assert!(c.ratio_of_medians[0].is_nan());
        assert_eq!(
            c.to_json()["metrics"]["p50_us"]["ratio_of_medians"],
            Value::Null
        );
    }
}
