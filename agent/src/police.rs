//! Keeping jobs on shared GPUs to their limits: contention for elastic jobs, the budget of
//! dead processes, and the driver's count of each job's memory (behind the shim).

use super::*;

impl Agent {
    /// Keeps jobs on shared GPUs to their limits: contention for elastic jobs, the budget
    /// of dead processes, and the driver's count of each job's memory (the second line of
    /// defence behind the shim).
    pub(crate) async fn police_sharing(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
            let shared: Vec<PolicedJob> = self
                .lock_jobs()
                .running
                .iter()
                .filter_map(|(id, j)| {
                    let s = j.sharing.clone()?;
                    Some((id.clone(), j.tracker(), s, j.signal.clone()))
                })
                .collect();
            if shared.is_empty() {
                continue;
            }
            for (_, _, s, _) in &shared {
                s.region.sweep_dead(allot_shim_core::process_alive);
            }
            let regions: Vec<&sharing::JobSharing> =
                shared.iter().map(|(_, _, s, _)| s.as_ref()).collect();
            let Ok(inventory) = self.backend.inventory() else {
                continue;
            };
            let busy: HashMap<String, f64> = inventory
                .iter()
                .filter_map(|g| Some((g.uuid.clone(), self.backend.busy(g.index)?)))
                .collect();
            sharing::update_contention(&regions, allot_shim_core::monotonic_ns(), &busy);
            let owners: Vec<(String, Tracker)> = shared
                .iter()
                .filter_map(|(id, tracker, _, _)| Some((id.clone(), tracker.clone()?)))
                .collect();
            for gpu in &inventory {
                let limits: HashMap<String, u64> = shared
                    .iter()
                    .filter_map(|(id, _, s, _)| Some((id.clone(), s.limit_on(&gpu.uuid)?)))
                    .collect();
                if limits.is_empty() {
                    continue;
                }
                let Some(processes) = self.backend.process_memory(gpu.index) else {
                    continue;
                };
                for breach in sharing::breaches(&gpu.uuid, &processes, &owners, &limits) {
                    let Some((_, _, _, signal)) =
                        shared.iter().find(|(id, ..)| *id == breach.job_id)
                    else {
                        continue;
                    };
                    tracing::warn!(job = %breach.job_id, gpu = %breach.gpu, used = breach.used, limit = breach.limit, "job over its GPU memory limit: killing it");
                    self.metrics.limit_kill(&breach.gpu);
                    signal.stop_with(StopReason::OverLimit, breach.message());
                }
            }
        }
    }
}
