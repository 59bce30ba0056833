//! Heartbeat pacing: how often agents heartbeat and how long the lease each heartbeat grants,
//! stretched as the fleet grows ([`allot_domain::node::paced`]) so that the leader answers
//! at most `max_per_sec` heartbeats a second whatever the fleet's size. The leader counts
//! the ready nodes now and then; every registration and heartbeat answer carries the
//! interval and lease in force, and agents adopt them from the next beat.
//!
//! A lease granted is always the configured lease stretched as much as the interval, so a
//! node told to beat less often is given as much longer to do it: it misses as many beats
//! before it is judged silent (half its lease) or lost (all of it).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use allot_store::{NodeRepo, Store};
use tokio_util::sync::CancellationToken;

/// How often the leader counts the ready nodes.
const COUNT_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Pacing {
    interval: Duration,
    lease: Duration,
    max_per_sec: f64,
    ready: AtomicUsize,
}

impl Pacing {
    /// `interval` and `lease` as configured, for a fleet under `max_per_sec` heartbeats a
    /// second (0: never stretched).
    pub fn new(interval: Duration, lease: Duration, max_per_sec: f64) -> Self {
        Self {
            interval,
            lease,
            max_per_sec,
            ready: AtomicUsize::new(0),
        }
    }

    /// The heartbeat interval and the lease to hand out now.
    pub fn current(&self) -> (Duration, Duration) {
        allot_domain::node::paced(
            self.ready.load(Ordering::Relaxed),
            self.interval,
            self.lease,
            self.max_per_sec,
        )
    }

    /// Counts the ready nodes now. A failed count keeps the last. A leader counts before
    /// it answers its first heartbeat, so the pace it hands out is the fleet's from the
    /// start of its term (not a count it remembers, or none).
    pub async fn recount(&self, store: &Store) {
        match store.count_ready_nodes(store.clock().now()).await {
            Ok(n) => self
                .ready
                .store(usize::try_from(n).unwrap_or(usize::MAX), Ordering::Relaxed),
            Err(e) => tracing::warn!(error = %e, "ready nodes not counted"),
        }
    }

    /// Counts the ready nodes every few seconds until `stop` (a term of leadership ends).
    pub async fn count(self: Arc<Self>, store: Store, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(COUNT_EVERY) => {}
            }
            self.recount(&store).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_the_configured_pace_until_the_fleet_outgrows_the_rate() {
        let s = Duration::from_secs;
        let pacing = Pacing::new(s(3), s(15), 500.0);
        assert_eq!(pacing.current(), (s(3), s(15)));
        pacing.ready.store(5_000, Ordering::Relaxed);
        assert_eq!(pacing.current(), (s(10), s(50)));
    }
}
