//! Value parsers shared by the commands' flags, so every command rejects the same bad input
//! with the same words.

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
