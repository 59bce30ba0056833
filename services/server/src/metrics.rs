//! Prometheus metrics of the control plane, served on their own listener
//! (`--metrics-listen`, loopback by default) as OpenMetrics text at `/metrics`.
//!
//! What the store holds (jobs, nodes, GPUs, tenants' usage) is read at scrape time, so a
//! restarted server reports the truth at once; what happens (requests, scheduling passes,
//! refused authentication) is counted as it happens. Names and labels are documented in
//! `docs/metrics.md`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use allot_domain::JobState;
use allot_store::{
    JobFilter, JobRepo, NodeRepo, SampleRepo, Store, StoreError, TenantRepo, TenantScope,
};

/// The content type of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    tenant: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    gpu_uuid: String,
    model: String,
    health: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UtilizationLabels {
    node: String,
    gpu_uuid: String,
    model: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkLabels {
    node: String,
    gpu_uuid: String,
    /// `pcie` or `nvlink`.
    link: String,
    /// `rx` (to the GPU) or `tx`.
    direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunningJobLabels {
    tenant: String,
    job: String,
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantClassLabels {
    class: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    node: String,
    gpu_uuid: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MigLabels {
    node: String,
    gpu_uuid: String,
    profile: String,
    /// `held` (a job runs on it) or `free`.
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    /// The route's pattern, e.g. `/api/v1/jobs/{id}`, never the raw path.
    pub route: String,
    pub status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

impl Metrics {
    /// The elastic policy's state after a pass.
    pub fn elastic(
        &self,
        plan: &allot_elastic::live::Plan,
        forecast_error: &std::collections::BTreeMap<String, f64>,
    ) {
        self.elastic_entitlement.clear();
        for (class, gpus) in &plan.entitlement {
            self.elastic_entitlement
                .get_or_create(&TenantClassLabels {
                    class: class.clone(),
                })
                .set(*gpus);
        }
        self.elastic_forecast_mape.clear();
        for (class, error) in forecast_error {
            self.elastic_forecast_mape
                .get_or_create(&TenantClassLabels {
                    class: class.clone(),
                })
                .set(*error);
        }
        self.elastic_burst.set(i64::from(plan.burst_active));
    }

    /// This replica leads under `epoch`, or (`None`) follows.
    pub fn leading(&self, epoch: Option<i64>) {
        self.leader_epoch.set(epoch.unwrap_or(0));
    }

    /// A GPU's traffic, throttle reasons and ECC counts from its latest sample.
    fn set_signals(&self, node: &str, gpu: &str, p: &allot_store::SamplePoint) {
        for (link, direction, rate) in [
            ("pcie", "rx", p.pcie_rx_bytes_per_s),
            ("pcie", "tx", p.pcie_tx_bytes_per_s),
            ("nvlink", "rx", p.nvlink_rx_bytes_per_s),
            ("nvlink", "tx", p.nvlink_tx_bytes_per_s),
        ] {
            self.gpu_link
                .get_or_create(&LinkLabels {
                    node: node.to_owned(),
                    gpu_uuid: gpu.to_owned(),
                    link: link.to_owned(),
                    direction: direction.to_owned(),
                })
                .set(rate);
        }
        let labels = |reason: &str| ReasonLabels {
            node: node.to_owned(),
            gpu_uuid: gpu.to_owned(),
            reason: reason.to_owned(),
        };
        for reason in allot_domain::node::throttle_names(p.throttle_mask) {
            self.gpu_throttled.get_or_create(&labels(reason)).set(1);
        }
        for (kind, count) in [
            ("corrected", p.ecc_corrected),
            ("uncorrected", p.ecc_uncorrected),
        ] {
            self.gpu_ecc
                .get_or_create(&labels(kind))
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}

/// Every metric, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    jobs: Family<JobLabels, Gauge>,
    gpus: Family<GpuLabels, Gauge>,
    gpu_allocated_milli: Family<GpuLabels, Gauge>,
    gpu_utilization: Family<UtilizationLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    gpu_link: Family<LinkLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    gpu_throttled: Family<ReasonLabels, Gauge>,
    gpu_ecc: Family<ReasonLabels, Gauge>,
    elastic_entitlement: Family<TenantClassLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    elastic_forecast_mape: Family<TenantClassLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    elastic_burst: Gauge,
    leader_epoch: Gauge,
    job_utilization: Family<RunningJobLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    job_memory: Family<RunningJobLabels, Gauge>,
    mig_instances: Family<MigLabels, Gauge>,
    nodes: Family<NodeLabels, Gauge>,
    tenant_gpu_milli: Family<TenantLabels, Gauge>,
    tenant_own_gpu_milli: Family<TenantLabels, Gauge>,
    http_requests: Family<HttpLabels, Counter>,
    http_seconds: Family<HttpLabels, Histogram>,
    passes: Family<OutcomeLabels, Counter>,
    pass_seconds: Histogram,
    heartbeats: Family<OutcomeLabels, Counter>,
    heartbeat_seconds: Histogram,
    /// One scrape at a time: the gauges are refilled from the store for each.
    scrape: tokio::sync::Mutex<()>,
    /// Route patterns seen, bounded, so odd paths cannot grow the label set without end.
    routes: Mutex<HashMap<String, ()>>,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 2.0, 16)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("allot");
        let jobs = Family::<JobLabels, Gauge>::default();
        registry.register("jobs", "Jobs by tenant and state", jobs.clone());
        let gpus = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "gpus",
            "GPUs known to the control plane (1 each)",
            gpus.clone(),
        );
        let gpu_allocated_milli = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "gpu_allocated_milli",
            "Thousandths of each GPU held by scheduled and running jobs",
            gpu_allocated_milli.clone(),
        );
        let gpu_utilization =
            Family::<UtilizationLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "gpu_utilization",
            "Busy fraction of each GPU (0 to 1), as its latest 10-second sample averaged",
            gpu_utilization.clone(),
        );
        let gpu_link = Family::<LinkLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "gpu_link_bytes_per_second",
            "PCIe and NVLink data traffic of each GPU, by link and direction, as its latest \
             10-second sample averaged",
            gpu_link.clone(),
        );
        let gpu_throttled = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "gpu_throttled",
            "1 for each reason each GPU's clocks were held down in its latest 10-second sample",
            gpu_throttled.clone(),
        );
        let gpu_ecc = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "gpu_ecc_errors",
            "ECC errors of each GPU since its driver loaded, by reason (corrected, uncorrected)",
            gpu_ecc.clone(),
        );
        let elastic_entitlement =
            Family::<TenantClassLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "elastic_entitlement_gpus",
            "GPUs each workload class is entitled to under the elastic policy now (with --elastic)",
            elastic_entitlement.clone(),
        );
        let elastic_forecast_mape =
            Family::<TenantClassLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "elastic_forecast_mape",
            "Mean absolute percentage error of each class's hourly demand forecasts so far",
            elastic_forecast_mape.clone(),
        );
        let elastic_burst = Gauge::default();
        registry.register(
            "elastic_burst_active",
            "1 while the burst class borrows beyond its share",
            elastic_burst.clone(),
        );
        let leader_epoch = Gauge::default();
        registry.register(
            "leader_epoch",
            "The epoch of the leader lease this replica holds; 0 while it follows",
            leader_epoch.clone(),
        );
        let job_utilization =
            Family::<RunningJobLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "job_gpu_utilization",
            "Fraction of its GPUs' time each running job kept busy, as its latest 10-second \
             sample averaged",
            job_utilization.clone(),
        );
        let job_memory = Family::<RunningJobLabels, Gauge>::default();
        registry.register(
            "job_gpu_memory_bytes",
            "GPU memory each running job holds, all its GPUs together, as its latest sample",
            job_memory.clone(),
        );
        let mig_instances = Family::<MigLabels, Gauge>::default();
        registry.register(
            "mig_instances",
            "MIG instances by GPU, profile and whether a job holds them",
            mig_instances.clone(),
        );
        let nodes = Family::<NodeLabels, Gauge>::default();
        registry.register("nodes", "Nodes by readiness (1 each)", nodes.clone());
        let tenant_gpu_milli = Family::<TenantLabels, Gauge>::default();
        registry.register(
            "tenant_gpu_milli_in_use",
            "Thousandths of GPUs a tenant's scheduled and running jobs and its teams' hold",
            tenant_gpu_milli.clone(),
        );
        let tenant_own_gpu_milli = Family::<TenantLabels, Gauge>::default();
        registry.register(
            "tenant_own_gpu_milli_in_use",
            "Thousandths of GPUs a tenant's own scheduled and running jobs hold (its teams' not \
             counted)",
            tenant_own_gpu_milli.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "API requests by method, route and status",
            http_requests.clone(),
        );
        let http_seconds = Family::<HttpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(seconds_buckets())
        });
        registry.register(
            "http_request_duration_seconds",
            "API request latency",
            http_seconds.clone(),
        );
        let passes = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "scheduling_passes",
            "Scheduling passes by outcome (ok, error)",
            passes.clone(),
        );
        let pass_seconds = Histogram::new(seconds_buckets());
        registry.register(
            "scheduling_pass_duration_seconds",
            "How long a scheduling pass takes, store reads and writes included",
            pass_seconds.clone(),
        );
        let heartbeats = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "heartbeats",
            "Agents' heartbeats handled, by outcome (ok, error: refused or failed)",
            heartbeats.clone(),
        );
        let heartbeat_seconds = Histogram::new(seconds_buckets());
        registry.register(
            "heartbeat_duration_seconds",
            "How long handling an agent's heartbeat takes, store writes included",
            heartbeat_seconds.clone(),
        );
        Self {
            registry,
            heartbeats,
            heartbeat_seconds,
            jobs,
            gpus,
            gpu_allocated_milli,
            gpu_utilization,
            gpu_link,
            gpu_throttled,
            gpu_ecc,
            elastic_entitlement,
            elastic_forecast_mape,
            elastic_burst,
            leader_epoch,
            job_utilization,
            job_memory,
            mig_instances,
            nodes,
            tenant_gpu_milli,
            tenant_own_gpu_milli,
            http_requests,
            http_seconds,
            passes,
            pass_seconds,
            scrape: tokio::sync::Mutex::new(()),
            routes: Mutex::new(HashMap::new()),
        }
    }

    /// Counts an API request. Routes outside the route table count as `unmatched`.
    pub fn http_request(&self, method: &str, route: Option<&str>, status: u16, took: Duration) {
        const MAX_ROUTES: usize = 256;
        let route = match route {
            Some(r) => {
                let mut seen = self.routes.lock().unwrap_or_else(|e| e.into_inner());
                if seen.contains_key(r) || seen.len() < MAX_ROUTES {
                    seen.insert(r.to_owned(), ());
                    r.to_owned()
                } else {
                    "other".to_owned()
                }
            }
            None => "unmatched".to_owned(),
        };
        let labels = HttpLabels {
            method: method.to_owned(),
            route,
            status: status.to_string(),
        };
        self.http_requests.get_or_create(&labels).inc();
        self.http_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Counts a scheduling pass.
    pub fn scheduling_pass(&self, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.passes
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.pass_seconds.observe(took.as_secs_f64());
    }

    /// Counts an agent's heartbeat and how long it took to answer.
    pub fn heartbeat(&self, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.heartbeats
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.heartbeat_seconds.observe(took.as_secs_f64());
    }

    /// The OpenMetrics text of every metric, the store's state read now.
    pub async fn render(&self, store: &Store) -> Result<String, StoreError> {
        let _one = self.scrape.lock().await;
        let now = store.clock().now();
        let tenants = store.list_tenants().await?;
        let tenant_name: HashMap<&str, &str> = tenants
            .iter()
            .map(|t| (t.id.as_str(), t.name.as_str()))
            .collect();
        let nodes = store.list_nodes().await?;
        // Counted by the database; only the jobs that hold GPUs are read.
        let counts = store.count_jobs_by_state().await?;
        let jobs = store
            .list_jobs(JobFilter {
                states: JobState::ALL
                    .into_iter()
                    .filter(|s| s.holds_resources())
                    .collect(),
                ..JobFilter::new(TenantScope::All)
            })
            .await?
            .jobs;

        self.jobs.clear();
        for t in &tenants {
            // Every state of every tenant, zeros included, so rates and alerts see them.
            for state in JobState::ALL {
                self.jobs
                    .get_or_create(&JobLabels {
                        tenant: t.name.to_string(),
                        state: state.as_str().to_owned(),
                    })
                    .set(0);
            }
        }
        let name_of = |id: &str| tenant_name.get(id).copied().unwrap_or("unknown").to_owned();
        for (tenant_id, state, n) in &counts {
            self.jobs
                .get_or_create(&JobLabels {
                    tenant: name_of(tenant_id),
                    state: state.as_str().to_owned(),
                })
                .inc_by(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        // `jobs` are those that hold GPUs (read so above): what each tenant holds, its teams'
        // included, by the one definition the API and the portal show.
        let totals = allot_domain::holding::tenant_totals(&tenants, &jobs, &nodes);
        let held_instances: std::collections::HashSet<&str> = jobs
            .iter()
            .filter(|j| j.spec.mig_profile.is_some())
            .flat_map(|j| j.gpu_uuids.iter().map(String::as_str))
            .collect();

        self.job_utilization.clear();
        self.job_memory.clear();
        let node_name: HashMap<&str, &str> = nodes
            .iter()
            .map(|n| (n.id.as_str(), n.name.as_str()))
            .collect();
        let mut latest_job: HashMap<String, allot_store::JobSamplePoint> = HashMap::new();
        for p in store
            .job_samples(None, 10, now - chrono::Duration::minutes(2))
            .await?
        {
            latest_job.insert(p.job_id.clone(), p);
        }
        for j in jobs.iter().filter(|j| j.state == JobState::Running) {
            let Some(p) = latest_job.get(&j.id) else {
                continue;
            };
            let labels = RunningJobLabels {
                tenant: tenant_name
                    .get(j.tenant_id.as_str())
                    .copied()
                    .unwrap_or("unknown")
                    .to_owned(),
                job: j.id.clone(),
                node: j
                    .node_id
                    .as_deref()
                    .and_then(|n| node_name.get(n).copied())
                    .unwrap_or("unknown")
                    .to_owned(),
            };
            self.job_utilization
                .get_or_create(&labels)
                .set(p.utilization);
            self.job_memory
                .get_or_create(&labels)
                .set(i64::try_from(p.memory_used_bytes).unwrap_or(i64::MAX));
        }

        self.nodes.clear();
        self.gpus.clear();
        self.gpu_allocated_milli.clear();
        self.gpu_utilization.clear();
        self.gpu_link.clear();
        self.gpu_throttled.clear();
        self.gpu_ecc.clear();
        self.mig_instances.clear();
        // The latest sample of each GPU heard from in the last two minutes.
        let mut latest: HashMap<String, allot_store::SamplePoint> = HashMap::new();
        for p in store
            .gpu_samples(None, 10, now - chrono::Duration::minutes(2))
            .await?
        {
            latest.insert(p.gpu_uuid.clone(), p);
        }
        for n in &nodes {
            self.nodes
                .get_or_create(&NodeLabels {
                    node: n.name.clone(),
                    status: n.status(now).as_str().to_owned(),
                })
                .set(1);
            for g in &n.gpus {
                let health = g.health(n.drained_gpus.contains(&g.uuid));
                let labels = GpuLabels {
                    node: n.name.clone(),
                    gpu_uuid: g.uuid.clone(),
                    model: g.model.clone(),
                    health: health.to_owned(),
                };
                self.gpus.get_or_create(&labels).set(1);
                let allocated = g.holding(&jobs).held.milli_rounded();
                self.gpu_allocated_milli
                    .get_or_create(&labels)
                    .set(i64::try_from(allocated).unwrap_or(i64::MAX));
                if let Some(p) = latest.get(&g.uuid) {
                    self.gpu_utilization
                        .get_or_create(&UtilizationLabels {
                            node: n.name.clone(),
                            gpu_uuid: g.uuid.clone(),
                            model: g.model.clone(),
                        })
                        .set(p.utilization);
                    self.set_signals(&n.name, &g.uuid, p);
                }
                let board = allot_domain::mig::geometry(&g.model, Some(g.memory_bytes >> 20));
                for slot in g.mig.iter().flatten() {
                    let held_here = held_instances.contains(slot.uuid.as_str());
                    self.mig_instances
                        .get_or_create(&MigLabels {
                            node: n.name.clone(),
                            gpu_uuid: g.uuid.clone(),
                            profile: board
                                .and_then(|b| b.profile(slot.profile))
                                .map_or_else(|| slot.profile.to_string(), |p| p.name.to_owned()),
                            state: if held_here { "held" } else { "free" }.to_owned(),
                        })
                        .inc();
                }
            }
        }

        self.tenant_gpu_milli.clear();
        self.tenant_own_gpu_milli.clear();
        let milli =
            |p: allot_domain::GpuParts| i64::try_from(p.milli_rounded()).unwrap_or(i64::MAX);
        for t in &tenants {
            let f = totals.get(&t.id).copied().unwrap_or_default();
            let labels = TenantLabels {
                tenant: t.name.to_string(),
            };
            self.tenant_gpu_milli
                .get_or_create(&labels)
                .set(milli(f.total.held.gpu));
            self.tenant_own_gpu_milli
                .get_or_create(&labels)
                .set(milli(f.own.held.gpu));
        }

        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .map_err(|e| StoreError::Corrupt(format!("encoding metrics: {e}")))?;
        Ok(out)
    }
}
