//! The lease as the agent counts it, and the fence: every job is killed before the lease
//! can lapse unrenewed, so a requeued attempt never overlaps the one it replaces.

use super::*;

/// The lease as this agent knows it, on its own monotonic clock: it runs from the moment a
/// registration or heartbeat that the control plane accepted was *sent*, so it never
/// outlasts the control plane's view of it (which starts when the call arrived).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Lease {
    pub(crate) valid_until: Option<Instant>,
    pub(crate) duration: Duration,
    /// How often to heartbeat, as the control plane last said (it paces a large fleet).
    pub(crate) interval: Duration,
}

impl Lease {
    /// How often to heartbeat: the interval last said, at least 100 ms (also before
    /// anything was said).
    pub(crate) fn every(&self) -> Duration {
        self.interval.max(Duration::from_millis(100))
    }

    /// A call sent at `sent` was accepted: the lease runs `duration` from then (as that
    /// answer set it), and beats come every `interval` from now on. Zeros (a control plane
    /// that did not say) keep what was said before.
    pub(crate) fn granted(&mut self, sent: Instant, duration: Duration, interval: Duration) {
        if !duration.is_zero() {
            self.duration = duration;
        }
        if !interval.is_zero() {
            self.interval = interval;
        }
        self.valid_until = Some(sent + self.duration);
    }

    /// When jobs must be gone: a fifth of the lease before it lapses, so that killing them
    /// and a late clock tick still finish before the control plane may requeue them.
    pub(crate) fn fence_at(&self) -> Option<Instant> {
        self.valid_until.map(|u| u - self.duration / 5)
    }
}

impl Agent {
    pub(crate) fn lock_lease(&self) -> std::sync::MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kills every job once the lease is about to lapse without renewal: from then on the
    /// control plane may requeue them elsewhere, and a job must never run twice.
    pub(crate) async fn fence(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let (fence_at, check) = {
                let lease = *self.lock_lease();
                let check = (lease.duration / 10)
                    .clamp(Duration::from_millis(20), Duration::from_millis(250));
                (lease.fence_at(), check)
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(check) => {}
            }
            if fence_at.is_none_or(|at| Instant::now() < at) {
                continue;
            }
            let jobs = self.lock_jobs();
            for (id, job) in &jobs.running {
                tracing::warn!(job = %id, attempt = job.attempt, "lease about to lapse without renewal: killing the job");
                job.signal.stop(StopReason::LeaseLost);
            }
        }
    }
}
