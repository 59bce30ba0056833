//! Assignments from the control plane: launches (through the node's job runtime), cancels,
//! resizes of shared jobs and MIG partitions; and the status reports back.

use super::*;

impl Agent {
    /// The assigned GPUs (or MIG instances), each with its GPU's index.
    pub(crate) fn assigned(
        &self,
        uuids: &[String],
        inventory: &[gpu::GpuInfo],
    ) -> Vec<AssignedGpu> {
        uuids
            .iter()
            .filter_map(|u| {
                if let Some(g) = inventory.iter().find(|g| &g.uuid == u) {
                    return Some(AssignedGpu {
                        uuid: u.clone(),
                        index: g.index,
                    });
                }
                let mig = self.backend.mig()?;
                inventory
                    .iter()
                    .find(|g| {
                        mig.mig_instances(g.index)
                            .ok()
                            .flatten()
                            .is_some_and(|is| is.iter().any(|i| &i.uuid == u))
                    })
                    .map(|g| AssignedGpu {
                        uuid: u.clone(),
                        index: g.index,
                    })
            })
            .collect()
    }

    /// Gives a GPU the MIG layout the control plane asked for, refusing to destroy an
    /// instance a job runs on; the next heartbeat reports the result.
    pub(crate) fn partition(&self, p: Partition) {
        let Some(mig) = self.backend.mig() else {
            tracing::warn!(gpu = %p.gpu_uuid, "asked to partition, but this backend has no MIG");
            return;
        };
        let gpu = match self.backend.inventory() {
            Ok(inv) => inv.into_iter().find(|g| g.uuid == p.gpu_uuid),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read GPU inventory");
                return;
            }
        };
        let Some(gpu) = gpu else {
            tracing::warn!(gpu = %p.gpu_uuid, "asked to partition a GPU this node does not have");
            return;
        };
        let layout: Vec<(u32, u8)> = p
            .layout
            .iter()
            .map(|m| (m.profile, u8::try_from(m.start).unwrap_or(u8::MAX)))
            .collect();
        let held: HashSet<String> = self
            .lock_jobs()
            .running
            .values()
            .flat_map(|j| j.gpus.iter().cloned())
            .collect();
        let store = mig::LayoutStore::new(&self.cfg.data_dir);
        match mig::apply(mig, &store, &gpu, &layout, &|uuid| held.contains(uuid)) {
            Ok(actual) => {
                tracing::info!(gpu = %gpu.uuid, instances = actual.len(), "MIG layout applied")
            }
            Err(e) => tracing::warn!(gpu = %gpu.uuid, error = %e, "MIG layout not applied"),
        }
        // Applied or not, its instances may have changed.
        self.refresh_simulated_cdi();
    }

    /// Asks the control plane whether attempt `attempt` of `job_id` is still this node's to
    /// start (see `JOB_PHASE_STARTING`): `Err` with its answer when it is not. A stop that
    /// comes while asking ends the wait (the start then reports the stop).
    async fn may_start(&self, job_id: &str, attempt: u32, stop: &StopSignal) -> Result<(), String> {
        let report = JobStatusReport {
            job_id: job_id.to_owned(),
            phase: JobPhase::Starting.into(),
            attempt,
            ..Default::default()
        };
        let asked = until_answered(&self.link, |mut c| {
            let r = report.clone();
            async move { c.report_job_status(r).await }
        });
        tokio::select! {
            answer = asked => match answer {
                Ok(_) => Ok(()),
                // A control plane from before the check does not know the phase.
                Err(s) if s.code() == tonic::Code::InvalidArgument
                    && s.message().starts_with("unknown phase") => Ok(()),
                Err(s) => Err(s.message().to_owned()),
            },
            () = stop.stopped() => Ok(()),
        }
    }

    pub(crate) fn report(&self, r: JobStatusReport) {
        // The reporter outlives every sender but the agent's own, so this cannot fail
        // while jobs run.
        let _ = self.reports.send(logship::Outbound::Status(r));
    }

    pub(crate) fn launch(self: &Arc<Self>, l: Launch, tasks: &mut JoinSet<()>) {
        let signal = Arc::new(StopSignal::default());
        let traceparent = l.traceparent.clone();
        if self
            .lock_jobs()
            .seen
            .contains(&(l.job_id.clone(), l.attempt))
        {
            return;
        }
        let inventory = self.backend.inventory().unwrap_or_default();
        let share = sharing::Share {
            gpu_milli: l.gpu_milli,
            gpu_memory_bytes: l.gpu_memory_bytes,
        };
        let shared = match sharing::prepare(
            &self.cfg.sharing,
            &l.job_id,
            &l.gpu_uuids,
            share,
            &l.gpu_compute,
            &inventory,
        ) {
            Ok(s) => s.map(Arc::new),
            Err(why) => {
                // Never run a shared job without its limits.
                tracing::warn!(job = %l.job_id, %why, "cannot enforce the job's GPU share");
                self.lock_jobs().seen.insert((l.job_id.clone(), l.attempt));
                self.report(JobStatusReport {
                    job_id: l.job_id,
                    phase: JobPhase::Failed.into(),
                    message: format!("the node cannot hold the job to its GPU share: {why}"),
                    attempt: l.attempt,
                    ..Default::default()
                });
                return;
            }
        };
        let (network, network_policy) = match job_network(&l.network, l.network_policy.as_ref()) {
            Ok(n) => n,
            Err(why) => {
                tracing::warn!(job = %l.job_id, %why, "cannot give the job its network");
                self.lock_jobs().seen.insert((l.job_id.clone(), l.attempt));
                self.report(JobStatusReport {
                    job_id: l.job_id,
                    phase: JobPhase::Failed.into(),
                    message: why,
                    attempt: l.attempt,
                    ..Default::default()
                });
                return;
            }
        };
        let tracker = Arc::new(Mutex::new(None));
        let log = Arc::new(Mutex::new(logship::LogCursor::new(
            &l.job_id,
            l.attempt,
            runtime::joblog::path(&self.cfg.data_dir, &l.job_id, l.attempt),
            self.cfg.job_log_tail,
        )));
        {
            let mut jobs = self.lock_jobs();
            if !jobs.seen.insert((l.job_id.clone(), l.attempt)) {
                return;
            }
            jobs.running.insert(
                l.job_id.clone(),
                RunningJob {
                    attempt: l.attempt,
                    signal: signal.clone(),
                    gpus: l.gpu_uuids.clone(),
                    gpu_milli: l.gpu_milli,
                    sharing: shared.clone(),
                    tracker: tracker.clone(),
                    log: log.clone(),
                },
            );
        }
        let attempt = l.attempt;
        let spec = LaunchSpec {
            job_id: l.job_id.clone(),
            job_name: l.name,
            tenant: l.tenant,
            node_name: self.cfg.node_name.clone(),
            command: l.command,
            env: {
                let mut env: std::collections::BTreeMap<_, _> = l.env.into_iter().collect();
                if let Some(tool) = &self.cuda_checkpoint {
                    env.insert(
                        "ALLOT_CUDA_CHECKPOINT".to_owned(),
                        tool.display().to_string(),
                    );
                }
                if let Some(s) = &shared {
                    let extra = s.env(&env);
                    env.extend(extra);
                }
                env.extend(self.backend.job_env(&l.gpu_uuids));
                if let Some(g) = &l.gang {
                    env.extend(allot_domain::gang::launcher_env(
                        &allot_domain::gang::Place {
                            gang_id: &g.gang_id,
                            rank: g.rank,
                            size: g.size,
                            master_addr: &g.master_addr,
                            master_port: u16::try_from(g.master_port).unwrap_or(0),
                            gpus: u32::try_from(l.gpu_uuids.len()).unwrap_or(u32::MAX),
                        },
                    ));
                }
                env
            },
            workdir: (!l.workdir.is_empty()).then_some(l.workdir),
            gpus: self.assigned(&l.gpu_uuids, &inventory),
            gpu_uuids: l.gpu_uuids,
            attempt: l.attempt,
            gpu_milli: l.gpu_milli,
            gpu_memory_bytes: l.gpu_memory_bytes,
            cpu_milli: l.cpu_milli,
            memory_bytes: l.memory_bytes,
            image: (!l.image.is_empty()).then_some(l.image),
            pull_credentials: (!l.registry_username.is_empty()).then_some(PullCredentials {
                username: l.registry_username,
                password: l.registry_password,
            }),
            network,
            network_policy,
            gang: l
                .gang
                .as_ref()
                .map(|g| crate::runtime::oci::network::GangNetwork {
                    master_addr: g.master_addr.clone(),
                    master_port: u16::try_from(g.master_port).unwrap_or(0),
                    first: g.rank == 0,
                    peers: g.peer_addresses.clone(),
                }),
            node_address: self.advertised_address(),
            checkpoint_dir: (!l.checkpoint_dir.is_empty()).then_some(l.checkpoint_dir),
            volumes: l
                .volumes
                .into_iter()
                .map(|v| crate::runtime::volumes::VolumeSpec {
                    volume: v.volume,
                    host_path: v.host_path,
                    path: v.path,
                    read_only: v.read_only,
                })
                .collect(),
            secrets: l
                .secrets
                .into_iter()
                .map(|s| crate::runtime::secrets::SecretSpec {
                    env: (!s.env.is_empty()).then_some(s.env),
                    file: (!s.file.is_empty()).then_some(s.file),
                    value: s.value,
                })
                .collect(),
            uid_slot: l.uid_slot,
            inherit_fds: shared
                .as_ref()
                .map(|s| s.fds().to_vec())
                .unwrap_or_default(),
            preload: shared.as_ref().and_then(|s| s.preload.clone()),
        };
        let agent = self.clone();
        // The launch joins the trace of the decision that placed it.
        let span = tracing::info_span!(
            "job.launch",
            otel.name = "job.launch",
            job.id = %spec.job_id,
            job.attempt = spec.attempt,
            node = %self.cfg.node_name,
            trace_id = tracing::field::Empty,
        );
        allot_telemetry::set_parent(&span, &traceparent);
        if let Some(id) = allot_telemetry::trace_id(&span) {
            span.record("trace_id", id);
        }
        tasks.spawn(
            async move {
                let job_id = spec.job_id.clone();
                let log_path = runtime::joblog::path(&agent.cfg.data_dir, &job_id, attempt);
                // A launch that reached the node late (held in a cut link while the attempt
                // was requeued elsewhere) must not start: asked first.
                if let Err(why) = agent.may_start(&job_id, attempt, &signal).await {
                    tracing::warn!(job = %job_id, attempt, %why, "launch not confirmed; not started");
                    let mut jobs = agent.lock_jobs();
                    jobs.stop_tracking(&job_id, attempt);
                    // Not seen after all: a refusal for a lease that lapsed while the node
                    // was away passes once it renews, and the control plane sends the launch
                    // again while the attempt is still this node's (it sends no other).
                    jobs.seen.remove(&(job_id.clone(), attempt));
                    return;
                }
                tracing::info!(job = %job_id, image = ?spec.image, runtime = agent.runtime.kind().as_str(), "launching");
                let finished = runtime::supervise(
                    agent.runtime.as_ref(),
                    spec,
                    log_path,
                    &signal,
                    agent.cfg.stop_grace,
                    |started| {
                        *tracker.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(started.tracker.clone());
                        agent.report(JobStatusReport {
                            job_id: job_id.clone(),
                            phase: JobPhase::Running.into(),
                            pid: Some(started.pid),
                            attempt,
                            image_digest: started.image_digest.unwrap_or_default(),
                            ..Default::default()
                        });
                    },
                )
                .await;
                let (phase, exit_code, message) = match finished.outcome {
                    Outcome::Succeeded => (JobPhase::Succeeded, Some(0), String::new()),
                    Outcome::Failed { exit_code, message } => {
                        (JobPhase::Failed, exit_code, message)
                    }
                    Outcome::Cancelled { message } => (JobPhase::Cancelled, None, message),
                    Outcome::Lost { message } => (JobPhase::Lost, None, message),
                    Outcome::DeviceFault { message } => (JobPhase::DeviceFault, None, message),
                    Outcome::AgentShutdown { message } => {
                        (JobPhase::AgentShutdown, None, message)
                    }
                };
                tracing::info!(job = %job_id, ?phase, ?exit_code, "job ended");
                // Its last output goes before its end.
                agent.flush_log(&log);
                // Its processes are gone: no heartbeat from now on shows it, then the end
                // is reported (the control plane frees its GPUs once a heartbeat agrees).
                agent.lock_jobs().stop_tracking(&job_id, attempt);
                agent.report(JobStatusReport {
                    job_id: job_id.clone(),
                    phase: phase.into(),
                    pid: None,
                    exit_code,
                    message,
                    log_tail: finished.log_tail,
                    attempt,
                    ..Default::default()
                });
                let _ = agent.reports.send(logship::Outbound::Shipped(
                    runtime::joblog::path(&agent.cfg.data_dir, &job_id, attempt),
                ));
            }
            .instrument(span),
        );
    }

    /// Applies a new share to a running job's limits.
    pub(crate) fn resize(&self, r: Resize) {
        let jobs = self.lock_jobs();
        match jobs.running.get(&r.job_id) {
            Some(job) if job.attempt == r.attempt || r.attempt == 0 => match &job.sharing {
                Some(s) => {
                    s.resize(sharing::Share {
                        gpu_milli: r.gpu_milli,
                        gpu_memory_bytes: r.gpu_memory_bytes,
                    });
                    tracing::info!(job = %r.job_id, gpu_milli = r.gpu_milli, gpu_memory_bytes = r.gpu_memory_bytes, "resized");
                }
                None => tracing::warn!(job = %r.job_id, "resize of a job on whole GPUs ignored"),
            },
            _ => {
                tracing::info!(job = %r.job_id, attempt = r.attempt, "resize of a job not running here ignored")
            }
        }
    }

    /// Stops the job's attempt `c.attempt` (0: whichever runs), or makes sure it never
    /// starts here.
    pub(crate) fn cancel(&self, c: Cancel) {
        let mut jobs = self.lock_jobs();
        if let Some(job) = jobs.running.get(&c.job_id)
            && (c.attempt == 0 || job.attempt == c.attempt)
        {
            tracing::info!(job = %c.job_id, attempt = job.attempt, reason = %c.reason, grace_seconds = c.grace_seconds, "stopping");
            if c.grace_seconds > 0 {
                job.signal.stop_within(
                    StopReason::Cancelled,
                    Duration::from_secs(u64::from(c.grace_seconds)),
                );
            } else {
                job.signal.stop(StopReason::Cancelled);
            }
            return;
        }
        if c.attempt != 0 && jobs.seen.insert((c.job_id.clone(), c.attempt)) {
            // Stopped before its launch reached us: it will never start here.
            drop(jobs);
            self.report(JobStatusReport {
                job_id: c.job_id,
                phase: JobPhase::Cancelled.into(),
                message: format!("{} before it started", c.reason),
                attempt: c.attempt,
                ..Default::default()
            });
        }
    }
}

