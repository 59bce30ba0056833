//! A fleet for the efficiency benchmark: a control plane on SQLite (in this process),
//! real `allot agent` processes with simulated GPUs that contend (the fake driver's shared
//! state) and the shim preloaded into shared jobs, and the workload programs as jobs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allot_server::{RunningServer, ServerConfig};
use anyhow::{Context, bail};
use reqwest::Method;
use serde_json::{Value, json};

use allot_client::Client;

/// The control plane's `--max-jobs-per-shared-gpu` in these runs.
pub const MAX_JOBS_PER_GPU: u32 = 16;

/// The volume training loops checkpoint into.
const CHECKPOINT_VOLUME: &str = "checkpoints";

/// The programs a run needs, found beside this executable.
pub struct Kit {
    pub workload: PathBuf,
    pub shim: PathBuf,
    /// A directory holding the fake driver under the names programs load it by.
    pub driver_dir: PathBuf,
}

impl Kit {
    pub fn find(root: &Path) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating this executable")?;
        let beside = |name: &str| {
            let p = exe.with_file_name(name);
            if p.is_file() {
                Ok(p)
            } else {
                bail!(
                    "{} not found (build it: cargo build --release -p allot -p allot-bench -p allot-workload \
                     -p allot-shim -p allot-fake-cuda)",
                    p.display()
                )
            }
        };
        let driver_dir = root.join("driver");
        allot_shim_core::probe::link_driver(&beside("liballot_fake_cuda.so")?, &driver_dir)
            .map_err(anyhow::Error::msg)?;
        Ok(Kit {
            workload: beside("allot-workload")?,
            shim: beside("liballot_shim.so")?,
            driver_dir,
        })
    }
}

/// One mode's fleet and where its jobs keep their state.
pub struct Fleet {
    pub server: RunningServer,
    pub client: Client,
    agents: Vec<tokio::process::Child>,
    /// Each node's simulated GPUs' shared state (the fake driver's `<uuid>.gpu` files, in
    /// the agent's `sim-gpus/`).
    gpu_state: Vec<PathBuf>,
    /// Where services write their ports and training loops their progress.
    pub ports: PathBuf,
    pub progress: PathBuf,
    /// The research tenant's directory of the checkpoint volume, on this machine.
    checkpoints: PathBuf,
    /// Every GPU of the fleet, by UUID.
    pub gpus: Vec<String>,
    kit_env: Value,
    workload: PathBuf,
}

pub struct FleetSpec {
    pub nodes: usize,
    pub gpus_per_node: usize,
    /// The elastic share policy (TOML) the control plane applies, if any.
    pub elastic_policy: Option<String>,
    /// How many times shorter than production the sizing windows of auto-sized jobs are.
    pub sizing_time_scale: f64,
    /// How the control plane sizes auto-sized jobs.
    pub sizing_rules: allot_server::sizing::Rules,
}

