//! Value parsers shared by the commands' flags, so every command rejects the same bad input
//! with the same words.

use std::path::PathBuf;

/// Where the gateway and its load run: the same flags for every command that starts them.
#[derive(clap::Args, Clone, Debug)]
pub struct Placement {
    /// CPUs for the gateway (a `taskset -c` list).
    #[arg(long, default_value = "0")]
    pub gateway_cpus: String,
    /// CPUs for loadgen, mock-upstream and the tracer.
    #[arg(long, default_value = "1")]
    pub load_cpus: String,
    /// The gateway's tokio worker threads (all on the gateway's CPUs).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub workers: u64,
}

/// Where a command writes its run: the same two flags for every command that records one.
#[derive(clap::Args, Clone, Debug)]
pub struct Output {
    /// Output directory (default a new one under profiles/local/, named as the command's
    /// description says).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write into an `--out` directory that already holds files (a recorded run).
    #[arg(long)]
    pub overwrite: bool,
}

impl Output {
    /// Creates the run's directory; `name` starts the default's name.
    pub fn prepare(&self, name: &str) -> anyhow::Result<PathBuf> {
        crate::session_dir::prepare(self.out.as_deref(), name, self.overwrite)
    }
}

/// The first CPU of a `taskset -c` list ("0", "0-1", "0,2").
pub fn first_cpu(list: &str) -> usize {
    list.split([',', '-'])
        .next()
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0)
}

/// Seconds in (0, 3600].
pub fn seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 3600.0 => Ok(s),
        _ => Err(format!("expected seconds in (0, 3600], got {text}")),
    }
}

/// A parser of fractions in (0, `max`].
pub fn fraction(max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |text| match text.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= max => Ok(x),
        _ => Err(format!("expected a fraction in (0, {max}], got {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_accepts_the_range_only() {
        assert_eq!(seconds("2.5"), Ok(2.5));
        assert_eq!(seconds("3600"), Ok(3600.0));
        for bad in ["0", "-1", "3601", "nan", "inf", "ten", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fraction_accepts_up_to_its_bound() {
        assert_eq!(fraction(1.0)("0.25"), Ok(0.25));
        assert_eq!(fraction(1.5)("1.5"), Ok(1.5));
        for bad in ["0", "-0.1", "1.01", "x", "NaN", "inf", ""] {
            assert!(fraction(1.0)(bad).is_err(), "{bad}");
        }
        assert_eq!(
            fraction(1.0)("2"),
            Err("expected a fraction in (0, 1], got 2".to_owned())
        );
    }
}
