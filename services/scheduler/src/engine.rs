//! One scheduling pass that decides quotas and placement together: pending jobs in fair
//! order, each placed by the placement policy if its quota chain allows, gangs all or none,
//! and jobs within their guarantee reclaiming capacity that others borrowed by preempting
//! them, under isolation constraints ([`Isolation`]). Pure: cluster, quotas, running and
//! pending jobs in; decisions out.
//!
//! Order: jobs that stay within their tenant's guarantee first (guaranteed capacity before
//! borrowed), then higher priority, then the tenant furthest below its fair share of spare
//! capacity (dominant resource over the guarantee, divided by its weight), then the oldest.
//!
//! Reclaim takes only from jobs that are preemptible, have run at least the minimum
//! runtime, and belong to a tenant holding more than its guarantee of what they use; it
//! takes the lowest priority first, then the tenant most over its fair share, then the
//! newest, and never takes a tenant (or its parents) below its guarantee. It preempts only
//! on the node where the freed room lets the job fit, choosing the node that needs the
//! fewest victims.

use std::cmp::Ordering;
use std::collections::HashMap;

use allot_domain::PendingReason;
use rand::rngs::StdRng;

use crate::placement::{Choice, Cluster, NodeState, PlacementPolicy, Request};
use crate::quota::{Amounts, QuotaTree, Resource, Usage};

mod best_effort;
mod forecast;
mod gangs;
mod isolation;
mod reclaim;

pub use isolation::{GpuLimits, Isolation, WorkloadClass};
use isolation::{MemoryNeed, Occupancy, Tenancy, held_request};

/// A job as the pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: String,
    /// The quota queue (tenant or team) it counts against.
    pub queue: String,
    /// What each replica asks for.
    pub request: Request,
    /// Replicas of a gang: all are placed in one pass, or none. At least 1.
    pub replicas: u32,
    pub priority: i32,
    pub preemptible: bool,
    /// Submission order: lower is older.
    pub seq: u64,
    /// GPU memory each GPU must have (whole GPUs), or that the job holds on the GPU it
    /// shares; 0 when not asked.
    pub gpu_memory_mib: u32,
    /// For quotas, the GPU memory each of its whole GPUs holds: all of the GPU's (of the
    /// node it runs on; for a pending job, the largest GPU it could be given). 0: the asked
    /// `gpu_memory_mib` (a share holds what it asked for).
    pub whole_gpu_memory_mib: u32,
    /// The isolation asked for; `None` takes the workload class's default.
    pub isolation: Option<Isolation>,
    pub class: Option<WorkloadClass>,
    /// Nodes and GPUs it must not be placed on now (anti-affinity after a fault there).
    pub avoid: Avoidance,
    /// For a gang: the node label whose one value all its replicas share.
    pub pack: Option<std::sync::Arc<Pack>>,
    /// Best-effort work (`allot_domain::GpuCompute::BestEffort`): it holds the least share
    /// of one GPU, is placed on the GPU with the fewest best-effort jobs and the most
    /// compute free (so that it spreads over what others leave), and any job that is not
    /// best-effort preempts it where that makes room, whatever either's tenant holds.
    pub best_effort: bool,
    /// An auto-sized job (`--gpus auto`): placed and moved by its forecast
    /// ([`forecast`]); `None` for a job whose share its owner chose.
    pub sizing: Option<Sizing>,
}

/// What the sizer forecasts an auto-sized job needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// The share of its GPU it would hold if room allowed (its forecast demand with the
    /// sizer's headroom): at least its share, more when a growth found no room.
    pub wanted_milli: u32,
    /// Whether the forecast rests on a whole window of what it used since it last started
    /// or changed (a job moved or resized a moment ago is not moved for consolidation).
    pub settled: bool,
}

/// A gang packed within one value of a node label (`rack`, `spine`): every replica on
/// nodes of one value, as a requirement, or as a preference (else anywhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    /// The label's name, as the reasons say it.
    pub label: String,
    /// Each node's value, as an index into `values` (None: unlabeled).
    pub of_node: Vec<Option<u32>>,
    pub values: Vec<String>,
    pub required: bool,
}

