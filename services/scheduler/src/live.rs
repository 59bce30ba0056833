//! The control plane's scheduling pass: the store's nodes, tenants and jobs in, the
//! engine's decisions out in the store's terms (node ids, GPU UUIDs, reasons).
//!
//! How the live cluster maps onto the engine's model:
//! - A node offers the CPU and memory its agent reported (unknown: not a constraint) and
//!   its GPUs of one model: the most common model among its healthy GPUs. A GPU that is
//!   unhealthy, of another model, or on a node whose lease lapsed offers nothing new: its
//!   capacity is what the jobs already there hold, so they stay accounted and nothing
//!   joins them. Jobs on such capacity are not reclaimed (that would free room that is not
//!   really there); moving them is fault migration's business.
//! - A cordoned node, a node whose agent says it is unavailable (low on disk), and a GPU
//!   an operator drained, offer nothing new either.
//! - A node that has missed heartbeats (see [`LiveScheduler::with_suspect_after`]), or
//!   whose assignment stream is not open (`Snapshot::reachable`), offers nothing new
//!   either, before its lease lapses.
//! - A tenant is a quota queue; its parent tenant is the queue's parent.
//! - A job holding capacity that reclaim is already stopping (`preempt_reason`) is treated
//!   as gone, so the pass decides what happens once it stops; a placement that needs its
//!   room waits (`AwaitingPreemption`) until its node reports it stopped. The jobs a pass
//!   preempts are such jobs at once.
//! - Memory is decided in MiB: requests round up, capacities down.
//! - A GPU in MIG mode is not in the engine's model at all: jobs asking for a MIG profile
//!   are placed on its instances by [`crate::mig::plan`], and nothing else runs there.

use std::collections::{HashMap, HashSet};

use allot_domain::{GPU_MILLI, Job as StoredJob, Node, NodeStatus, PendingReason, Tenant};
use chrono::{DateTime, Utc};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::admission::model_key;
use crate::engine::{self, Config, Decision, EngineError, Job, Running, World};
use crate::fair_share::PastUsage;
use crate::placement::{self, Choice, Cluster, NodeState, PlacementPolicy, Request};
use crate::quota::{Amounts, Limits, QueueSpec, QuotaError, QuotaTree};

mod mapping;
mod mig;
mod queue;

use mapping::{Mapped, engine_job, held_milli, mib_down, mib_up};
use mig::{mig_amounts, mig_decisions};
use queue::age_order;
pub use queue::{QueuePlace, queue_places};

const MIB: u64 = 1 << 20;

/// Policies the control plane can run: every placement policy. `fgd` is given the requests of
/// the jobs in each pass as its target workload; the others are given nothing.
pub const LIVE_POLICIES: [&str; 7] = placement::POLICIES;

/// What the control plane should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveDecision {
    Place {
        job_id: String,
        node_id: String,
        gpu_uuids: Vec<String>,
        /// The share of each GPU held (a dedicated job holds whole GPUs).
        held_gpu_milli: u32,
        borrowing: bool,
    },
    /// Place every replica of a gang (in rank order), all in one go.
    PlaceGang {
        gang_id: String,
        replicas: Vec<ReplicaPlacement>,
        held_gpu_milli: u32,
        borrowing: bool,
    },
    /// Stop the job (it runs on `node_id`) and requeue it.
    Preempt {
        job_id: String,
        node_id: String,
        reason: String,
    },
    Wait {
        job_id: String,
        reason: PendingReason,
    },
    /// Stop the job (it runs on `node_id`, on `gpu_uuids`) and requeue it to be placed
    /// elsewhere: its next attempt avoids those GPUs and asks for `share_milli` of one.
    Move {
        job_id: String,
        node_id: String,
        gpu_uuids: Vec<String>,
        share_milli: u32,
        reason: String,
    },
    /// Give a GPU in MIG mode this layout (profile id, start slice).
    Repartition {
        node_id: String,
        gpu_uuid: String,
        layout: Vec<(u32, u8)>,
    },
}

/// Where one replica of a gang goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPlacement {
    pub job_id: String,
    pub node_id: String,
    pub gpu_uuids: Vec<String>,
}

/// The engine's id for a stored job: a gang's replicas are one engine job, the gang.
fn engine_id(j: &StoredJob) -> &str {
    j.replica
        .as_ref()
        .map_or(j.id.as_str(), |r| r.gang_id.as_str())
}

