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
//! counted. The counts are the database's (`AuthFailureRepo`), so every replica of the
//! control plane counts a client's failures together, by the store's injected clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use allot_store::{AuthFailureRepo, Store};

/// Every this many new windows, ended ones are swept from the database.
const SWEEP_EVERY: u64 = 256;

pub struct FailureLimiter {
    max_failures: u32,
    window: Duration,
    store: Store,
    new_windows: AtomicU64,
}

impl FailureLimiter {
    pub fn new(max_failures: u32, window: Duration, store: Store) -> Self {
        Self {
            max_failures,
            window,
            store,
            new_windows: AtomicU64::new(0),
        }
    }

    /// Counts a failed attempt from `source`: `Some(seconds to wait)` when it is past the
    /// limit (answer it 429), `None` while within it (answer the failure itself). A count
    /// the database cannot take is logged and answered as within the limit: the attempt
    /// fails either way.
    pub async fn failed(&self, source: &str) -> Option<u64> {
        let (start, failures) = match self.store.count_auth_failure(source, self.window).await {
            Ok(counted) => counted,
            Err(e) => {
                tracing::warn!(error = %e, "could not count a failed authentication");
                return None;
            }
        };
        if failures == 1
            && self.new_windows.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1
            && let Err(e) = self.store.sweep_auth_failures(self.window).await
        {
            tracing::warn!(error = %e, "could not sweep ended authentication-failure windows");
        }
        let end = start + chrono::Duration::from_std(self.window).unwrap_or(chrono::Duration::MAX);
        let now = self.store.clock().now();
        (failures > self.max_failures)
            .then(|| u64::try_from((end - now).num_seconds()).unwrap_or(0).max(1))
    }
}