/// Delivers status reports in order, retrying each until the control plane acknowledges it,
/// so no exit is lost to a restart of the control plane.
/// After a job's end is acknowledged, `heartbeat_now` is woken: the control plane holds
/// the job's GPUs until a heartbeat shows the job gone from the node, and this one does.
pub(crate) async fn deliver_reports(
    link: Arc<Link>,
    mut rx: mpsc::UnboundedReceiver<logship::Outbound>,
    heartbeat_now: Arc<tokio::sync::Notify>,
    log_queued: Arc<logship::Queued>,
) {
    while let Some(out) = rx.recv().await {
        match out {
            logship::Outbound::Status(report) => {
                let ended = report.phase != i32::from(JobPhase::Running);
                match until_answered(&link, |mut c| {
                    let r = report.clone();
                    async move { c.report_job_status(r).await }
                })
                .await
                {
                    Ok(_) if ended => heartbeat_now.notify_one(),
                    Ok(_) => {}
                    Err(s) => {
                        tracing::warn!(job = %report.job_id, error = %s.message(), "status report rejected");
                    }
                }
            }
            logship::Outbound::Shipped(path) => {
                if let Err(e) = runtime::joblog::mark_shipped(&path) {
                    tracing::warn!(log = %path.display(), error = %e, "job log not marked as shipped");
                }
            }
            logship::Outbound::Logs(logs) => {
                match until_answered(&link, |mut c| {
                    let l = logs.clone();
                    async move { c.append_job_logs(l).await }
                })
                .await
                {
                    Ok(ack) if ack.get_ref().refused > 0 => tracing::debug!(
                        refused = ack.get_ref().refused,
                        "log chunks refused (attempts no longer here)"
                    ),
                    Ok(_) => {}
                    Err(s) => tracing::warn!(error = %s.message(), "log output rejected"),
                }
                log_queued.done(&logs);
            }
        }
    }
}