/// Whether a node takes new work: ready, heard from lately, reachable, not cordoned, not
/// unavailable by its agent's word.
fn node_ready(
    n: &Node,
    now: DateTime<Utc>,
    suspect_after: Option<(chrono::Duration, chrono::Duration)>,
    reachable: Option<&std::collections::HashSet<String>>,
) -> bool {
    let silent = suspect_after.is_some_and(|(after, lease)| n.silent(now, after, lease));
    let unreachable = reachable.is_some_and(|r| !r.contains(&n.id));
    n.status(now) == NodeStatus::Ready && !silent && !unreachable && n.takes_work()
}

/// Whether a GPU of a ready node takes new work.
fn gpu_offered(n: &Node, g: &allot_domain::GpuDevice) -> bool {
    g.healthy && !g.degraded && !n.drained_gpus.contains(&g.uuid)
}

/// Everything a pass decides against, as the store holds it.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    pub nodes: &'a [Node],
    pub tenants: &'a [Tenant],
    /// Scheduled and running jobs.
    pub holding: &'a [StoredJob],
    /// Pending jobs.
    pub pending: &'a [StoredJob],
    pub now: DateTime<Utc>,
    /// Nodes that can be told about new work now (their assignment stream is open); `None`
    /// when every node can.
    pub reachable: Option<&'a std::collections::HashSet<String>>,
    /// What the sizer forecasts of running auto-sized jobs, by job id (a job not in it:
    /// its share is its forecast); `None` when nothing sizes jobs: auto-sized jobs are then
    /// placed as any share is, and never moved.
    pub forecasts: Option<&'a HashMap<String, crate::engine::Sizing>>,
}

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("unknown placement policy `{0}` (one of {list})", list = LIVE_POLICIES.join(", "))]
    UnknownPolicy(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The pass's placement policy and generator, kept from pass to pass (Allot's policy learns
/// the workload mix from what it places).
pub struct LiveScheduler {
    name: String,
    /// `None` for `fgd`, which is built per pass from that pass's jobs.
    policy: Option<Box<dyn PlacementPolicy>>,
    /// The seed each pass's generator is drawn from, with the pass's number.
    seed: u64,
    rng: StdRng,
    config: Config,
    /// A node silent this long (no heartbeat) gets no new work, though its lease (and so
    /// its jobs) still stand: work placed there now would likely be disrupted again.
    suspect_after: Option<(chrono::Duration, chrono::Duration)>,
    /// The last job the policy was told arrived, by (submitted, id): each job arrives
    /// once, in that order, when a pass first weighs it (a job waiting for many passes is
    /// one arrival, and a requeued one does not arrive again). A job weighed only after a
    /// later-submitted one was told (held back meanwhile) is not told at all.
    told: Option<(DateTime<Utc>, String)>,
    /// Passes decided so far (each draws its generator from the seed and this).
    passes: u64,
    /// Tenants' decayed past GPU use, when fair share over time is on.
    past: Option<PastUsage>,
}

/// What a [`LiveScheduler`] carries from pass to pass besides the fair-share history: what
/// a new leader takes up from the database to decide as the last one would have.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SchedulerMemory {
    /// The placement policy that learned it.
    pub policy: String,
    pub passes: u64,
    pub told: Option<(DateTime<Utc>, String)>,
    pub learned: Option<placement::allot::Learned>,
}

/// On the live path the learned workload mix fades: an arrival this many arrivals old
/// weighs half as much as a new one (some days of a busy fleet's submissions).
pub const LIVE_MIX_HALF_LIFE: f64 = 5_000.0;

