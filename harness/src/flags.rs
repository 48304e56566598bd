//! Value parsers shared by the commands' flags, so every command rejects the same bad input
//! with the same words.

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
}