/// Where a job must not go: whole nodes, or single GPUs (node, GPU index).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Avoidance {
    pub nodes: Vec<usize>,
    pub gpus: Vec<(usize, u8)>,
}

/// Who a reclaim is for: its queue, whether it is within its guarantee, and whether it is
/// best-effort itself.
#[derive(Debug, Clone, Copy)]
struct Claim {
    queue: usize,
    within: bool,
    best_effort: bool,
}

impl Claim {
    /// Whether running `r` gives its place up to this claim whatever its tenant holds:
    /// best-effort work, to a job that is not.
    fn gives_way(self, r: &Running) -> bool {
        r.job.best_effort && !self.best_effort
    }
}

impl Avoidance {
    /// Whether `c` keeps clear of everything avoided.
    pub fn allows(&self, c: &Choice) -> bool {
        !self.nodes.contains(&c.node) && !c.gpus.iter().any(|g| self.gpus.contains(&(c.node, *g)))
    }
}

impl Job {
    /// What one replica holds: a whole GPU all of its memory, a share what it asked for.
    pub fn replica_amounts(&self) -> Amounts {
        let per_gpu = if self.request.gpu_milli >= crate::placement::GPU_MILLI
            && self.whole_gpu_memory_mib > 0
        {
            self.whole_gpu_memory_mib
        } else {
            self.gpu_memory_mib
        };
        Amounts::new(
            self.request.gpu_total(),
            u64::from(self.request.cpu_milli),
            u64::from(self.request.memory_mib),
        )
        .with_gpu_memory(u64::from(self.request.num_gpu) * u64::from(per_gpu))
    }

    /// What one placement holds, as far as isolation is concerned.
    fn tenancy(&self, q: usize, level: Isolation) -> Tenancy {
        Tenancy {
            q,
            level,
            shared_mib: if self.request.is_shared() {
                self.gpu_memory_mib
            } else {
                0
            },
            best_effort: self.best_effort,
            wanted_extra_milli: self
                .sizing
                .map_or(0, |s| s.wanted_milli.saturating_sub(self.request.gpu_milli)),
        }
    }

    /// What all replicas hold.
    pub fn amounts(&self) -> Amounts {
        let one = self.replica_amounts();
        Amounts(one.0.map(|x| x * u64::from(self.replicas.max(1))))
    }
}

/// A job holding capacity: one placement per replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub job: Job,
    pub placements: Vec<Choice>,
    /// Unix seconds.
    pub started_at: i64,
}

#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// A job runs at least this long before reclaim may preempt it.
    pub min_runtime_secs: i64,
    pub gpu_limits: GpuLimits,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Place {
        job_id: String,
        /// What each replica holds (a dedicated job holds whole GPUs): what a running job's
        /// `request` is from now on.
        request: Request,
        placements: Vec<Choice>,
        /// Placed (partly) on capacity above its tenant's guarantee: reclaim may take it.
        borrowing: bool,
    },
    Preempt {
        job_id: String,
        /// The job the capacity goes to; none when the job is stopped to bring its tenant
        /// back under a hard limit.
        for_job: Option<String>,
        reason: String,
    },
    Wait {
        job_id: String,
        reason: PendingReason,
    },
    /// Stop a running job where it is, to be placed again elsewhere ([`forecast`]): an
    /// auto-sized job whose GPU's forecast outgrew it or that is being emptied, or
    /// best-effort work giving way there. Its next attempt avoids `from` and asks for
    /// `share_milli` of a GPU.
    Move {
        job_id: String,
        from: Choice,
        share_milli: u32,
        reason: String,
    },
}

/// A job preempted by a reclaim, and why.
type Victim = (String, String);

/// The pass's working state.
struct Pass<'a> {
    tree: &'a QuotaTree,
    cluster: Cluster,
    usage: Usage,
    occupancy: Occupancy,
    /// Shared GPUs at the job limit, with the milli hidden from placement (their free milli
    /// reads 0, so no policy picks them and no whole-GPU request could use them anyway).
    sealed: HashMap<(usize, u8), u32>,
    /// Running jobs not (yet) preempted in this pass.
    live: Vec<Option<&'a Running>>,
    /// Jobs preempted in this pass, to be tried again as pending ones.
    requeued: Vec<&'a Job>,
    capacity: Amounts,
    now: i64,
    config: Config,
    /// Each queue's share of the fleet's decayed past use.
    past_share: Vec<f64>,
    /// Whether a gang waiting for room has had free capacity set aside this pass.
    reserved: bool,
    /// What is set aside for it: (node, GPUs, request) held in `cluster`, placed nowhere.
    /// A job within its guarantee that finds no other room gets it back before it would
    /// reclaim: a reservation never makes anyone preempt.
    reservation: Vec<(usize, Vec<u8>, Request)>,
}