impl std::fmt::Debug for LiveScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveScheduler")
            .field("policy", &self.name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The tenants as a quota tree (memory in MiB).
pub fn quota_tree(tenants: &[Tenant]) -> Result<QuotaTree, QuotaError> {
    let specs = tenants
        .iter()
        .map(|t| {
            let g = &t.quota.guaranteed;
            let l = &t.quota.limit;
            QueueSpec {
                id: t.id.clone(),
                name: t.name.to_string(),
                parent: t.parent_id.clone(),
                guaranteed: Amounts::new(
                    g.gpu_milli,
                    g.cpu_milli,
                    u64::from(mib_down(g.memory_bytes)),
                )
                .with_gpu_memory(u64::from(mib_down(g.gpu_memory_bytes))),
                limit: Limits::new(
                    l.gpu_milli,
                    l.cpu_milli,
                    l.memory_bytes.map(|b| u64::from(mib_down(b))),
                    l.gpu_memory_bytes.map(|b| u64::from(mib_down(b))),
                ),
                weight: t.quota.weight,
                min_isolation: t.quota.min_isolation,
            }
        })
        .collect();
    QuotaTree::new(specs)
}

impl LiveScheduler {
    /// Orders tenants for spare capacity by their decayed past GPU use too (half-life
    /// `half_life`), beside what they hold now. The history is recorded by every pass; the
    /// server saves it ([`Self::past_usage`]) and takes it up again when it starts
    /// ([`Self::restore_past_usage`]).
    pub fn with_fair_share_half_life(mut self, half_life: std::time::Duration) -> Self {
        self.past = Some(PastUsage::new(half_life));
        self
    }

    /// The decayed past use recorded so far, when fair share over time is on.
    pub fn past_usage(&self) -> Option<&PastUsage> {
        self.past.as_ref()
    }

    /// Takes up a saved history (see [`PastUsage::restore`]); nothing without fair share
    /// over time.
    pub fn restore_past_usage(
        &mut self,
        by_queue: std::collections::HashMap<String, f64>,
        recorded_at: f64,
        now: f64,
        max_gap: f64,
    ) {
        if let Some(past) = &mut self.past {
            past.restore(by_queue, recorded_at, now, max_gap);
        }
    }

    pub fn new(policy: &str, seed: u64, config: Config) -> Result<Self, LiveError> {
        if !LIVE_POLICIES.contains(&policy) {
            return Err(LiveError::UnknownPolicy(policy.to_owned()));
        }
        let empty = Cluster::new(&[]);
        let built: Option<Box<dyn PlacementPolicy>> = match policy {
            "fgd" => None,
            "allot" => Some(Box::new(
                placement::allot::Allot::new(&empty).fading(LIVE_MIX_HALF_LIFE),
            )),
            other => Some(
                placement::policy(other, &empty, &[])
                    .ok_or_else(|| LiveError::UnknownPolicy(other.to_owned()))?,
            ),
        };
        Ok(Self {
            name: policy.to_owned(),
            policy: built,
            seed,
            rng: StdRng::seed_from_u64(seed),
            config,
            suspect_after: None,
            told: None,
            passes: 0,
            past: None,
        })
    }

    /// The workload mix the policy has learned (empty for policies that learn none).
    pub fn learned_mix(&self) -> Vec<placement::policies::RequestClass> {
        self.policy
            .as_ref()
            .map(|p| p.learned_mix())
            .unwrap_or_default()
    }

    /// Offers no new work on nodes that have not heartbeated for `after`, stretched for a
    /// node whose last heartbeat was granted more than the configured `lease`
    /// ([`allot_domain::Node::silent`]).
    pub fn with_suspect_after(
        mut self,
        after: std::time::Duration,
        lease: std::time::Duration,
    ) -> Self {
        self.suspect_after = chrono::Duration::from_std(after)
            .ok()
            .zip(chrono::Duration::from_std(lease).ok());
        self
    }

    pub fn policy_name(&self) -> &str {
        &self.name
    }

    /// What this scheduler has learned and counted, for another to carry on from
    /// ([`Self::take_up`]): the policy's workload mix, the last job it was told of, and how
    /// many passes it decided. (The fair-share history is kept apart: see
    /// [`Self::past_usage`].)
    pub fn memory(&self) -> SchedulerMemory {
        SchedulerMemory {
            policy: self.name.clone(),
            passes: self.passes,
            told: self.told.clone(),
            learned: self.policy.as_ref().and_then(|p| p.learned()),
        }
    }

    /// Carries on from another scheduler's [`Self::memory`] (a new leader from the last
    /// one's): it decides from here on as that one would have. What another policy learned
    /// is not taken up.
    pub fn take_up(&mut self, memory: SchedulerMemory) {
        self.passes = memory.passes;
        self.told = memory.told;
        if memory.policy == self.name
            && let (Some(p), Some(l)) = (self.policy.as_mut(), memory.learned)
        {
            p.take_up(l);
        }
    }

    /// One pass over `snap`.
    pub fn decide(&mut self, snap: &Snapshot<'_>) -> Result<Vec<LiveDecision>, LiveError> {
        // Each pass's generator is drawn from the seed and the pass's number, so a
        // scheduler that takes up another's memory draws what it would have drawn.
        self.passes += 1;
        self.rng =
            StdRng::seed_from_u64(self.seed ^ self.passes.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        // Every pass counts what is held, whether or not anything waits.
        if let Some(past) = &mut self.past {
            past.record(
                snap.now.timestamp_millis() as f64 / 1e3,
                snap.holding
                    .iter()
                    .map(|j| (j.tenant_id.as_str(), j.gpu_equivalents())),
            );
        }
        // Nothing waiting still decides: a tenant above a hard limit is brought back under.
        let tree = match quota_tree(snap.tenants) {
            Ok(tree) => tree,
            // Nothing can be decided fairly against quotas that do not nest: every pending
            // job says so (running ones keep running) until an admin mends them.
            Err(e) => {
                return Ok(snap
                    .pending
                    .iter()
                    .map(|j| LiveDecision::Wait {
                        job_id: j.id.clone(),
                        reason: PendingReason {
                            code: "InvalidQuotaTree".into(),
                            message: format!(
                                "scheduling is paused until a platform admin fixes the quotas: {e}"
                            ),
                        },
                    })
                    .collect());
            }
        };
        let all_holding: Vec<&StoredJob> = snap.holding.iter().collect();
        let mapped = Mapped::new(
            snap.nodes,
            &all_holding,
            snap.now,
            self.suspect_after,
            snap.reachable,
        );
        // The engine's age order: work that already ran and was interrupted (requeued after
        // a lost node or a preemption) first, then by submission.
        let mut order: Vec<&StoredJob> = snap.holding.iter().chain(snap.pending).collect();
        order.sort_by(|a, b| age_order(a, b));
        let seq: HashMap<&str, u64> = order
            .iter()
            .enumerate()
            .map(|(i, j)| (j.id.as_str(), i as u64))
            .collect();
        let seq_of = |j: &StoredJob| seq.get(j.id.as_str()).copied().unwrap_or(u64::MAX);

        // Leaving: jobs reclaim is already stopping, and what they hold. A gang being
        // stopped leaves whole.
        let stopping_gangs: HashSet<&str> = snap
            .holding
            .iter()
            .filter(|j| j.replica.is_some() && j.preempt_reason.is_some())
            .map(engine_id)
            .collect();
        let mut leaving: Vec<(&StoredJob, Request, Choice)> = Vec::new();
        let mut running: Vec<Running> = Vec::new();
        // Each holding gang's replicas, in rank order, with their nodes (how a preemption
        // maps back), and where in `running` the gang is.
        let mut members: HashMap<&str, Vec<(&StoredJob, usize)>> = HashMap::new();
        let mut gang_at: HashMap<&str, usize> = HashMap::new();
        let mut by_rank: Vec<&StoredJob> = snap.holding.iter().collect();
        by_rank.sort_by_key(|j| j.replica.as_ref().map_or(0, |r| r.rank));
        for j in by_rank {
            let Ok(request) = mapped.request(j, held_milli(j)) else {
                continue;
            };
            let Some(choice) = mapped.choice(j) else {
                continue;
            };
            let id = engine_id(j);
            if j.preempt_reason.is_some() || stopping_gangs.contains(id) {
                leaving.push((j, request, choice));
                continue;
            }
            // Capacity that is not really there is not reclaimed.
            let usable = mapped.all_usable(&choice);
            if j.replica.is_some() {
                members.entry(id).or_default().push((j, choice.node));
                if let Some(&i) = gang_at.get(id) {
                    let r: &mut Running = &mut running[i];
                    r.job.replicas += 1;
                    r.job.preemptible &= usable;
                    r.placements.push(choice);
                    continue;
                }
                gang_at.insert(id, running.len());
            }
            let whole = mapped
                .cluster
                .gpu_memory_mib
                .get(choice.node)
                .copied()
                .unwrap_or(0);
            let mut job = engine_job(j, request, seq_of(j), whole);
            job.id = id.to_owned();
            job.preemptible &= usable;
            if job.sizing.is_some()
                && let Some(f) = snap.forecasts.and_then(|f| f.get(&j.id))
            {
                job.sizing = Some(crate::engine::Sizing {
                    wanted_milli: f.wanted_milli.max(request.gpu_milli),
                    settled: f.settled,
                });
            }
            let started = j.started_at.or(j.scheduled_at).unwrap_or(j.created_at);
            running.push(Running {
                job,
                placements: vec![choice],
                started_at: started.timestamp(),
            });
        }

        let mut decisions = Vec::new();
        let mut pending = Vec::new();
        let mut mig_pending = Vec::new();
        let ready = snap
            .nodes
            .iter()
            .filter(|n| n.status(snap.now) == allot_domain::NodeStatus::Ready)
            .count();
        let confined: Vec<&Node> = snap
            .nodes
            .iter()
            .filter(|n| n.confines_jobs() && n.status(snap.now) == allot_domain::NodeStatus::Ready)
            .collect();
        // A gang's pending replicas, in rank order: placed as one job (its replica 0's
        // record speaks for it), and only once every replica waits at the same attempt.
        let mut gangs: HashMap<&str, Vec<&StoredJob>> = HashMap::new();
        for j in snap.pending.iter().filter(|j| j.replica.is_some()) {
            gangs.entry(engine_id(j)).or_default().push(j);
        }
        for g in gangs.values_mut() {
            g.sort_by_key(|j| j.replica.as_ref().map_or(0, |r| r.rank));
        }
        // Node labels as the engine sees them, once per label a gang packs by.
        let mut packs: HashMap<(String, bool), std::sync::Arc<crate::engine::Pack>> =
            HashMap::new();
        for j in snap.pending {
            let gang = gangs.get(engine_id(j)).filter(|_| j.replica.is_some());
            let mut retry_at = j.retry_at;
            if let Some(g) = gang {
                if g[0].id != j.id {
                    continue;
                }
                let size = j.spec.replicas as usize;
                let whole = g.len() == size
                    && g.iter().all(|m| m.attempt == j.attempt)
                    && !members.contains_key(engine_id(j))
                    && !stopping_gangs.contains(engine_id(j));
                if !whole {
                    decisions.push(LiveDecision::Wait {
                        job_id: j.id.clone(),
                        reason: PendingReason {
                            code: "GangStopping".into(),
                            message: format!(
                                "waiting for {} of the gang's {size} replicas to stop before \
                                 attempt {} starts",
                                size.saturating_sub(g.len()).max(1),
                                j.attempt
                            ),
                        },
                    });
                    continue;
                }
                retry_at = g.iter().filter_map(|m| m.retry_at).max();
            }
            if let Some(at) = retry_at.filter(|at| *at > snap.now) {
                decisions.push(LiveDecision::Wait {
                    job_id: j.id.clone(),
                    reason: PendingReason {
                        code: "RetryBackoff".into(),
                        message: format!(
                            "retrying after a failure ({} of {} retries used); not before {}",
                            j.failures,
                            j.spec.max_retries,
                            at.format("%H:%M:%S%.3f UTC")
                        ),
                    },
                });
                continue;
            }
            if let Some(profile) = j.spec.mig_profile.as_deref() {
                mig_pending.push(crate::mig::MigJob {
                    id: &j.id,
                    tenant_id: &j.tenant_id,
                    profile,
                    priority: j.spec.priority,
                    seq: seq_of(j),
                    held: mig_amounts(j),
                    image: j.spec.image.is_some(),
                });
                continue;
            }
            let share = if j.spec.gpus == 0 {
                0
            } else {
                j.spec.gpu_milli.unwrap_or(GPU_MILLI)
            };
            // A job from an image runs only on nodes that run containers, one without only
            // on nodes that run processes.
            let with_image = j.spec.image.is_some();
            let ready_nodes = || {
                snap.nodes
                    .iter()
                    .filter(|n| n.status(snap.now) == allot_domain::NodeStatus::Ready)
            };
            if ready > 0 && !ready_nodes().any(|n| n.runs(with_image)) {
                let (code, message) = if with_image {
                    (
                        "NoContainerNode",
                        format!(
                            "the job runs an image, and none of the {ready} ready nodes runs jobs \
                             in containers (agent --runtime oci)"
                        ),
                    )
                } else {
                    (
                        "ImageRequired",
                        format!(
                            "the job names no image, and every one of the {ready} ready nodes \
                             runs jobs in containers (agent --runtime oci): give it an image"
                        ),
                    )
                };
                decisions.push(LiveDecision::Wait {
                    job_id: j.id.clone(),
                    reason: PendingReason {
                        code: code.into(),
                        message,
                    },
                });
                continue;
            }
            // A tenant whose jobs must run confined: only on nodes that run containers.
            let confined_only = snap
                .tenants
                .iter()
                .any(|t| t.id == j.tenant_id && t.policy.require_confinement);
            if confined_only && confined.is_empty() {
                decisions.push(LiveDecision::Wait {
                    job_id: j.id.clone(),
                    reason: PendingReason {
                        code: "ConfinementRequired".into(),
                        message: format!(
                            "the tenant's jobs must run confined, and none of the {} ready nodes \
                             runs jobs in containers (agent --runtime oci)",
                            ready
                        ),
                    },
                });
                continue;
            }
            match mapped.request(j, share) {
                Ok(r) => {
                    // Not placed yet: counted at the largest GPU it could be given.
                    let whole = mapped
                        .cluster
                        .nodes
                        .iter()
                        .zip(&mapped.cluster.gpu_memory_mib)
                        .filter(|(n, _)| r.models & (1 << n.model.min(63)) != 0)
                        .map(|(_, &mib)| mib)
                        .max()
                        .unwrap_or(0);
                    let mut job = engine_job(j, r, seq_of(j), whole);
                    job.avoid = mapped.avoidance(j, snap.now);
                    if let Some(g) = gang {
                        job.id = engine_id(j).to_owned();
                        job.replicas = j.spec.replicas;
                        job.pack = j.spec.pack.as_ref().map(|p| {
                            packs
                                .entry((p.label.clone(), p.required))
                                .or_insert_with(|| {
                                    std::sync::Arc::new(pack_of(snap.nodes, &mapped, p))
                                })
                                .clone()
                        });
                        for m in &g[1..] {
                            let more = mapped.avoidance(m, snap.now);
                            job.avoid.nodes.extend(more.nodes);
                            job.avoid.gpus.extend(more.gpus);
                        }
                    }
                    // A job that asks for nothing fits anywhere, even on a node that offers
                    // nothing new (cordoned, not ready): keep it to the ones that offer.
                    if j.spec.gpus == 0 && j.spec.cpu_milli == 0 && j.spec.memory_bytes == 0 {
                        job.avoid.nodes.extend(
                            mapped
                                .offers
                                .iter()
                                .enumerate()
                                .filter(|(_, offers)| !**offers)
                                .map(|(i, _)| i),
                        );
                    }
                    if confined_only {
                        job.avoid.nodes.extend(
                            snap.nodes
                                .iter()
                                .filter(|n| !n.confines_jobs())
                                .filter_map(|n| mapped.by_node.get(&n.id).copied()),
                        );
                    }
                    job.avoid.nodes.extend(
                        snap.nodes
                            .iter()
                            .filter(|n| !n.runs(with_image))
                            .filter_map(|n| mapped.by_node.get(&n.id).copied()),
                    );
                    pending.push(job);
                }
                Err(reason) => decisions.push(LiveDecision::Wait {
                    job_id: j.id.clone(),
                    reason,
                }),
            }
        }
        // MIG instances held (not being stopped) count in their tenants' quotas, beside what
        // the engine places; so do the ones placed this pass.
        let mut outside: Vec<(String, Amounts)> = snap
            .holding
            .iter()
            .filter(|j| j.spec.mig_profile.is_some() && j.preempt_reason.is_none())
            .map(|j| (j.tenant_id.clone(), mig_amounts(j)))
            .collect();
        if !mig_pending.is_empty() {
            let mut usage = crate::quota::Usage::new(&tree);
            for (queue, a) in running
                .iter()
                .map(|r| (&r.job.queue, r.job.amounts()))
                .chain(outside.iter().map(|(q, a)| (q, *a)))
            {
                if let Some(q) = tree.find(queue) {
                    usage.take(&tree, q, &a);
                }
            }
            let mut quota = crate::mig::MigQuota { tree: &tree, usage };
            let mig = mig_decisions(snap, self.suspect_after, &mig_pending, Some(&mut quota));
            for d in &mig {
                if let LiveDecision::Place { job_id, .. } = d
                    && let Some(j) = snap.pending.iter().find(|j| j.id == *job_id)
                {
                    outside.push((j.tenant_id.clone(), mig_amounts(j)));
                }
            }
            decisions.extend(mig);
        }
        if !mapped.offers.iter().any(|&r| r) {
            decisions.extend(pending.iter().map(|j| LiveDecision::Wait {
                job_id: j.id.clone(),
                reason: PendingReason {
                    code: "NoReadyNodes".into(),
                    message: "no node is ready (none registered, or all leases expired)".into(),
                },
            }));
            return Ok(whole_gangs(decisions, &gangs));
        }

        let mut fgd;
        let policy: &mut dyn PlacementPolicy = match self.policy.as_mut() {
            Some(p) => {
                p.reset(&mapped.cluster);
                // Each job arrives once, in the order submitted (each replica of a gang is
                // a request).
                let submitted: HashMap<&str, DateTime<Utc>> = snap
                    .pending
                    .iter()
                    .map(|j| (engine_id(j), j.created_at))
                    .collect();
                let mut new: Vec<(DateTime<Utc>, &Job)> = pending
                    .iter()
                    .filter_map(|j| Some((*submitted.get(j.id.as_str())?, j)))
                    .filter(|(at, j)| {
                        self.told
                            .as_ref()
                            .is_none_or(|(t, id)| (*at, j.id.as_str()) > (*t, id.as_str()))
                    })
                    .collect();
                new.sort_by(|a, b| (a.0, &a.1.id).cmp(&(b.0, &b.1.id)));
                for (_, j) in &new {
                    for _ in 0..j.replicas {
                        p.arrived(&mapped.cluster, &j.request);
                    }
                }
                if let Some((at, j)) = new.last() {
                    self.told = Some((*at, j.id.clone()));
                }
                p.as_mut()
            }
            None => {
                let requests: Vec<Request> = pending
                    .iter()
                    .map(|j| j.request)
                    .chain(running.iter().map(|r| r.job.request))
                    .collect();
                fgd = placement::policies::Fgd::new(&mapped.cluster, &requests);
                &mut fgd
            }
        };
        // Without the sizer's forecasts, auto-sized jobs are placed as any share is.
        if snap.forecasts.is_none() {
            for j in pending
                .iter_mut()
                .chain(running.iter_mut().map(|r| &mut r.job))
            {
                j.sizing = None;
            }
        }
        let world = World {
            cluster: &mapped.cluster,
            tree: &tree,
            running: &running,
            now: snap.now.timestamp(),
            config: self.config,
            past_usage: self.past.as_ref().map(PastUsage::by_queue),
            outside: &outside,
        };
        let engine_decisions = engine::schedule(world, &pending, policy, &mut self.rng)?;

        // What is really held right now: everything, the leaving jobs and this pass's
        // victims included. A placement is made only where it fits on top of that.
        let mut actual = mapped.cluster.nodes.clone();
        for r in &running {
            for c in &r.placements {
                actual[c.node].place(&r.job.request, &c.gpus);
            }
        }
        for (_, request, c) in &leaving {
            actual[c.node].place(request, &c.gpus);
        }
        // Engine GPU index to real one, per node: identity until a placement is moved into
        // one NVLink domain.
        let mut perm: Vec<Vec<u8>> = actual
            .iter()
            .map(|n| {
                (0..n.gpu_free.len())
                    .map(|g| u8::try_from(g).unwrap_or(u8::MAX))
                    .collect()
            })
            .collect();
        let mut stopping: Vec<usize> = leaving.iter().map(|(_, _, c)| c.node).collect();
        for d in &engine_decisions {
            if let Decision::Preempt { job_id, .. } | Decision::Move { job_id, .. } = d
                && let Some(r) = running.iter().find(|r| r.job.id == *job_id)
            {
                stopping.extend(r.placements.iter().map(|c| c.node));
            }
        }
        for d in engine_decisions {
            match d {
                Decision::Place {
                    job_id,
                    request,
                    placements,
                    borrowing,
                } if gangs.contains_key(job_id.as_str()) => {
                    let g = &gangs[job_id.as_str()];
                    // Every replica where it was put (in one NVLink domain where it can
                    // be), on top of what is really held; else the gang waits whole for the
                    // preempted jobs to stop.
                    let nodes: Vec<usize> = placements.iter().map(|c| c.node).collect();
                    let before: Vec<NodeState> = nodes.iter().map(|&n| actual[n].clone()).collect();
                    let mut fits = placements.len() == g.len();
                    let mut placed: Vec<Choice> = Vec::with_capacity(placements.len());
                    for c in placements {
                        if !fits {
                            break;
                        }
                        let c = mapped.within_nvlink(&mut perm, &actual, c, &request);
                        fits = fits_exactly(&actual[c.node], &request, &c.gpus);
                        if fits {
                            actual[c.node].place(&request, &c.gpus);
                            placed.push(c);
                        }
                    }
                    if !fits {
                        for (&n, b) in nodes.iter().zip(before).rev() {
                            actual[n] = b;
                        }
                        let waiting_on = nodes.iter().filter(|n| stopping.contains(n)).count();
                        decisions.push(LiveDecision::Wait {
                            job_id,
                            reason: PendingReason {
                                code: "AwaitingPreemption".into(),
                                message: format!(
                                    "reclaiming room for the gang: waiting for preempted jobs \
                                     to stop on {waiting_on} of its nodes"
                                ),
                            },
                        });
                        continue;
                    }
                    decisions.push(LiveDecision::PlaceGang {
                        gang_id: job_id,
                        replicas: g
                            .iter()
                            .zip(&placed)
                            .map(|(m, c)| ReplicaPlacement {
                                job_id: m.id.clone(),
                                node_id: mapped.nodes[c.node].0.clone(),
                                gpu_uuids: mapped.uuids(c),
                            })
                            .collect(),
                        held_gpu_milli: request.gpu_milli,
                        borrowing,
                    });
                }
                Decision::Place {
                    job_id,
                    request,
                    placements,
                    borrowing,
                } => {
                    let Some(c) = placements.into_iter().next() else {
                        continue;
                    };
                    let c = mapped.within_nvlink(&mut perm, &actual, c, &request);
                    let node = &mut actual[c.node];
                    if !fits_exactly(node, &request, &c.gpus) {
                        let waiting_on = stopping.iter().filter(|&&n| n == c.node).count();
                        decisions.push(LiveDecision::Wait {
                            job_id,
                            reason: PendingReason {
                                code: "AwaitingPreemption".into(),
                                message: format!(
                                    "reclaiming room on node {}: waiting for {} preempted job{} there to stop",
                                    mapped.nodes[c.node].1,
                                    waiting_on,
                                    if waiting_on == 1 { "" } else { "s" }
                                ),
                            },
                        });
                        continue;
                    }
                    node.place(&request, &c.gpus);
                    decisions.push(LiveDecision::Place {
                        job_id,
                        node_id: mapped.nodes[c.node].0.clone(),
                        gpu_uuids: mapped.uuids(&c),
                        held_gpu_milli: request.gpu_milli,
                        borrowing,
                    });
                }
                Decision::Preempt { job_id, reason, .. }
                    if members.contains_key(job_id.as_str()) =>
                {
                    for (m, node) in &members[job_id.as_str()] {
                        decisions.push(LiveDecision::Preempt {
                            job_id: m.id.clone(),
                            node_id: mapped.nodes[*node].0.clone(),
                            reason: reason.clone(),
                        });
                    }
                }
                Decision::Preempt { job_id, reason, .. } => {
                    let node_id = running
                        .iter()
                        .find(|r| r.job.id == job_id)
                        .and_then(|r| r.placements.first())
                        .map(|c| mapped.nodes[c.node].0.clone())
                        .unwrap_or_default();
                    decisions.push(LiveDecision::Preempt {
                        job_id,
                        node_id,
                        reason,
                    });
                }
                Decision::Wait { job_id, reason } => {
                    decisions.push(LiveDecision::Wait { job_id, reason });
                }
                Decision::Move {
                    job_id,
                    from,
                    share_milli,
                    reason,
                } => {
                    decisions.push(LiveDecision::Move {
                        job_id,
                        node_id: mapped.nodes[from.node].0.clone(),
                        gpu_uuids: mapped.uuids(&from),
                        share_milli,
                        reason,
                    });
                }
            }
        }
        Ok(whole_gangs(decisions, &gangs))
    }
}

/// Decisions with each wait of a gang's replica 0 said of every replica waiting.
fn whole_gangs(
    decisions: Vec<LiveDecision>,
    gangs: &HashMap<&str, Vec<&StoredJob>>,
) -> Vec<LiveDecision> {
    let mut out = Vec::with_capacity(decisions.len());
    for d in decisions {
        match d {
            LiveDecision::Wait { job_id, reason } => {
                let rest = gangs
                    .get(job_id.as_str())
                    .filter(|g| g[0].id == job_id)
                    .map(|g| &g[1..])
                    .unwrap_or_default();
                for m in rest {
                    out.push(LiveDecision::Wait {
                        job_id: m.id.clone(),
                        reason: reason.clone(),
                    });
                }
                out.push(LiveDecision::Wait { job_id, reason });
            }
            other => out.push(other),
        }
    }
    out
}

/// The engine's view of label `p.label`: each mapped node's value.
fn pack_of(nodes: &[Node], mapped: &Mapped, p: &allot_domain::Pack) -> crate::engine::Pack {
    let mut values: Vec<String> = Vec::new();
    let mut of_node = vec![None; mapped.nodes.len()];
    for n in nodes {
        let (Some(&i), Some(v)) = (mapped.by_node.get(&n.id), n.labels.get(&p.label)) else {
            continue;
        };
        let at = values.iter().position(|x| x == v).unwrap_or_else(|| {
            values.push(v.clone());
            values.len() - 1
        });
        of_node[i] = u32::try_from(at).ok();
    }
    crate::engine::Pack {
        label: p.label.clone(),
        of_node,
        values,
        required: p.required,
    }
}

/// Whether `r` fits on exactly `gpus` of `n`, CPU and memory included.
fn fits_exactly(n: &NodeState, r: &Request, gpus: &[u8]) -> bool {
    n.cpu_free >= r.cpu_milli
        && n.memory_free >= r.memory_mib
        && gpus.iter().all(|&g| {
            n.gpu_free
                .get(usize::from(g))
                .is_some_and(|&free| free >= r.gpu_milli)
        })
}

#[cfg(test)]
mod tests;
