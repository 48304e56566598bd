//! The project's targets, defined once, and the verdict of a measured figure against one.
//!
//! Renderers print a [`Verdict`]; they never compare against a literal themselves.

use serde::{Deserialize, Serialize};

/// A bound on a measured figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// Met when the figure is at most this.
    AtMost(f64),
    /// Met when the figure is at least this.
    AtLeast(f64),
}

impl Bound {
    pub fn limit(self) -> f64 {
        match self {
            Bound::AtMost(x) | Bound::AtLeast(x) => x,
        }
    }

    /// The verdict on `value`; a missing or non-finite figure is `Unmeasured`, never a pass.
    pub fn verdict(self, value: Option<f64>) -> Verdict {
        match value {
            Some(v) if v.is_finite() => {
                let met = match self {
                    Bound::AtMost(limit) => v <= limit,
                    Bound::AtLeast(limit) => v >= limit,
                };
                if met { Verdict::Meets } else { Verdict::Misses }
            }
            _ => Verdict::Unmeasured,
        }
    }

    /// "≤ 1.10" or "≥ 0.90".
    pub fn describe(self, decimals: usize) -> String {
        match self {
            Bound::AtMost(x) => format!("≤ {x:.decimals$}"),
            Bound::AtLeast(x) => format!("≥ {x:.decimals$}"),
        }
    }
}

/// Whether a figure met its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Meets,
    Misses,
    Unmeasured,
}

impl Verdict {
    /// "meets", "misses" or "unmeasured", as the READMEs write it.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Meets => "meets",
            Verdict::Misses => "misses",
            Verdict::Unmeasured => "unmeasured",
        }
    }

    pub fn met(self) -> bool {
        self == Verdict::Meets
    }
}

/// The mission's gate: the gateway adds less than 1 ms at p99 (bench), in µs.
pub const GATE_P99_ADDED_US: Bound = Bound::AtMost(1_000.0);

/// A traced session's own effect: traced/untraced ratio of client p50, p99, p99.9 and the
/// gateway's CPU per request (profile's probe-effect windows, validate's A/B).
pub const PROBE_EFFECT_RATIO: Bound = Bound::AtMost(1.10);

/// The stretch target of the same ratios.
pub const PROBE_EFFECT_STRETCH: Bound = Bound::AtMost(1.03);

/// validate: traced/untraced gateway CPU per request.
pub const CPU_PER_REQUEST_RATIO: Bound = Bound::AtMost(1.05);

/// validate: traced/untraced max throughput.
pub const MAX_RATE_RATIO: Bound = Bound::AtLeast(0.90);

/// The tracer process's own CPU over a session, in cores.
pub const TRACER_CPU_CORES: Bound = Bound::AtMost(0.10);

/// The tracer's peak RSS over the soak, MiB (the READMEs say "< 256 MiB").
pub const TRACER_PEAK_RSS_MIB: Bound = Bound::AtMost(256.0);

/// validate: requests whose client latency is below the tracer's total (must be none).
pub const NEGATIVE_GAPS: Bound = Bound::AtMost(0.0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_include_their_limit_and_a_missing_figure_never_passes() {
        assert_eq!(PROBE_EFFECT_RATIO.verdict(Some(1.10)), Verdict::Meets);
        assert_eq!(PROBE_EFFECT_RATIO.verdict(Some(1.1001)), Verdict::Misses);
        assert_eq!(MAX_RATE_RATIO.verdict(Some(0.90)), Verdict::Meets);
        assert_eq!(MAX_RATE_RATIO.verdict(Some(0.89)), Verdict::Misses);
        assert_eq!(MAX_RATE_RATIO.verdict(None), Verdict::Unmeasured);
        assert_eq!(MAX_RATE_RATIO.verdict(Some(f64::NAN)), Verdict::Unmeasured);
        assert_eq!(GATE_P99_ADDED_US.describe(0), "≤ 1000");
    }
}
