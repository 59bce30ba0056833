//! Failed authentication, counted per client address: past `max_failures` within `window`,
//! each further failure from that client is answered 429 (with `Retry-After`) instead of
//! 401, and audited as rate-limited, until the window ends.
//!
//! A valid credential is never refused because of failures: it is checked like any other,
//! and served. One client guessing (or a fuzzer probing unauthenticated) behind the same
//! address as everyone else — a proxy, a NAT, `allot dev`'s loopback — must not lock out
//! the others, and a blocked client gains nothing from it: API tokens carry 256 random
//! bits, so there is no guessing them, and what the limit buys is that a probe is loud (the
//! refusals are audited) and its answers carry no detail. Successful requests are not
//! counted; the clock is injected.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_domain::Clock;
use chrono::{DateTime, Utc};

/// Sources tracked before stale ones are swept.
const SWEEP_ABOVE: usize = 10_000;

pub struct FailureLimiter {
    max_failures: u32,
    window: Duration,
    clock: Arc<dyn Clock>,
    /// Source → (start of its window, failures in it).
    failures: Mutex<HashMap<String, (DateTime<Utc>, u32)>>,
}

impl FailureLimiter {
    pub fn new(max_failures: u32, window: Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            max_failures,
            window,
            clock,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn window_end(&self, start: DateTime<Utc>) -> DateTime<Utc> {
        start + chrono::Duration::from_std(self.window).unwrap_or(chrono::Duration::MAX)
    }

    /// Counts a failed attempt from `source`: `Some(seconds to wait)` when it is past the
    /// limit (answer it 429), `None` while within it (answer the failure itself).
    pub fn failed(&self, source: &str) -> Option<u64> {
        let now = self.clock.now();
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() > SWEEP_ABOVE {
            failures.retain(|_, (start, _)| now < self.window_end(*start));
        }
        let entry = failures.entry(source.to_owned()).or_insert((now, 0));
        if now >= self.window_end(entry.0) {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        let end = self.window_end(entry.0);
        (entry.1 > self.max_failures)
            .then(|| u64::try_from((end - now).num_seconds()).unwrap_or(0).max(1))
    }
}

#[cfg(test)]
mod tests {
    use allot_domain::FixedClock;

    use super::*;

    #[test]
    fn failures_past_the_limit_are_refused_until_the_window_ends() {
        let clock = Arc::new(FixedClock::new(Utc::now()));
        let limiter = FailureLimiter::new(3, Duration::from_secs(60), clock.clone());
        for _ in 0..3 {
            assert_eq!(limiter.failed("10.0.0.1"), None);
        }
        assert_eq!(limiter.failed("10.0.0.1"), Some(60));
        assert_eq!(
            limiter.failed("10.0.0.2"),
            None,
            "other sources are not affected"
        );
        clock.advance(chrono::Duration::seconds(45));
        assert_eq!(limiter.failed("10.0.0.1"), Some(15));
        clock.advance(chrono::Duration::seconds(15));
        assert_eq!(
            limiter.failed("10.0.0.1"),
            None,
            "the window has passed: a new one counts from one"
        );
    }
}
