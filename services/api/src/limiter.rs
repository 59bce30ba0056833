//! Failed authentication, counted per source address: past `max_failures` within `window`,
//! every authentication attempt from that source is refused (429) until the window ends, so
//! guessing tokens or replaying forged ones gets nowhere fast. Successful requests are not
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

    /// `Some(seconds to wait)` when `source` has failed too often lately.
    pub fn blocked(&self, source: &str) -> Option<u64> {
        let now = self.clock.now();
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let &(start, count) = failures.get(source)?;
        let end = self.window_end(start);
        (count >= self.max_failures && now < end)
            .then(|| u64::try_from((end - now).num_seconds()).unwrap_or(0).max(1))
    }

    /// Counts a failed attempt from `source`.
    pub fn failed(&self, source: &str) {
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
    }
}

#[cfg(test)]
mod tests {
    use allot_domain::FixedClock;

    use super::*;

    #[test]
    fn a_source_is_refused_after_too_many_failures_until_the_window_ends() {
        let clock = Arc::new(FixedClock::new(Utc::now()));
        let limiter = FailureLimiter::new(3, Duration::from_secs(60), clock.clone());
        for _ in 0..3 {
            assert_eq!(limiter.blocked("10.0.0.1"), None);
            limiter.failed("10.0.0.1");
        }
        assert_eq!(limiter.blocked("10.0.0.1"), Some(60));
        assert_eq!(
            limiter.blocked("10.0.0.2"),
            None,
            "other sources are not affected"
        );
        clock.advance(chrono::Duration::seconds(45));
        assert_eq!(limiter.blocked("10.0.0.1"), Some(15));
        clock.advance(chrono::Duration::seconds(15));
        assert_eq!(limiter.blocked("10.0.0.1"), None, "the window has passed");
        limiter.failed("10.0.0.1");
        assert_eq!(
            limiter.blocked("10.0.0.1"),
            None,
            "a new window counts from one"
        );
    }
}
