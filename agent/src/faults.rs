//! GPU faults: XIDs acted on by class (fail, requeue, drain, degrade).

use super::*;

impl Agent {
    pub(crate) fn mig_uuids(&self, index: u32) -> Vec<String> {
        self.backend
            .mig()
            .and_then(|m| m.mig_instances(index).ok().flatten())
            .unwrap_or_default()
            .into_iter()
            .map(|i| i.uuid)
            .collect()
    }

    /// Acts on the GPU events the backend reports (XIDs), by class (see
    /// `allot_domain::xid`): the jobs on a GPU with an application fault fail; those on a GPU
    /// with a contained memory error or one that needs a drain are stopped and requeued
    /// elsewhere, and a GPU that needs a drain is reported unhealthy from then on. After an
    /// informational XID the GPU is reported degraded: its jobs run on, it takes no new work.
    pub(crate) async fn watch_gpus(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            for event in self.backend.take_events() {
                let GpuEvent::Xid { index, code } = event;
                let Some(uuid) = self
                    .backend
                    .inventory()
                    .ok()
                    .and_then(|inv| inv.into_iter().find(|g| g.index == index))
                    .map(|g| g.uuid)
                else {
                    tracing::warn!(index, code, "XID on a GPU the backend does not list");
                    continue;
                };
                // Jobs on the GPU's MIG instances share its fate.
                let mut affected = self.mig_uuids(index);
                affected.push(uuid.clone());
                let what = format!("{} on GPU {uuid}", allot_domain::xid::describe(code));
                let class = allot_domain::classify_xid(code);
                self.metrics.xid(&uuid, code, metrics::xid_class(class));
                let reason = match class {
                    XidClass::Informational => {
                        // Its jobs run on; it takes no new work. Tell the control plane now.
                        tracing::warn!(%what, "GPU degraded");
                        if self.lock_degraded().insert(uuid.clone()) {
                            let every = self.lock_lease().every();
                            self.heartbeat(every).await;
                        }
                        continue;
                    }
                    XidClass::ApplicationFault => StopReason::ApplicationFault,
                    XidClass::ContainedMemoryError => StopReason::DeviceFault,
                    XidClass::DrainAndReset => {
                        self.lock_drained().insert(uuid.clone());
                        // Tell the control plane first, so the jobs stopped below are not
                        // placed on this GPU again.
                        let every = self.lock_lease().every();
                        self.heartbeat(every).await;
                        StopReason::DeviceFault
                    }
                };
                tracing::warn!(%what, ?reason, "GPU fault");
                for (id, job) in &self.lock_jobs().running {
                    if job.gpus.iter().any(|g| affected.contains(g)) {
                        tracing::warn!(job = %id, attempt = job.attempt, %what, "stopping the job");
                        job.signal.stop_with(reason, what.clone());
                    }
                }
            }
        }
    }

    pub(crate) fn lock_drained(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.drained.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lock_degraded(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.degraded.lock().unwrap_or_else(|e| e.into_inner())
    }
}
