//! Heartbeats: the inventory (GPUs with health, MIG layout and samples), the jobs running
//! here and what each does on its GPUs, sent every interval; they renew the lease.

use super::*;

impl Agent {
    pub(crate) fn gpus(&self) -> Result<Vec<Gpu>, AgentError> {
        let drained = self.lock_drained().clone();
        let degraded = self.lock_degraded().clone();
        let held: Vec<(Vec<String>, u32)> = self
            .lock_jobs()
            .running
            .values()
            .map(|j| (j.gpus.clone(), j.gpu_milli))
            .collect();
        let mut out = Vec::new();
        for g in self.backend.inventory()? {
            let mig = match self.backend.mig() {
                Some(m) => m.mig_instances(g.index)?,
                None => None,
            };
            // The share of this GPU (or of its MIG instances) the running jobs hold.
            let load: f64 = held
                .iter()
                .filter(|(uuids, _)| {
                    uuids
                        .iter()
                        .any(|u| *u == g.uuid || mig.iter().flatten().any(|i| i.uuid == *u))
                })
                .map(|(_, milli)| f64::from(*milli) / 1000.0)
                .sum();
            let sample = self
                .backend
                .sample(g.index, load)
                .map(|s| allot_proto::v1::GpuSample {
                    utilization: s.utilization as f32,
                    memory_used_bytes: s.memory_used_bytes,
                    power_watts: s.power_watts as f32,
                    temperature_c: s.temperature_c as f32,
                    pcie_rx_bytes_per_s: s.pcie_rx_bytes_per_s,
                    pcie_tx_bytes_per_s: s.pcie_tx_bytes_per_s,
                    nvlink_rx_bytes_per_s: s.nvlink_rx_bytes_per_s,
                    nvlink_tx_bytes_per_s: s.nvlink_tx_bytes_per_s,
                    throttle_reasons: allot_domain::node::throttle_names(s.throttle_mask)
                        .into_iter()
                        .map(str::to_owned)
                        .collect(),
                    ecc_corrected: s.ecc_corrected,
                    ecc_uncorrected: s.ecc_uncorrected,
                });
            let memory_enforcement = if mig.is_some() {
                allot_domain::MemoryEnforcement::Mig
            } else if self.cfg.sharing.shim_library.is_some() {
                allot_domain::MemoryEnforcement::Shim
            } else {
                allot_domain::MemoryEnforcement::Check
            };
            out.push(Gpu {
                sample,
                memory_enforcement: memory_enforcement.as_str().to_owned(),
                healthy: g.healthy && !drained.contains(&g.uuid),
                degraded: g.degraded || degraded.contains(&g.uuid),
                mig_enabled: mig.is_some(),
                nvlink_domain: g.nvlink_domain,
                mig_instances: mig
                    .unwrap_or_default()
                    .into_iter()
                    .map(|i| allot_proto::v1::MigInstance {
                        profile: i.profile,
                        start: u32::from(i.start),
                        uuid: i.uuid,
                    })
                    .collect(),
                uuid: g.uuid,
                index: g.index,
                model: g.model,
                memory_bytes: g.memory_bytes,
            });
        }
        Ok(out)
    }

