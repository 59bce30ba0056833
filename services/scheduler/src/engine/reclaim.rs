//! Reclaim: which running jobs a job within its guarantee may preempt, and the node where
//! the fewest of them free the room it needs.

use std::cmp::Ordering;

use super::*;
use crate::placement::{Choice, NodeState, PlacementPolicy};
use crate::quota::{Resource, Usage};

impl Pass<'_> {
    /// Whether running job `r` may be preempted now for `claim`, on what the pass has taken
    /// so far (`usage`): best-effort work for any job that is not, at once; a borrower for
    /// a job within its guarantee, after the minimum runtime.
    pub(super) fn eligible(&self, r: &Running, usage: &Usage, claim: Claim) -> Option<usize> {
        let q = self.tree.find(&r.job.queue)?;
        if claim.gives_way(r) {
            return Some(q);
        }
        let amounts = r.job.amounts();
        (claim.within
            && q != claim.queue
            && r.job.preemptible
            && self.now - r.started_at >= self.config.min_runtime_secs
            && usage.borrowing(self.tree, q, &amounts)
            && usage.can_lose(usage, self.tree, q, &amounts, claim.queue))
        .then_some(q)
    }

    /// Frees room for every replica of `job` by preempting borrowers, node by node, and
    /// takes the job's amounts; all replicas or nothing changes. Returns the victims (with
    /// reasons) and the placements.
    pub(super) fn reclaim(
        &mut self,
        job: &Job,
        claim: Claim,
        level: Isolation,
        policy: &mut dyn PlacementPolicy,
    ) -> Option<(Vec<Victim>, Vec<Choice>)> {
        let q = claim.queue;
        // Most attempts find nothing to take: find out before copying the pass's state. (The
        // first replica's room is the one found here: nothing has changed yet.)
        let mut first = Some(self.cheapest_room(job, claim, level, &self.usage)?);
        let (cluster_before, usage_before, live_before, occupancy_before, sealed_before) = (
            self.cluster.clone(),
            self.usage.clone(),
            self.live.clone(),
            self.occupancy.clone(),
            self.sealed.clone(),
        );
        let requeued_before = self.requeued.len();
        let mut victims = Vec::new();
        let mut placements = Vec::new();
        let mut touched = Vec::new();
        for _ in 0..job.replicas.max(1) {
            let room = first
                .take()
                .or_else(|| self.cheapest_room(job, claim, level, &usage_before));
            let Some((node, chosen)) = room else {
                self.cluster = cluster_before;
                self.usage = usage_before;
                self.live = live_before;
                self.occupancy = occupancy_before;
                self.sealed = sealed_before;
                self.requeued.truncate(requeued_before);
                for node in touched {
                    policy.node_changed(&self.cluster, node);
                }
                return None;
            };
            for i in chosen {
                let Some(r) = self.live[i].take() else {
                    continue;
                };
                self.requeued.push(&r.job);
                let Some(vq) = self.tree.find(&r.job.queue) else {
                    continue;
                };
                let victim_level = level_of(self.tree, &r.job, vq);
                for c in &r.placements {
                    self.unhold(c.node, &c.gpus, &r.job, vq, victim_level);
                    touched.push(c.node);
                }
                let held = self.usage.of(vq).get(Resource::Gpu);
                self.usage.give_back(self.tree, vq, &r.job.amounts());
                if claim.gives_way(r) {
                    victims.push((
                        r.job.id.clone(),
                        format!(
                            "best-effort: gave its place up to {} (tenant {})",
                            job.id,
                            self.tree.spec(q).name,
                        ),
                    ));
                    continue;
                }
                let guaranteed = self.tree.spec(vq).guaranteed.get(Resource::Gpu);
                victims.push((
                    r.job.id.clone(),
                    format!(
                        "tenant {} held {} of {} guaranteed; reclaimed for {} (tenant {}, within its guarantee)",
                        self.tree.spec(vq).name,
                        Resource::Gpu.number(held),
                        Resource::Gpu.show(guaranteed),
                        job.id,
                        self.tree.spec(q).name,
                    ),
                ));
            }
            let memory = self.memory_need(job, node);
            let gpus = self
                .occupancy
                .gpus_for(
                    node,
                    &self.cluster.nodes[node],
                    &job.request,
                    memory,
                    self.config.gpu_limits,
                )
                .unwrap_or_else(|| self.cluster.nodes[node].default_gpus(&job.request));
            self.hold(node, &gpus, job, q, level);
            self.usage.take(self.tree, q, &job.replica_amounts());
            touched.push(node);
            placements.push(Choice { node, gpus });
        }
        touched.sort_unstable();
        touched.dedup();
        for node in touched {
            policy.node_changed(&self.cluster, node);
        }
        Some((victims, placements))
    }

    /// The node where preempting the fewest eligible borrowers (in reclaim order) makes room
    /// for `request`, and those borrowers (indices into `live`).
    /// `base`: the usage before this reclaim began (a gang reclaims replica by replica).
    pub(super) fn cheapest_room(
        &self,
        job: &Job,
        claim: Claim,
        level: Isolation,
        base: &Usage,
    ) -> Option<(usize, Vec<usize>)> {
        let q = claim.queue;
        let request = &job.request;
        let mut candidates: Vec<(usize, usize)> = self
            .live
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let r = (*r)?;
                self.eligible(r, &self.usage, claim).map(|vq| (i, vq))
            })
            .collect();
        // Best-effort work first, then borrowers by priority, share and age.
        candidates.sort_by(|&(a, qa), &(b, qb)| {
            let (Some(ra), Some(rb)) = (self.live[a], self.live[b]) else {
                return Ordering::Equal;
            };
            let share = |vq| self.share_key(vq);
            claim
                .gives_way(rb)
                .cmp(&claim.gives_way(ra))
                .then(ra.job.priority.cmp(&rb.job.priority))
                .then(share(qb).partial_cmp(&share(qa)).unwrap_or(Ordering::Equal))
                .then(rb.started_at.cmp(&ra.started_at))
                .then(rb.job.seq.cmp(&ra.job.seq))
        });
        // Only nodes where some candidate runs can gain room.
        let mut nodes: Vec<usize> = candidates
            .iter()
            .filter_map(|&(i, _)| self.live[i])
            .flat_map(|r| r.placements.iter().map(|c| c.node))
            .collect();
        nodes.sort_unstable_by_key(|&n| (self.cluster.rank[n], n));
        nodes.dedup();
        let mut best: Option<(usize, Vec<usize>)> = None;
        for node in nodes {
            let mut state = self.cluster.nodes[node].clone();
            let model_refused = (request.models >> state.model) & 1 == 0;
            if request.num_gpu > 0 && model_refused {
                continue;
            }
            let mut usage = self.usage.clone();
            let mut chosen = Vec::new();
            let mut unsealed = Vec::new();
            // Best-effort work also gives up the GPU memory and job places it holds: where
            // some runs here, room is what the job would be allowed, not compute alone.
            let best_effort_here = candidates.iter().any(|&(i, _)| {
                self.live[i].is_some_and(|r| {
                    claim.gives_way(r) && r.placements.iter().any(|c| c.node == node)
                })
            });
            let room = |state: &NodeState, victims: &[usize]| {
                state.fits(request)
                    && (!best_effort_here || self.allowed_without(node, victims, job, q, level))
            };
            for &(i, vq) in &candidates {
                if room(&state, &chosen) {
                    break;
                }
                if best
                    .as_ref()
                    .is_some_and(|(_, b)| chosen.len() + 1 >= b.len())
                {
                    break;
                }
                let Some(r) = self.live[i] else { continue };
                let here = r.placements.iter().any(|c| c.node == node);
                if !here
                    || !claim.gives_way(r)
                        && !usage.can_lose(base, self.tree, vq, &r.job.amounts(), q)
                {
                    continue;
                }
                self.trial_release(&mut state, node, r, &mut unsealed);
                usage.give_back(self.tree, vq, &r.job.amounts());
                chosen.push(i);
            }
            if chosen.is_empty() || !room(&state, &chosen) {
                continue;
            }
            // Keep only the victims the room needs: a later, larger one can make an
            // earlier one unnecessary.
            let mut needed = chosen.clone();
            for &i in &chosen {
                let without: Vec<usize> = needed.iter().copied().filter(|&j| j != i).collect();
                let mut trial = self.cluster.nodes[node].clone();
                let mut unsealed = Vec::new();
                for &j in &without {
                    let Some(r) = self.live[j] else { continue };
                    self.trial_release(&mut trial, node, r, &mut unsealed);
                }
                if room(&trial, &without) {
                    needed = without;
                }
            }
            if best.as_ref().is_some_and(|(_, b)| needed.len() >= b.len())
                || !self.allowed_without(node, &needed, job, q, level)
            {
                continue;
            }
            best = Some((node, needed));
        }
        best
    }

    /// Whether `job` may run on `node` once the `victims` (indices into `live`) are gone:
    /// isolation and the per-GPU job limit.
    pub(super) fn allowed_without(
        &self,
        node: usize,
        victims: &[usize],
        job: &Job,
        q: usize,
        level: Isolation,
    ) -> bool {
        let mut occupancy = self.occupancy.clone();
        let mut state = self.cluster.nodes[node].clone();
        let mut unsealed = Vec::new();
        for r in victims.iter().filter_map(|&i| self.live[i]) {
            let Some(vq) = self.tree.find(&r.job.queue) else {
                continue;
            };
            let victim_level = level_of(self.tree, &r.job, vq);
            for c in &r.placements {
                occupancy.remove(c.node, &c.gpus, r.job.tenancy(vq, victim_level));
            }
            self.trial_release(&mut state, node, r, &mut unsealed);
        }
        occupancy.node_allows(node, q, level)
            && occupancy
                .gpus_for(
                    node,
                    &state,
                    &job.request,
                    self.memory_need(job, node),
                    self.config.gpu_limits,
                )
                .is_some()
    }
}
