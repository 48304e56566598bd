//! Token buckets, one per (API key, service), with the service's rate and burst.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Default)]
pub struct Limiter(Mutex<HashMap<(i64, i64), Bucket>>);

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Limiter {
    /// Takes one token from the bucket of `(key, service)`; false when it is empty.
    pub fn allow(&self, key: (i64, i64), rate_per_s: f64, burst: f64, now: Instant) -> bool {
        let mut buckets = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: burst,
            refilled: now,
        });
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate_per_s).min(burst);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_refill() {
        let limiter = Limiter::default();
        let t0 = Instant::now();
        assert!(limiter.allow((1, 1), 2.0, 2.0, t0));
        assert!(limiter.allow((1, 1), 2.0, 2.0, t0));
        assert!(!limiter.allow((1, 1), 2.0, 2.0, t0));
        // Another key has its own bucket.
        assert!(limiter.allow((2, 1), 2.0, 2.0, t0));
        // Half a second at 2/s refills one token.
        assert!(limiter.allow((1, 1), 2.0, 2.0, t0 + Duration::from_millis(500)));
        assert!(!limiter.allow((1, 1), 2.0, 2.0, t0 + Duration::from_millis(500)));
    }
}