    /// The MIG instance UUIDs on the GPU with this index (a fault there stops their jobs).
    /// What each running job is doing, from the GPU samples in `gpus` (see
    /// [`job_samples`]).
    pub(crate) fn job_samples(&self, gpus: &[Gpu]) -> Vec<allot_proto::v1::JobSample> {
        let mut readings = HashMap::new();
        // A GPU or MIG instance UUID → its GPU's.
        let mut physical: HashMap<&str, &str> = HashMap::new();
        for g in gpus {
            physical.insert(&g.uuid, &g.uuid);
            for i in &g.mig_instances {
                physical.insert(&i.uuid, &g.uuid);
            }
            if let Some(s) = &g.sample {
                readings.insert(
                    g.uuid.clone(),
                    job_samples::GpuReading {
                        utilization: f64::from(s.utilization),
                        memory_used_bytes: s.memory_used_bytes,
                    },
                );
            }
        }
        struct Running {
            id: String,
            gpus: Vec<String>,
            gpu_milli: u32,
            shared: Option<Arc<sharing::JobSharing>>,
            tracker: Option<Tracker>,
        }
        let running: Vec<Running> = self
            .lock_jobs()
            .running
            .iter()
            .map(|(id, j)| Running {
                id: id.clone(),
                gpus: j.gpus.clone(),
                gpu_milli: j.gpu_milli,
                shared: j.sharing.clone(),
                tracker: j.tracker(),
            })
            .collect();
        if running.is_empty() {
            return Vec::new();
        }
        // The driver's count of each job's processes' memory, where it gives one.
        let owners: Vec<(String, Tracker)> = running
            .iter()
            .filter_map(|r| Some((r.id.clone(), r.tracker.clone()?)))
            .collect();
        let mut counted: HashMap<String, u64> = HashMap::new();
        for g in gpus {
            for (pid, bytes) in self.backend.process_memory(g.index).unwrap_or_default() {
                if let Some(job) = sharing::job_of(pid, &owners) {
                    *counted.entry(job.to_owned()).or_default() += bytes;
                }
            }
        }
        let jobs: Vec<job_samples::JobOnGpus> = running
            .into_iter()
            .map(|r| {
                // The shim's count, once the job's processes use it.
                let memory_limit = r.shared.as_ref().map(|s| {
                    s.gpus
                        .iter()
                        .map(|g| s.limit_on(g).unwrap_or(0))
                        .sum::<u64>()
                });
                let by_shim = r.shared.as_ref().and_then(|s| s.busy_and_held_back());
                // A job on shares holds what its processes allocated through the shim (none
                // yet, before the first one starts using it) or, where the driver counts
                // per process, what the driver says, whichever is more: never the GPU's
                // memory split by share, which counts other jobs' memory as its own.
                let shim = r
                    .shared
                    .map(|s| (0..s.gpus.len()).map(|i| s.region.used(i)).sum::<u64>());
                let driver = counted.get(&r.id).copied();
                let memory_counted = match (shim, driver) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                job_samples::JobOnGpus {
                    counted: by_shim,
                    memory_limit,
                    memory_counted,
                    gpus: r
                        .gpus
                        .iter()
                        .filter_map(|u| physical.get(u.as_str()).map(|p| (*p).to_owned()))
                        .collect(),
                    gpu_milli: r.gpu_milli,
                    id: r.id,
                }
            })
            .collect();
        job_samples::attribute(&readings, &jobs)
            .into_iter()
            .map(|a| allot_proto::v1::JobSample {
                job_id: a.id,
                utilization: a.utilization as f32,
                memory_used_bytes: a.memory_used_bytes,
                held_back: a.held_back as f32,
            })
            .collect()
    }

    pub(crate) fn running_ids(&self) -> Vec<String> {
        self.lock_jobs().running.keys().cloned().collect()
    }

    /// Which attempt of each running job runs.
    pub(crate) fn running_attempts(&self) -> Vec<allot_proto::v1::RunningAttempt> {
        self.lock_jobs()
            .running
            .iter()
            .map(|(id, j)| allot_proto::v1::RunningAttempt {
                job_id: id.clone(),
                attempt: j.attempt,
            })
            .collect()
    }

    /// Heartbeats every interval (as the control plane last said) until `stop`.
    pub(crate) async fn heartbeats(self: Arc<Self>, stop: CancellationToken) {
        let mut failures = 0;
        let mut moved = false;
        loop {
            let every = self.lock_lease().every();
            // A failed heartbeat is tried again soon, at once on the replica the link moved
            // to: the lease runs on meanwhile.
            let wait = if failures == 0 {
                every
            } else if moved {
                self.link.jitter(Duration::from_millis(100))
            } else {
                self.link.jitter(backoff(failures)).min(every)
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
                () = self.heartbeat_now.notified() => {}
            }
            let seen = self.link.moved();
            failures = if self.heartbeat(every).await {
                0
            } else {
                failures + 1
            };
            moved = self.link.moved() != seen;
            let renew_at = self.lock_creds().as_ref().map(|c| c.cert.renew_at());
            if renew_at.is_some_and(|at| chrono::Utc::now() >= at) {
                self.renew().await;
            }
        }
    }