/// How long a call waits for a replica's answer when there are others to try.
const REPLICA_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// `call`'s answer, retried while the control plane is unreachable, or the error it
/// refused with (not sent again). Retried often: a message stuck behind a partition holds
/// up every later one (a job's start included).
pub(crate) async fn until_answered<T, F, Fut>(link: &Link, call: F) -> Result<T, Status>
where
    F: Fn(NodeServiceClient<Channel>) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let mut attempt = 0;
    loop {
        let seen = link.moved();
        // With other replicas to go to, a stalled one (frozen, cut off) is not waited out:
        // the queue behind this call would wait with it.
        match link.within(REPLICA_CALL_TIMEOUT, call(client(link))).await {
            Err(s) if transient(&s) => {
                // Moved on (a follower names the leader) or not, pause a little: a hint can
                // name a leader that has just gone.
                let moved = link.failed(seen, &s);
                attempt += 1;
                let wait = if moved {
                    Duration::from_millis(50)
                } else {
                    backoff(attempt).min(Duration::from_millis(300))
                };
                tokio::time::sleep(link.jitter(wait)).await;
            }
            answered => return answered,
        }
    }
}

/// A launch's network and its tenant's network policy. An unknown network is refused
/// rather than run on the node's.
fn job_network(
    network: &str,
    policy: Option<&allot_proto::v1::NetworkPolicy>,
) -> Result<(Network, Option<allot_domain::NetworkPolicy>), String> {
    let network = match network {
        "" | "private" => Network::Private,
        "host" => Network::Host,
        "none" => Network::None,
        other => {
            return Err(format!(
                "the control plane asked for network `{other}`, which this node does not know"
            ));
        }
    };
    let Some(p) = policy else {
        return Ok((network, None));
    };
    let egress = if p.restricted {
        let mut rules = Vec::with_capacity(p.allow.len());
        for r in &p.allow {
            let cidr = allot_domain::network::parse_cidr(&r.cidr)
                .map_err(|e| format!("the tenant's network policy: {e}"))?;
            let mut ports = Vec::with_capacity(r.ports.len());
            for range in &r.ports {
                let (Ok(first), Ok(last)) = (u16::try_from(range.first), u16::try_from(range.last))
                else {
                    return Err(format!(
                        "the tenant's network policy names ports {}-{}",
                        range.first, range.last
                    ));
                };
                ports.push(allot_domain::PortRange { first, last });
            }
            rules.push(allot_domain::EgressRule { cidr, ports });
        }
        Some(rules)
    } else {
        None
    };
    Ok((
        network,
        Some(allot_domain::NetworkPolicy {
            egress,
            allow_host_network: p.allow_host_network,
        }),
    ))
}