/// What a pass decides against.
#[derive(Debug, Clone, Copy)]
pub struct World<'a> {
    /// The nodes, empty: `running` is applied to a copy.
    pub cluster: &'a Cluster,
    pub tree: &'a QuotaTree,
    pub running: &'a [Running],
    /// Unix seconds.
    pub now: i64,
    pub config: Config,
    /// Each queue's decayed past GPU use (`crate::fair_share`), when fair share over time
    /// is on: a queue's share of it adds to its fair-share key.
    pub past_usage: Option<&'a HashMap<String, f64>>,
    /// What queues hold outside the engine's model (MIG instances, by queue id): counted
    /// in their quotas, placed nowhere here.
    pub outside: &'a [(String, Amounts)],
}

/// What makes a pass impossible: the running jobs do not describe a possible state.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EngineError {
    #[error("running job `{job}`: node {node} has no GPU {gpu}")]
    NoSuchGpu { job: String, node: usize, gpu: u8 },
    #[error("running job `{job}`: there is no node {node}")]
    NoSuchNode { job: String, node: usize },
    #[error("running job `{job}`: node {node} cannot hold it with what runs there already")]
    Overcommitted { job: String, node: usize },
}

/// Whether `r` can be taken on `gpus` of `n` exactly as given.
fn holds_on(n: &NodeState, r: &Request, gpus: &[u8]) -> Result<(), Option<u8>> {
    for &g in gpus {
        match n.gpu_free.get(usize::from(g)) {
            None => return Err(Some(g)),
            Some(&free) if free < r.gpu_milli => return Err(None),
            Some(_) => {}
        }
    }
    let enough = n.cpu_free >= r.cpu_milli && n.memory_free >= r.memory_mib;
    if enough && gpus.len() == usize::from(r.num_gpu) {
        Ok(())
    } else {
        Err(None)
    }
}

/// Decides `pending` against `world`, placing with `policy`.
pub fn schedule(
    world: World<'_>,
    pending: &[Job],
    policy: &mut dyn PlacementPolicy,
    rng: &mut StdRng,
) -> Result<Vec<Decision>, EngineError> {
    schedule_observed(world, pending, policy, rng, &mut |_| {})
}