impl Fleet {
    pub async fn start(kit: &Kit, dir: &Path, spec: &FleetSpec) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let policy = match &spec.elastic_policy {
            Some(text) => {
                let path = dir.join("elastic.toml");
                std::fs::write(&path, text)?;
                Some(path)
            }
            None => None,
        };
        let mut config = ServerConfig::new(format!(
            "sqlite://{}?mode=rwc",
            dir.join("allot.db").display()
        ));
        config.schedule_interval = Duration::from_millis(200);
        config.min_runtime = Duration::ZERO;
        // Services at small shares: more of them on a GPU than the default 4.
        config.gpu_limits.max_jobs_per_shared_gpu = MAX_JOBS_PER_GPU;
        config.sizing_time_scale = spec.sizing_time_scale;
        config.sizing_rules = spec.sizing_rules;
        // Samples (one a heartbeat) often enough for sizing windows compressed with the
        // demand (they are never shorter than ten samples).
        if spec.sizing_time_scale > 1.0 {
            config.heartbeat_interval = Duration::from_millis(250);
        }
        config.elastic = policy.is_some();
        config.elastic_policy = policy;
        let (server, client) = crate::harness::in_process_server(config).await?;
        for tenant in ["serving", "research"] {
            let _: Value = client
                .call(
                    Method::POST,
                    "/api/v1/tenants",
                    Some(&json!({ "name": tenant })),
                )
                .await?;
        }
        // Training checkpoints go where an operator would put them: a volume every node
        // sees (here, this machine's directory), told to each loop as ALLOT_CHECKPOINT_DIR.
        let volume = dir.join("volume");
        std::fs::create_dir_all(&volume)?;
        let _: Value = client
            .call(
                Method::PUT,
                &format!("/api/v1/volumes/{CHECKPOINT_VOLUME}"),
                Some(
                    &json!({ "host_path": volume.display().to_string(), "tenants": ["research"] }),
                ),
            )
            .await?;
        let ca_cert = dir.join("node-ca.pem");
        std::fs::write(&ca_cert, &server.node_ca_pem)?;
        let agents = crate::harness::processes::Agents {
            exe: crate::allot_exe()?,
            ca_cert,
            sim_gpus: format!("{}xH200", spec.gpus_per_node),
            runtime: crate::RuntimeKind::Process,
            registry: None,
            extra_args: vec![
                "--shim-library".into(),
                kit.shim.display().to_string(),
                // The workloads need little of the host: enough for every job.
                "--cpus".into(),
                "64".into(),
                "--memory".into(),
                "64GiB".into(),
            ],
        };
        let mut children = Vec::new();
        let mut gpu_state = Vec::new();
        for i in 1..=spec.nodes {
            let name = format!("eff-{i}");
            let data_dir = dir.join(&name);
            gpu_state.push(data_dir.join("sim-gpus"));
            std::fs::create_dir_all(&data_dir)?;
            let bootstrap = crate::harness::processes::bootstrap_token(&server, &name).await?;
            children.push(agents.spawn_at(&name, &data_dir, &bootstrap, &[server.grpc_addr])?);
        }
        let gpus: Vec<String> = crate::harness::processes::ready_nodes(&client, spec.nodes)
            .await?
            .iter()
            .flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default())
            .filter_map(|g| g["uuid"].as_str().map(str::to_owned))
            .collect();
        let (ports, progress) = (dir.join("ports"), dir.join("progress"));
        let checkpoints = PathBuf::from(allot_domain::volume::tenant_dir(
            &volume.display().to_string(),
            "research",
        ));
        for d in [&ports, &progress] {
            std::fs::create_dir_all(d)?;
        }
        // The agent tells each job which simulated GPUs are its and where they are shared.
        let kit_env = json!({ "LD_LIBRARY_PATH": kit.driver_dir.display().to_string() });
        Ok(Fleet {
            server,
            client,
            agents: children,
            gpu_state,
            ports,
            progress,
            checkpoints,
            gpus,
            kit_env,
            workload: kit.workload.clone(),
        })
    }

    /// The job's command: the workload program.
    fn command(&self, args: &[String]) -> Vec<String> {
        std::iter::once(self.workload.display().to_string())
            .chain(args.iter().cloned())
            .collect()
    }

    /// Submits an inference service replica (`key` names its port file) on `milli` of a
    /// GPU (`None`: a whole one), its compute held `compute` (strict or elastic).
    pub async fn submit_service(
        &self,
        key: &str,
        milli: Option<u32>,
        compute: &str,
        serve: &[String],
    ) -> anyhow::Result<String> {
        let extra = match milli {
            Some(m) => json!({
                "gpu_milli": m, "gpu_memory_bytes": 4u64 << 30, "gpu_compute": compute,
            }),
            None => json!({}),
        };
        self.submit_service_with(key, extra, serve).await
    }

    /// Submits an inference service replica (`key` names its port file) with `extra` in its
    /// submit body: nothing (a whole GPU), a share, or `gpu_sizing`.
    pub async fn submit_service_with(
        &self,
        key: &str,
        extra: Value,
        serve: &[String],
    ) -> anyhow::Result<String> {
        let mut args = vec![
            "serve".to_owned(),
            "--port-file".to_owned(),
            self.ports.join(key).display().to_string(),
        ];
        args.extend(serve.iter().cloned());
        let mut body = json!({
            "tenant": "serving", "name": key, "gpus": 1, "class": "inference",
            "isolation": "shared", "preemptible": false, "max_retries": 3,
            "cpu_milli": 20, "memory_bytes": 64u64 << 20,
            "command": self.command(&args), "env": self.kit_env,
        });
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
            b.extend(extra);
        }
        self.submit(&body).await
    }

    /// The training backlog: a loop for each of the fleet's GPUs, on a whole GPU or
    /// best-effort (on what the services leave, wherever they leave it); (key, job id) of
    /// each.
    pub async fn submit_backlog(
        &self,
        train: &[String],
        best_effort: bool,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let mut training = Vec::new();
        for i in 0..self.gpus.len() {
            let key = format!("train-{i}");
            let id = if best_effort {
                let extra = json!({
                    "gpu_compute": "best_effort", "gpu_memory_bytes": 4u64 << 30,
                });
                self.submit_training_with(&key, extra, train).await?
            } else {
                self.submit_training(&key, None, train).await?
            };
            training.push((key, id));
        }
        Ok(training)
    }

    /// Submits a training loop (`milli`: a share of a GPU, elastic; `None`: a whole GPU).
    pub async fn submit_training(
        &self,
        key: &str,
        milli: Option<u32>,
        train: &[String],
    ) -> anyhow::Result<String> {
        let extra = match milli {
            Some(m) => json!({
                "gpu_milli": m, "gpu_memory_bytes": 4u64 << 30, "gpu_compute": "elastic",
            }),
            None => json!({}),
        };
        self.submit_training_with(key, extra, train).await
    }

    /// Submits a training loop with `extra` in its submit body.
    pub async fn submit_training_with(
        &self,
        key: &str,
        extra: Value,
        train: &[String],
    ) -> anyhow::Result<String> {
        let mut args = vec![
            "train".to_owned(),
            "--progress-dir".to_owned(),
            self.progress.display().to_string(),
        ];
        args.extend(train.iter().cloned());
        let mut body = json!({
            "tenant": "research", "name": key, "gpus": 1, "class": "training",
            "isolation": "shared", "preemptible": true, "max_retries": 3,
            "volumes": [{ "volume": CHECKPOINT_VOLUME, "path": "/ckpt" }],
            "checkpoint_dir": format!("/ckpt/{key}"),
            "cpu_milli": 20, "memory_bytes": 64u64 << 20,
            "command": self.command(&args), "env": self.kit_env,
        });
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
            b.extend(extra);
        }
        self.submit(&body).await
    }

    async fn submit(&self, body: &Value) -> anyhow::Result<String> {
        let job: Value = self
            .client
            .call(Method::POST, "/api/v1/jobs", Some(body))
            .await?;
        job["id"]
            .as_str()
            .map(str::to_owned)
            .context("a submitted job has an id")
    }

    pub async fn jobs(&self) -> anyhow::Result<Vec<Value>> {
        crate::harness::processes::all_jobs(&self.client).await
    }

    /// The port a service replica listens on, once it does.
    pub fn port(&self, key: &str) -> Option<u16> {
        std::fs::read_to_string(self.ports.join(key))
            .ok()
            .and_then(|p| p.trim().parse().ok())
    }

    /// Each GPU's busy time so far (nanoseconds), from the fake driver's own accounting.
    pub fn busy_ns(&self) -> HashMap<String, u64> {
        self.gpus
            .iter()
            .map(|g| {
                let busy = self
                    .gpu_state
                    .iter()
                    .find_map(|d| allot_agent::gpu::fake_gpu_busy_ns(d, g))
                    .unwrap_or(0);
                (g.clone(), busy)
            })
            .collect()
    }

    /// Kernel-seconds every training attempt has run so far (by job name and attempt).
    pub fn training_work(&self) -> HashMap<String, f64> {
        let Ok(entries) = std::fs::read_dir(&self.progress) else {
            return HashMap::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".tmp") {
                    return None;
                }
                let text = std::fs::read_to_string(e.path()).ok()?;
                let work: f64 = text.split_whitespace().next()?.parse().ok()?;
                Some((name, work))
            })
            .collect()
    }

    /// Kernel-seconds the training job `key`'s checkpoint holds.
    pub fn checkpointed(&self, key: &str) -> f64 {
        std::fs::read_to_string(self.checkpoints.join(key).join("checkpoint"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0.0)
    }

    pub async fn cancel(&self, id: &str) -> anyhow::Result<()> {
        let _: Value = self
            .client
            .call::<Value, Value>(Method::POST, &format!("/api/v1/jobs/{id}/cancel"), None)
            .await?;
        Ok(())
    }

    /// Cancels `ids` and waits (up to a minute) until none of them runs.
    pub async fn cancel_all(&self, ids: &[String]) -> anyhow::Result<()> {
        // The last submitted first: pending jobs go before a cancel frees room for them.
        for id in ids.iter().rev() {
            self.cancel(id).await?;
        }
        let started = Instant::now();
        loop {
            let jobs = self.jobs().await?;
            let unfinished = jobs
                .iter()
                .filter(|j| ids.iter().any(|i| j["id"].as_str() == Some(i)))
                .filter(|j| {
                    !allot_domain::JobState::ends_in(j["state"].as_str().unwrap_or_default())
                })
                .count();
            if unfinished == 0 {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("{unfinished} jobs still running a minute after being cancelled");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the agents and the control plane.
    pub async fn stop(mut self) {
        for child in &mut self.agents {
            crate::harness::processes::terminate(child);
        }
        for child in &mut self.agents {
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
        self.server.shutdown().await;
    }
}