    /// One heartbeat: renews the lease (on success, from when it was sent) and reports the
    /// inventory and the running jobs. Returns whether it was accepted.
    pub(crate) async fn heartbeat(&self, every: Duration) -> bool {
        let gpus = match self.gpus() {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read GPU inventory");
                return false;
            }
        };
        let job_samples = self.job_samples(&gpus);
        let unavailable = self.unavailable().await;
        let seen = self.link.moved();
        let mut client = client(&self.link);
        let mut req = Request::new(HeartbeatRequest {
            gpus,
            running_job_ids: self.running_ids(),
            running_attempts: self.running_attempts(),
            job_samples,
            unavailable,
        });
        // A slow answer still renews the lease from when the call was sent, so wait for
        // one up to half a lease (a loaded control plane is not a lost one); with other
        // replicas to try, a heartbeat interval (a stalled leader is not waited out).
        let half_lease = self.lock_lease().duration / 2;
        let limit = if self.link.has_replicas() {
            every.min(half_lease)
        } else {
            half_lease.max(every)
        };
        req.set_timeout(limit);
        let sent = Instant::now();
        match self.link.within(limit, client.heartbeat(req)).await {
            Ok(answer) => {
                let epoch = allot_proto::leader::epoch(answer.metadata());
                self.link.answered_by_leader(seen, epoch);
                let paced = answer.get_ref();
                self.lock_lease().granted(
                    sent,
                    Duration::from_millis(paced.lease_duration_ms.into()),
                    Duration::from_millis(paced.heartbeat_interval_ms.into()),
                    Duration::from_millis(paced.outage_tolerance_ms.into()),
                );
                true
            }
            Err(s) => {
                tracing::warn!(error = %s.message(), "heartbeat failed");
                self.link.failed(seen, &s);
                false
            }
        }
    }

    /// Why the node takes no new work now (its data dir's file system below
    /// `--min-free-disk`), or empty. A file system that cannot be asked is not reported.
    pub(crate) async fn unavailable(&self) -> String {
        let min = self.cfg.min_free_disk_bytes;
        if min == 0 {
            return String::new();
        }
        let dir = self.cfg.data_dir.clone();
        let free = tokio::task::spawn_blocking(move || {
            nix::sys::statvfs::statvfs(&dir)
                .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
        })
        .await;
        let why = match free {
            Ok(Ok(free)) => crate::low_on_disk(free, min, &self.cfg.data_dir).unwrap_or_default(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the data dir's free space");
                String::new()
            }
            Err(_) => String::new(),
        };
        let mut last = self.unavailable.lock().unwrap_or_else(|e| e.into_inner());
        if *last != why {
            if why.is_empty() {
                tracing::info!("the data dir has room again: taking new work");
            } else {
                tracing::warn!(reason = %why, "taking no new work");
            }
            last.clone_from(&why);
        }
        why
    }

    /// What the metrics report, as of now.
    pub(crate) fn metrics_snapshot(&self) -> metrics::Snapshot {
        let gpus = self.gpus().unwrap_or_default();
        let mut per_gpu: HashMap<String, i64> = gpus.iter().map(|g| (g.uuid.clone(), 0)).collect();
        for job in self.lock_jobs().running.values() {
            for uuid in &job.gpus {
                *per_gpu.entry(uuid.clone()).or_default() += 1;
            }
        }
        let remaining = self.lock_lease().valid_until.map_or(0.0, |u| {
            u.saturating_duration_since(Instant::now()).as_secs_f64()
        });
        metrics::Snapshot {
            gpus: gpus
                .iter()
                .map(|g| {
                    // Operators' drains are the control plane's: it reports those.
                    let health = if !g.healthy {
                        "unhealthy"
                    } else if g.degraded {
                        "degraded"
                    } else {
                        "healthy"
                    };
                    (
                        metrics::GpuLabels {
                            gpu_uuid: g.uuid.clone(),
                            model: g.model.clone(),
                            health: health.to_owned(),
                        },
                        g.memory_bytes,
                    )
                })
                .collect(),
            jobs_per_gpu: per_gpu.into_iter().collect(),
            lease_remaining_seconds: remaining,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_node_is_low_on_disk_under_its_floor_only() {
        let dir = std::path::Path::new("/var/lib/allot");
        assert_eq!(crate::low_on_disk(5 << 30, 2 << 30, dir), None);
        assert_eq!(crate::low_on_disk(2 << 30, 2 << 30, dir), None);
        assert_eq!(crate::low_on_disk(0, 0, dir), None, "0 checks nothing");
        let why = crate::low_on_disk(1 << 30, 2 << 30, dir).expect("low");
        assert!(
            why.starts_with("low on disk: 1 GiB free")
                && why.contains("/var/lib/allot")
                && why.ends_with("--min-free-disk 2 GiB"),
            "{why}"
        );
    }
}