/// [`schedule`], telling `decided` after each decision on a job (whether it was placed): a
/// benchmark times decisions with it; the pass itself reads no clock.
pub fn schedule_observed(
    world: World<'_>,
    pending: &[Job],
    policy: &mut dyn PlacementPolicy,
    rng: &mut StdRng,
    decided: &mut dyn FnMut(bool),
) -> Result<Vec<Decision>, EngineError> {
    let World {
        cluster: empty,
        tree,
        running,
        now,
        config,
        past_usage,
        outside,
    } = world;
    // Each queue's share of the fleet's decayed past use (0 without history).
    let past_share: Vec<f64> = {
        let total: f64 = past_usage.map_or(0.0, |p| p.values().sum());
        (0..tree.len())
            .map(|q| {
                let used = past_usage
                    .and_then(|p| p.get(&tree.spec(q).id))
                    .copied()
                    .unwrap_or(0.0);
                if total > 0.0 { used / total } else { 0.0 }
            })
            .collect()
    };
    let cluster = empty.clone();
    let usage = Usage::new(tree);
    let mut capacity = Amounts::default();
    for (n, &gpu_mib) in cluster.nodes.iter().zip(&cluster.gpu_memory_mib) {
        let gpu_memory = n.gpu_free.len() as u64 * u64::from(gpu_mib);
        capacity.add(
            &Amounts::new(
                u64::from(n.gpu_free_total()),
                u64::from(n.cpu_free),
                u64::from(n.memory_free),
            )
            .with_gpu_memory(gpu_memory),
        );
    }
    let occupancy = Occupancy::new(cluster.nodes.len());
    let mut pass = Pass {
        tree,
        cluster,
        usage,
        occupancy,
        sealed: HashMap::new(),
        live: running.iter().map(Some).collect(),
        requeued: Vec::new(),
        capacity,
        now,
        config,
        past_share,
        reserved: false,
        reservation: Vec::new(),
    };
    for r in running {
        let q = tree.find(&r.job.queue);
        for c in &r.placements {
            pass.check_holds(r, c)?;
            match q {
                Some(q) => pass.hold(c.node, &c.gpus, &r.job, q, level_of(tree, &r.job, q)),
                // Without a quota it counts nowhere, but it still holds its GPUs.
                None => pass.cluster.nodes[c.node].place(&r.job.request, &c.gpus),
            }
        }
        if let Some(q) = q {
            pass.usage.take(tree, q, &r.job.amounts());
        }
    }
    for (queue, a) in outside {
        if let Some(q) = tree.find(queue) {
            pass.usage.take(tree, q, a);
        }
    }
    let mut decisions = Vec::with_capacity(pending.len());
    // Tenants above a hard limit (lowered by an admin, or placed past it in a race) are
    // brought back under it first, by stopping their own work: what is left is what the
    // pass decides on.
    pass.shed_over_limits(&mut decisions);
    // Then auto-sized work whose GPU's forecast outgrew it moves to room (`forecast`).
    pass.relieve_outgrown(&mut decisions);
    for node in 0..pass.cluster.nodes.len() {
        policy.node_changed(&pass.cluster, node);
    }
    let mut waiting = Vec::new();
    // Best-effort work fills what the rest leaves: it is decided after every other job
    // (else a job it gave way to in one pass would find it back in its place in the next).
    for best_effort in [false, true] {
        let mut queues = by_queue(pending.iter().filter(|j| j.best_effort == best_effort));
        while let Some(job) = pass.next(&mut queues) {
            let placed = pass.decide(job, policy, rng, &mut decisions);
            decided(placed);
            if !placed {
                waiting.push(job);
            }
        }
    }
    // A reclaim can free more than its job takes, and a placement changes what a tenant
    // holds: try the waiting jobs, and the jobs just preempted, again until nothing changes,
    // so that the same state, decided again, moves nothing.
    loop {
        waiting.append(&mut pass.requeued);
        let mut still = Vec::new();
        for job in &waiting {
            let mut retry = Vec::new();
            let placed = pass.decide(job, policy, rng, &mut retry);
            decided(placed);
            if placed {
                decisions
                    .retain(|d| !matches!(d, Decision::Wait { job_id, .. } if *job_id == job.id));
                decisions.extend(retry);
            } else {
                still.push(*job);
            }
        }
        if still.len() == waiting.len() && pass.requeued.is_empty() {
            break;
        }
        waiting = still;
    }
    pass.spread_best_effort(&mut decisions);
    pass.consolidate(&mut decisions);
    Ok(decisions)
}

/// The isolation `job` runs at: what it asks for (or its class's default), raised to the
/// minimum of its tenant and the tenant's parents.
pub fn level_of(tree: &QuotaTree, job: &Job, q: usize) -> Isolation {
    let asked = job
        .isolation
        .or(job.class.map(WorkloadClass::default_isolation))
        .unwrap_or_default();
    tree.ancestors(q)
        .map(|a| tree.spec(a).min_isolation)
        .fold(asked, Isolation::max)
}

/// Pending jobs per queue, each list in (priority desc, seq asc) order, reversed so the
/// next job pops off the end.
fn by_queue<'j>(pending: impl Iterator<Item = &'j Job>) -> Vec<Vec<&'j Job>> {
    let mut queues: Vec<Vec<&Job>> = Vec::new();
    let mut sorted: Vec<&Job> = pending.collect();
    sorted.sort_by(|a, b| a.queue.cmp(&b.queue));
    for job in sorted {
        match queues.last_mut() {
            Some(q) if q[0].queue == job.queue => q.push(job),
            _ => queues.push(vec![job]),
        }
    }
    for q in &mut queues {
        q.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.seq.cmp(&b.seq)));
        q.reverse();
    }
    queues
}

