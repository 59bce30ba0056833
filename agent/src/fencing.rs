//! The lease as the agent counts it, and the fence: every job is killed before the control
//! plane may declare the node lost (the outage tolerance after the last accepted
//! heartbeat), so a requeued attempt never overlaps the one it replaces. While the lease
//! alone has lapsed, jobs run on: the control plane may only be unreachable for a while.

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
    /// How long the control plane waits, unanswered, before it declares this node lost
    /// (at least the lease; zero until said: the lease).
    pub(crate) tolerance: Duration,
    /// When the last accepted call was sent.
    pub(crate) sent: Option<Instant>,
}

impl Lease {
    /// How often to heartbeat: the interval last said, at least 100 ms (also before
    /// anything was said).
    pub(crate) fn every(&self) -> Duration {
        self.interval.max(Duration::from_millis(100))
    }

    /// A call sent at `sent` was accepted: the lease runs `duration` from then (as that
    /// answer set it), beats come every `interval` from now on, and the node is lost after
    /// `tolerance` unheard. Zeros (a control plane that did not say) keep what was said
    /// before.
    pub(crate) fn granted(
        &mut self,
        sent: Instant,
        duration: Duration,
        interval: Duration,
        tolerance: Duration,
    ) {
        if !duration.is_zero() {
            self.duration = duration;
        }
        if !interval.is_zero() {
            self.interval = interval;
        }
        if !tolerance.is_zero() {
            self.tolerance = tolerance;
        }
        self.sent = Some(sent);
        self.valid_until = Some(sent + self.duration);
    }

    /// When jobs must be gone: a fifth of the outage tolerance (at least the lease) before
    /// it runs out, so that killing them and a late clock tick still finish before the
    /// control plane may requeue them.
    pub(crate) fn fence_at(&self) -> Option<Instant> {
        let t = self.tolerance.max(self.duration);
        self.sent.map(|sent| sent + t - t / 5)
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
                tracing::warn!(job = %id, attempt = job.attempt, "no replica reached for most of the outage tolerance: killing the job before the control plane may run it elsewhere");
                job.signal.stop(StopReason::LeaseLost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_fenced_at_four_fifths_of_the_outage_tolerance_not_of_the_lease() {
        let sent = Instant::now();
        let mut lease = Lease::default();
        assert_eq!(lease.fence_at(), None, "nothing granted yet");
        // An older control plane says no tolerance: the lease's.
        lease.granted(
            sent,
            Duration::from_secs(15),
            Duration::from_secs(3),
            Duration::ZERO,
        );
        assert_eq!(lease.fence_at(), Some(sent + Duration::from_secs(12)));
        // Five minutes' tolerance: jobs run on through a four-minute outage.
        lease.granted(
            sent,
            Duration::from_secs(15),
            Duration::from_secs(3),
            Duration::from_secs(300),
        );
        assert_eq!(lease.fence_at(), Some(sent + Duration::from_secs(240)));
        assert_eq!(lease.valid_until, Some(sent + Duration::from_secs(15)));
        // Said once, kept when a later answer says nothing.
        let later = sent + Duration::from_secs(3);
        lease.granted(later, Duration::ZERO, Duration::ZERO, Duration::ZERO);
        assert_eq!(lease.fence_at(), Some(later + Duration::from_secs(240)));
    }
}
