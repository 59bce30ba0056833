//! How often one node may call, whoever holds its key: each node's calls of each kind
//! through a token bucket of their own (a burst, then a steady rate well above what an
//! agent sends), so that a stolen node key flooding heartbeats, reports, log appends,
//! renewals or stream subscriptions is answered `RESOURCE_EXHAUSTED` instead of costing the
//! leader a database write each; and when each refusal was last audited, so that a flood
//! leaves a trace without flooding the audit log.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The node calls that are limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeCall {
    Heartbeat,
    ReportJobStatus,
    AppendJobLogs,
    RenewCertificate,
    WatchAssignments,
}

impl NodeCall {
    pub fn name(self) -> &'static str {
        match self {
            NodeCall::Heartbeat => "Heartbeat",
            NodeCall::ReportJobStatus => "ReportJobStatus",
            NodeCall::AppendJobLogs => "AppendJobLogs",
            NodeCall::RenewCertificate => "RenewCertificate",
            NodeCall::WatchAssignments => "WatchAssignments",
        }
    }

    /// The burst and the calls per second after it. An agent beats every few seconds (at
    /// most ten times a second, and at once after a job ends; tests poll faster), reports each job's start and end, ships logs every half
    /// second, renews its certificate twice a lifetime, and opens its stream once per
    /// leader or broken connection (several times in a failover, as its calls move).
    fn rate(self) -> (f64, f64) {
        match self {
            NodeCall::Heartbeat => (100.0, 50.0),
            NodeCall::ReportJobStatus => (1_000.0, 200.0),
            NodeCall::AppendJobLogs => (200.0, 50.0),
            NodeCall::RenewCertificate => (5.0, 1.0 / 60.0),
            NodeCall::WatchAssignments => (10.0, 0.5),
        }
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Each node's buckets, and when each refusal kind was last audited.
#[derive(Debug, Default)]
pub struct NodeLimits {
    buckets: Mutex<HashMap<(String, NodeCall), Bucket>>,
    noted: Mutex<HashMap<(String, &'static str), Instant>>,
}

/// A refusal of one kind is audited at most this often per node.
pub const NOTE_EVERY: Duration = Duration::from_secs(10);

impl NodeLimits {
    /// Takes one `call` of `node` at `now`; past its rate, how long until the next one
    /// would be taken.
    pub fn take(&self, node: &str, call: NodeCall, now: Instant) -> Result<(), Duration> {
        let (burst, per_sec) = call.rate();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = buckets.entry((node.to_owned(), call)).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * per_sec).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / per_sec))
        }
    }

    /// Whether a refusal of kind `what` for `node` is to be audited at `now` (at most once
    /// per [`NOTE_EVERY`]).
    pub fn note(&self, node: &str, what: &'static str, now: Instant) -> bool {
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        match noted.get(&(node.to_owned(), what)) {
            Some(at) if now.saturating_duration_since(*at) < NOTE_EVERY => false,
            _ => {
                noted.insert((node.to_owned(), what), now);
                true
            }
        }
    }

    /// Forgets `node` (revoked or replaced: what it did counts for nothing now).
    pub fn forget(&self, node: &str) {
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, _), _| n != node);
        self.noted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, _), _| n != node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_gets_its_burst_then_its_rate_and_other_nodes_theirs() {
        let limits = NodeLimits::default();
        let t0 = Instant::now();
        for _ in 0..100 {
            assert!(limits.take("a", NodeCall::Heartbeat, t0).is_ok());
        }
        let wait = limits
            .take("a", NodeCall::Heartbeat, t0)
            .expect_err("past the burst");
        assert!(wait <= Duration::from_millis(20), "{wait:?}");
        assert!(limits.take("b", NodeCall::Heartbeat, t0).is_ok(), "b's own");
        assert!(
            limits.take("a", NodeCall::ReportJobStatus, t0).is_ok(),
            "another call's own"
        );
        // A fiftieth of a second later, one more.
        let t1 = t0 + Duration::from_millis(20);
        assert!(limits.take("a", NodeCall::Heartbeat, t1).is_ok());
        assert!(limits.take("a", NodeCall::Heartbeat, t1).is_err());
        // 124 subscriptions in 25 s: the burst and one every 2 s.
        let taken = (0..124)
            .filter(|i| {
                let at = t0 + Duration::from_millis(25_000 * i / 124);
                limits.take("a", NodeCall::WatchAssignments, at).is_ok()
            })
            .count();
        assert!((20..=24).contains(&taken), "{taken} of 124 taken");
        limits.forget("a");
        assert!(limits.take("a", NodeCall::Heartbeat, t1).is_ok());
    }

    #[test]
    fn a_refusal_is_noted_once_per_window() {
        let limits = NodeLimits::default();
        let t0 = Instant::now();
        assert!(limits.note("a", "node.rate_limited", t0));
        assert!(!limits.note("a", "node.rate_limited", t0 + Duration::from_secs(9)));
        assert!(limits.note("b", "node.rate_limited", t0));
        assert!(limits.note("a", "node.rate_limited", t0 + NOTE_EVERY));
    }
}