impl<'a> Pass<'a> {
    /// Whether running job `r` can hold placement `c` on top of what is already held.
    fn check_holds(&self, r: &Running, c: &Choice) -> Result<(), EngineError> {
        let job = || r.job.id.clone();
        let n = self
            .cluster
            .nodes
            .get(c.node)
            .ok_or_else(|| EngineError::NoSuchNode {
                job: job(),
                node: c.node,
            })?;
        // A sealed GPU reads 0 free: count what it hides.
        let mut n = n.clone();
        for (&(node, g), hidden) in &self.sealed {
            if node == c.node {
                n.gpu_free[usize::from(g)] += hidden;
            }
        }
        holds_on(&n, &r.job.request, &c.gpus).map_err(|gpu| match gpu {
            Some(gpu) => EngineError::NoSuchGpu {
                job: job(),
                node: c.node,
                gpu,
            },
            None => EngineError::Overcommitted {
                job: job(),
                node: c.node,
            },
        })
    }

    /// Takes `request` on `gpus` of `node` for queue `q`, sealing shared GPUs that reach
    /// the job limit.
    fn hold(&mut self, node: usize, gpus: &[u8], job: &Job, q: usize, level: Isolation) {
        let request = &job.request;
        // (A running job can land on a sealed GPU when the limit was lowered since.)
        for &g in gpus {
            if let Some(hidden) = self.sealed.remove(&(node, g)) {
                self.cluster.nodes[node].gpu_free[usize::from(g)] += hidden;
            }
        }
        self.cluster.nodes[node].place(request, gpus);
        self.occupancy.add(node, gpus, job.tenancy(q, level));
        if request.is_shared() {
            for &g in gpus {
                let at_limit = self.occupancy.jobs_on(node, g)
                    >= self.config.gpu_limits.max_jobs_per_shared_gpu;
                if at_limit {
                    let free = &mut self.cluster.nodes[node].gpu_free[usize::from(g)];
                    self.sealed.insert((node, g), *free);
                    *free = 0;
                }
            }
        }
    }

    /// Gives back what `hold` took, unsealing the GPUs.
    fn unhold(&mut self, node: usize, gpus: &[u8], job: &Job, q: usize, level: Isolation) {
        for &g in gpus {
            if let Some(hidden) = self.sealed.remove(&(node, g)) {
                self.cluster.nodes[node].gpu_free[usize::from(g)] += hidden;
            }
        }
        self.cluster.nodes[node].release(&job.request, gpus);
        self.occupancy.remove(node, gpus, job.tenancy(q, level));
    }

    /// What `job` needs of the GPU memory of `node`'s GPUs.
    fn memory_need(&self, job: &Job, node: usize) -> MemoryNeed {
        MemoryNeed {
            mib: if job.request.num_gpu > 0 {
                job.gpu_memory_mib
            } else {
                0
            },
            capacity_mib: self.cluster.gpu_memory_mib.get(node).copied().unwrap_or(0),
        }
    }

    /// Releases `r`'s placements on `node` from `state`, a trial copy of that node,
    /// unsealing each GPU once (`unsealed` remembers which).
    fn trial_release(
        &self,
        state: &mut NodeState,
        node: usize,
        r: &Running,
        unsealed: &mut Vec<u8>,
    ) {
        for c in r.placements.iter().filter(|c| c.node == node) {
            for &g in &c.gpus {
                if !unsealed.contains(&g)
                    && let Some(hidden) = self.sealed.get(&(node, g))
                {
                    state.gpu_free[usize::from(g)] += hidden;
                    unsealed.push(g);
                }
            }
            state.release(&r.job.request, &c.gpus);
        }
    }

