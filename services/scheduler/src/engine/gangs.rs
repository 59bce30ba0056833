//! Placing a gang (all its replicas in one pass, or none) and the room a job packed with
//! others or a pack's group of nodes leaves.

use super::*;
use crate::placement::{Choice, PlacementPolicy};

impl Pass<'_> {
    /// All replicas, or none (what was placed is given back). A single replica goes where
    /// the policy says. A gang's replicas each take the tightest node that fits (fewest free
    /// GPU milli, then CPU, then the node order), so whether a gang fits depends only on
    /// the cluster's state, never on what the policy has learned: the same state always
    /// gives the same answer.
    ///
    /// Isolation holds either way: a choice of the policy that breaks it (another tenant on
    /// a dedicated node, a shared GPU at its job limit) gives way to the tightest allowed.
    pub(super) fn place_gang(
        &mut self,
        job: &Job,
        q: usize,
        level: Isolation,
        policy: &mut dyn PlacementPolicy,
        rng: &mut StdRng,
    ) -> Option<Vec<Choice>> {
        if job.replicas > 1
            && let Some(pack) = job.pack.clone()
        {
            // Each value in turn, the one with the least free GPU room first (packing
            // tightly keeps the roomier ones whole).
            let mut values: Vec<(u64, u32)> = (0..u32::try_from(pack.values.len()).unwrap_or(0))
                .map(|v| {
                    let room = (0..self.cluster.nodes.len())
                        .filter(|&i| pack.of_node.get(i).copied().flatten() == Some(v))
                        .map(|i| u64::from(self.cluster.nodes[i].gpu_free_total()))
                        .sum();
                    (room, v)
                })
                .collect();
            values.sort_unstable();
            for (_, v) in values {
                if let Some(p) = self.place_replicas(job, q, level, policy, rng, Some((&pack, v))) {
                    return Some(p);
                }
            }
            if pack.required {
                return None;
            }
        }
        self.place_replicas(job, q, level, policy, rng, None)
    }

    /// [`Self::place_gang`]'s replicas, each on a node of label value `within` if given.
    pub(super) fn place_replicas(
        &mut self,
        job: &Job,
        q: usize,
        level: Isolation,
        policy: &mut dyn PlacementPolicy,
        rng: &mut StdRng,
        within: Option<(&Pack, u32)>,
    ) -> Option<Vec<Choice>> {
        let limits = self.config.gpu_limits;
        let mut placed: Vec<Choice> = Vec::new();
        for _ in 0..job.replicas.max(1) {
            let choice = if job.replicas > 1 {
                self.tightest(job, q, level, within)
            } else if job.best_effort {
                self.best_effort_room(job, q, level)
            } else if job.sizing.is_some() && job.request.is_shared() {
                self.sized_room(job, q, level)
            } else {
                // Where the policy finds no node that fits, none fits: the tightest allowed
                // node (a subset of those) is only sought for a choice that breaks a rule.
                policy
                    .choose(&self.cluster, &job.request, rng)
                    .and_then(|c| {
                        let memory = self.memory_need(job, c.node);
                        let allowed = job.avoid.allows(&c)
                            && self.occupancy.node_allows(c.node, q, level)
                            && self.occupancy.gpus_allow(
                                c.node,
                                &c.gpus,
                                &job.request,
                                memory,
                                limits,
                            );
                        if allowed {
                            Some(c)
                        } else {
                            self.tightest(job, q, level, None)
                        }
                    })
            };
            match choice {
                Some(c) => {
                    self.hold(c.node, &c.gpus, job, q, level);
                    policy.node_changed(&self.cluster, c.node);
                    placed.push(c);
                }
                None => {
                    for c in placed {
                        self.unhold(c.node, &c.gpus, job, q, level);
                        policy.node_changed(&self.cluster, c.node);
                    }
                    return None;
                }
            }
        }
        Some(placed)
    }

    /// Sets aside room for as many of `job`'s replicas as fit now (up to one fewer than all:
    /// all would have been placed), on the nodes with the most free room first, for the
    /// rest of the pass: held in the pass's cluster, placed nowhere. Returns the node of
    /// each replica set aside.
    pub(super) fn reserve(&mut self, job: &Job, q: usize, level: Isolation) -> Vec<usize> {
        let mut set_aside = Vec::new();
        while u32::try_from(set_aside.len() + 1).unwrap_or(u32::MAX) < job.replicas {
            let c = &self.cluster;
            let roomiest = self
                .fitting(job, q, level, None)
                .max_by_key(|(i, _)| (c.nodes[*i].gpu_free_total(), std::cmp::Reverse(c.rank[*i])));
            let Some((node, gpus)) = roomiest else {
                break;
            };
            self.cluster.nodes[node].place(&job.request, &gpus);
            self.reservation.push((node, gpus, job.request));
            set_aside.push(node);
        }
        set_aside
    }

    /// How many of `job`'s replicas would fit on the nodes of each value of its pack label:
    /// what a packed gang's reason says.
    pub(super) fn pack_room(
        &mut self,
        job: &Job,
        q: usize,
        level: Isolation,
        pack: &Pack,
    ) -> Vec<(String, u32)> {
        let mut out = Vec::with_capacity(pack.values.len());
        for (v, name) in pack.values.iter().enumerate() {
            let v = u32::try_from(v).unwrap_or(u32::MAX);
            let mut held = Vec::new();
            while u32::try_from(held.len()).unwrap_or(u32::MAX) < job.replicas {
                let Some(c) = self.tightest(job, q, level, Some((pack, v))) else {
                    break;
                };
                self.hold(c.node, &c.gpus, job, q, level);
                held.push(c);
            }
            out.push((name.clone(), u32::try_from(held.len()).unwrap_or(u32::MAX)));
            for c in held {
                self.unhold(c.node, &c.gpus, job, q, level);
            }
        }
        out
    }

    /// The allowed fitting node with the least room left (GPU milli, then CPU, then node
    /// order).
    pub(super) fn tightest(
        &self,
        job: &Job,
        q: usize,
        level: Isolation,
        within: Option<(&Pack, u32)>,
    ) -> Option<Choice> {
        let c = &self.cluster;
        self.fitting(job, q, level, within)
            .min_by_key(|(i, _)| {
                (
                    c.nodes[*i].gpu_free_total(),
                    c.nodes[*i].cpu_free,
                    c.rank[*i],
                )
            })
            .map(|(node, gpus)| Choice { node, gpus })
    }
}