    /// Stops running jobs of every queue that holds more than a hard limit of its own (a
    /// tenant's figures include its teams'), until none does: of the queue's own work and
    /// its teams', the preemptible jobs holding the resource over the limit, lowest
    /// priority first, then the newest; never another tenant's. Deepest queues first, so a
    /// team's own excess is taken from the team before its parent's is looked at. A queue
    /// whose work over the limit cannot be preempted stays over it until that work ends
    /// (new work waits meanwhile: `TenantLimit`).
    fn shed_over_limits(&mut self, decisions: &mut Vec<Decision>) {
        let tree = self.tree;
        let mut queues: Vec<usize> = (0..tree.len()).collect();
        queues.sort_by_key(|&q| std::cmp::Reverse(tree.ancestors(q).count()));
        for q in queues {
            loop {
                let spec = tree.spec(q);
                let held = *self.usage.of(q);
                let Some((resource, limit)) = Resource::ALL.into_iter().find_map(|r| {
                    spec.limit
                        .get(r)
                        .filter(|&limit| held.get(r) > limit)
                        .map(|limit| (r, limit))
                }) else {
                    break;
                };
                let victim = self
                    .live
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| r.map(|r| (i, r)))
                    .filter(|(_, r)| {
                        r.job.preemptible
                            && r.job.amounts().get(resource) > 0
                            && tree
                                .find(&r.job.queue)
                                .is_some_and(|rq| tree.ancestors(rq).any(|a| a == q))
                    })
                    // Lowest priority, then the latest started (the least work lost), then
                    // the newest submitted.
                    .min_by_key(|(_, r)| {
                        (
                            r.job.priority,
                            std::cmp::Reverse(r.started_at),
                            std::cmp::Reverse(r.job.seq),
                        )
                    });
                let Some((i, r)) = victim else {
                    break;
                };
                let Some(rq) = tree.find(&r.job.queue) else {
                    break;
                };
                let level = level_of(tree, &r.job, rq);
                for c in &r.placements {
                    self.unhold(c.node, &c.gpus, &r.job, rq, level);
                }
                self.usage.give_back(tree, rq, &r.job.amounts());
                self.live[i] = None;
                decisions.push(Decision::Preempt {
                    job_id: r.job.id.clone(),
                    for_job: None,
                    reason: format!(
                        "tenant {} holds {} against its hard limit of {}: its latest started \
                         preemptible work is stopped to bring it back under",
                        spec.name,
                        resource.number(held.get(resource)),
                        resource.show(limit)
                    ),
                });
            }
        }
    }

    /// Queue `q`'s fair-share key: its dominant share above its guarantee now, plus (with
    /// fair share over time) its share of the fleet's decayed past use, over its weight.
    fn share_key(&self, q: usize) -> f64 {
        let past = self.past_share.get(q).copied().unwrap_or(0.0)
            / f64::from(self.tree.spec(q).weight.max(1));
        self.usage.fair_share_key(self.tree, q, &self.capacity) + past
    }

    /// The next job: among each queue's head, guaranteed first, then priority, then the
    /// queue furthest below its fair share, then the oldest.
    fn next<'j>(&self, queues: &mut [Vec<&'j Job>]) -> Option<&'j Job> {
        let key = |job: &Job| {
            let q = self.tree.find(&job.queue);
            let within =
                q.is_some_and(|q| self.usage.within_guarantee(self.tree, q, &job.amounts()));
            let share = q.map_or(f64::INFINITY, |q| self.share_key(q));
            (within, job.priority, share, job.seq)
        };
        let best = queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.last().map(|job| (i, key(job))))
            .min_by(|(_, a), (_, b)| {
                b.0.cmp(&a.0)
                    .then(b.1.cmp(&a.1))
                    .then(a.2.partial_cmp(&b.2).unwrap_or(Ordering::Equal))
                    .then(a.3.cmp(&b.3))
            })?;
        queues[best.0].pop()
    }

    /// Decides `job`; true when it was placed.
    fn decide(
        &mut self,
        job: &Job,
        policy: &mut dyn PlacementPolicy,
        rng: &mut StdRng,
        decisions: &mut Vec<Decision>,
    ) -> bool {
        let wait = |code: &str, message: String| Decision::Wait {
            job_id: job.id.clone(),
            reason: PendingReason {
                code: code.into(),
                message,
            },
        };
        let Some(q) = self.tree.find(&job.queue) else {
            decisions.push(wait(
                "UnknownTenant",
                format!("no quota is defined for `{}`", job.queue),
            ));
            return false;
        };
        let level = level_of(self.tree, job, q);
        if level == Isolation::Mig && job.request.num_gpu > 0 {
            decisions.push(wait(
                "MigUnavailable",
                format!(
                    "isolation mig (tenant {}): no node offers MIG partitions yet",
                    self.tree.spec(q).name
                ),
            ));
            return false;
        }
        let held = Job {
            request: held_request(&job.request, level),
            ..job.clone()
        };
        let job = &held;
        let total = job.amounts();
        if let Some(mut over) = self.usage.over_limit(self.tree, q, &total) {
            over.replicas = job.replicas.max(1);
            decisions.push(wait("TenantLimit", over.to_string()));
            return false;
        }
        let within = self.usage.within_guarantee(self.tree, q, &total);
        let mut placed = self.place_gang(job, q, level, policy, rng);
        if placed.is_none() && within && !self.reservation.is_empty() {
            for (node, gpus, request) in std::mem::take(&mut self.reservation) {
                self.cluster.nodes[node].release(&request, &gpus);
                policy.node_changed(&self.cluster, node);
            }
            placed = self.place_gang(job, q, level, policy, rng);
        }
        if let Some(placements) = placed {
            self.usage.take(self.tree, q, &total);
            let borrowing = self.usage.borrowing(self.tree, q, &total);
            decisions.push(Decision::Place {
                job_id: job.id.clone(),
                request: job.request,
                placements,
                borrowing,
            });
            return true;
        }
        // A gang that must be packed is not placed by preemption (reclaim takes the room
        // it frees wherever it is).
        let packed = job.pack.as_ref().is_some_and(|p| p.required) && job.replicas > 1;
        // Within its guarantee a job reclaims what others borrowed; any job that is not
        // best-effort takes the place of best-effort work.
        let claim = Claim {
            queue: q,
            within,
            best_effort: job.best_effort,
        };
        if (within || !job.best_effort)
            && !packed
            && let Some((victims, placements)) = self.reclaim(job, claim, level, policy)
        {
            for (victim, reason) in victims {
                decisions.push(Decision::Preempt {
                    job_id: victim,
                    for_job: Some(job.id.clone()),
                    reason,
                });
            }
            decisions.push(Decision::Place {
                job_id: job.id.clone(),
                request: job.request,
                placements,
                // Past its guarantee it took best-effort work's place: borrowed.
                borrowing: !within,
            });
            return true;
        }
        let mut why = self.no_room(job, q, level, within);
        // The first gang in order that waits for room has what is free of what it needs set
        // aside for the rest of the pass, so that jobs behind it do not take each GPU as it
        // frees and keep it waiting for ever (Slurm reserves for its top job likewise).
        if job.replicas > 1 && !packed && !self.reserved {
            self.reserved = true;
            let touched = self.reserve(job, q, level);
            for &node in &touched {
                policy.node_changed(&self.cluster, node);
            }
            let set_aside = touched.len();
            if set_aside > 0 {
                why = format!(
                    "{why}; room for {set_aside} of its {} replicas is held for it",
                    job.replicas
                );
            }
        }
        if packed && let Some(pack) = job.pack.clone() {
            let room = self.pack_room(job, q, level, &pack);
            let each: Vec<String> = room
                .iter()
                .map(|(v, n)| format!("{}={v} has room for {n}", pack.label))
                .collect();
            why = format!(
                "no {} has room for all {} replicas ({}); {why}",
                pack.label,
                job.replicas,
                if each.is_empty() {
                    format!("no node is labeled {}", pack.label)
                } else {
                    each.join(", ")
                }
            );
        }
        decisions.push(wait("NoRoom", why));
        false
    }

    /// The single GPUs a share of `job` may go to now, with the compute free on each: on
    /// the nodes its queue may use at `level` and it fits on, those with its share free,
    /// not avoided, whose other jobs take it (isolation, memory, job places).
    fn share_candidates<'s>(
        &'s self,
        job: &'s Job,
        q: usize,
        level: Isolation,
    ) -> impl Iterator<Item = (usize, u8, u32)> + 's {
        let c = &self.cluster;
        let limits = self.config.gpu_limits;
        let r = &job.request;
        (0..c.nodes.len())
            .filter(move |&i| {
                self.occupancy.node_allows(i, q, level)
                    && !job.avoid.nodes.contains(&i)
                    && c.nodes[i].fits(r)
            })
            .flat_map(move |i| {
                let memory = self.memory_need(job, i);
                c.nodes[i]
                    .gpu_free
                    .iter()
                    .enumerate()
                    .filter_map(move |(g, &free)| {
                        let g = u8::try_from(g).ok()?;
                        (free >= r.gpu_milli
                            && !job.avoid.gpus.contains(&(i, g))
                            && self.occupancy.gpus_allow(i, &[g], r, memory, limits))
                        .then_some((i, g, free))
                    })
            })
    }

    /// Every allowed node one replica of `job` fits on now (of label value `within`, if
    /// given), with the GPUs it would take there.
    fn fitting<'s>(
        &'s self,
        job: &'s Job,
        q: usize,
        level: Isolation,
        within: Option<(&'s Pack, u32)>,
    ) -> impl Iterator<Item = (usize, Vec<u8>)> + 's {
        let c = &self.cluster;
        let limits = self.config.gpu_limits;
        (0..c.nodes.len())
            .filter(move |&i| {
                self.occupancy.node_allows(i, q, level) && !job.avoid.nodes.contains(&i)
            })
            .filter(move |&i| {
                within.is_none_or(|(p, v)| p.of_node.get(i).copied().flatten() == Some(v))
            })
            .filter_map(move |i| {
                let memory = self.memory_need(job, i);
                // Avoided GPUs look full to this job (the node copied only when it has any).
                let mut node = std::borrow::Cow::Borrowed(&c.nodes[i]);
                for &(_, g) in job.avoid.gpus.iter().filter(|&&(n, _)| n == i) {
                    if let Some(free) = node.to_mut().gpu_free.get_mut(usize::from(g)) {
                        *free = 0;
                    }
                }
                let gpus = self
                    .occupancy
                    .gpus_for(i, &node, &job.request, memory, limits)?;
                Some((i, gpus))
            })
    }

    /// Why `job` waits, with numbers.
    fn no_room(&self, job: &Job, q: usize, level: Isolation, within: bool) -> String {
        let r = &job.request;
        let mut want = Vec::new();
        if r.num_gpu > 0 {
            if r.gpu_milli < 1000 {
                want.push(format!(
                    "{} of a GPU",
                    allot_domain::format_milli(u64::from(r.gpu_milli))
                ));
            } else {
                want.push(format!(
                    "{} whole GPU{}",
                    r.num_gpu,
                    if r.num_gpu == 1 { "" } else { "s" }
                ));
            }
        }
        if r.num_gpu > 0 && job.gpu_memory_mib > 0 {
            let mib = u64::from(job.gpu_memory_mib);
            want.push(format!("{} per GPU", Resource::GpuMemoryMib.show(mib)));
        }
        // What it asks for: no "0 CPUs" for a job that asks for none.
        if r.cpu_milli > 0 {
            want.push(Resource::CpuMilli.show(u64::from(r.cpu_milli)));
        }
        if r.memory_mib > 0 {
            want.push(Resource::MemoryMib.show(u64::from(r.memory_mib)));
        }
        let replicas = if job.replicas > 1 {
            format!("{} replicas (all or none) of ", job.replicas)
        } else {
            String::new()
        };
        let spec = self.tree.spec(q);
        let held = self.usage.of(q).get(Resource::Gpu);
        let limit = spec.limit.get(Resource::Gpu).map_or(String::new(), |l| {
            format!(", limit {}", Resource::Gpu.number(l))
        });
        let reclaim = if within {
            "nothing preemptible is borrowed where it would make room"
        } else {
            "above its guarantee, so it waits for spare capacity"
        };
        let isolation = match level {
            Isolation::Shared => String::new(),
            other => format!(
                " at isolation {} (whole GPUs on a node with no other tenant's work)",
                other.as_str()
            ),
        };
        format!(
            "no node has room for {replicas}{}{isolation}; tenant {}: {} of {} guaranteed GPUs in use{limit}; {reclaim}",
            want.join(", "),
            spec.name,
            Resource::Gpu.number(held),
            Resource::Gpu.number(spec.guaranteed.get(Resource::Gpu)),
        )
    }
}

#[cfg(test)]
mod tests;
