//! Placement by forecast of auto-sized jobs (`--gpus auto`).
//!
//! A sized job holds a share its sizer keeps at its forecast demand plus headroom
//! ([`super::Sizing::wanted_milli`] is that forecast, and more when a growth found no room).
//! A GPU's *forecast demand* is what its jobs hold, each sized job counted at the larger of
//! its share and what it wants. Three rules keep the sized jobs packed onto few GPUs
//! without starving them:
//!
//! - **Placed by forecast, with headroom**: a sized job goes to the GPU its forecast leaves
//!   the least room on, of those where the demand stays within the GPU less
//!   [`super::GpuLimits::sized_headroom_milli`] (so that it can grow in place); only when
//!   none has that, to the GPU with the most forecast room.
//! - **Relieved when outgrown**: on a GPU whose forecast demand is above the whole GPU,
//!   best-effort work moves first when that alone gives the GPU its headroom back; else
//!   the lowest-priority sized job there (of equals, one that settled, and the cheapest
//!   way back to the headroom: a move costs a service about its share plus a restart)
//!   moves to a GPU its forecast fits on with headroom
//!   (stopped and placed again there: it starts at what it wants), one a pass until the
//!   headroom is back. Best-effort work gives way to a sized job's growth at once anyway,
//!   by its pacing: it runs on what the GPU's other jobs leave.
//! - **Consolidated when settled**: the GPU hosting sized jobs with the least demand is
//!   emptied when every job on it that is not best-effort is sized, settled (measured for
//!   a few windows where it runs) and fits on the other GPUs hosting services with the
//!   headroom left. Hysteresis: a GPU is relieved only once its forecast outgrows the
//!   whole GPU, packed only to the GPU less its headroom, and what moved is not moved
//!   again for consolidation before it settles.
//!
//! A move is a [`Decision::Move`]: the job stops where it is and is requeued, avoiding the
//! GPU it left. One GPU is relieved or emptied at a time. A sized job is moved whether or
//! not it is preemptible: asking Allot to size it is asking Allot to place it (as a
//! Kubernetes VerticalPodAutoscaler evicts the pods it resizes); reclaim still never takes
//! a job that is not preemptible.

use super::{Decision, Job, Pass, Running, level_of};
use crate::placement::{Choice, GPU_MILLI};

/// A GPU of a node (its index there).
type Gpu = (usize, u8);

/// What moving a job costs beyond its share, in thousandths of a GPU: its restart (a
/// service is unreachable for it), as much as moving a twentieth of a GPU's requests.
const MOVE_COST_MILLI: u32 = 50;

impl Pass<'_> {
    /// What the jobs on GPU `g` of `node` hold now, in thousandths.
    fn held_on(&self, node: usize, g: u8) -> u32 {
        let free = self.cluster.nodes[node]
            .gpu_free
            .get(usize::from(g))
            .copied()
            .unwrap_or(0)
            + self.sealed.get(&(node, g)).copied().unwrap_or(0);
        GPU_MILLI.saturating_sub(free)
    }

    /// The forecast demand on GPU `g` of `node`: what its jobs hold, sized ones at what
    /// they want.
    pub(super) fn demand_on(&self, node: usize, g: u8) -> u32 {
        self.held_on(node, g) + self.occupancy.wanted_extra_on(node, g)
    }

    /// Whether GPU `g` of `node` runs work that is not best-effort.
    fn hosts_work(&self, node: usize, g: u8) -> bool {
        self.occupancy.jobs_on(node, g) > self.occupancy.best_effort_on(node, g)
    }

    /// What sized `job` wants of its GPU.
    fn wanted(job: &Job) -> u32 {
        job.sizing
            .map_or(job.request.gpu_milli, |s| s.wanted_milli)
            .max(job.request.gpu_milli)
    }

    /// Where sized `job` (queue `q`, at `level`) fits with the forecast demand after it at
    /// most `cap`: the GPU left with the least room (`pack`) or the most, then the node
    /// ranking first; only GPUs already running other work when `hosting`, never one of
    /// `exclude`.
    #[allow(clippy::too_many_arguments)]
    fn sized_fit(
        &self,
        job: &Job,
        q: usize,
        level: super::Isolation,
        cap: u32,
        pack: bool,
        hosting: bool,
        exclude: &[Gpu],
    ) -> Option<Choice> {
        let wanted = Self::wanted(job);
        self.share_candidates(job, q, level)
            .filter_map(|(i, g, _)| {
                let after = self.demand_on(i, g) + wanted;
                (after <= cap && (!hosting || self.hosts_work(i, g)) && !exclude.contains(&(i, g)))
                    .then_some((i, g, after))
            })
            .min_by_key(|&(i, g, after)| {
                (
                    if pack {
                        GPU_MILLI.saturating_sub(after)
                    } else {
                        after
                    },
                    self.cluster.rank[i],
                    i,
                    g,
                )
            })
            .map(|(node, g, _)| Choice {
                node,
                gpus: vec![g],
            })
    }

    /// Where a pending sized job goes: by its forecast with the per-GPU headroom left, else
    /// where its forecast finds the most room.
    pub(super) fn sized_room(
        &self,
        job: &Job,
        q: usize,
        level: super::Isolation,
    ) -> Option<Choice> {
        let cap = GPU_MILLI.saturating_sub(self.config.gpu_limits.sized_headroom_milli);
        self.sized_fit(job, q, level, cap, true, false, &[])
            .or_else(|| self.sized_fit(job, q, level, u32::MAX, false, false, &[]))
    }

    /// Running jobs holding a share of GPU `at`, by their index in `live`.
    fn sharing(&self, at: Gpu) -> Vec<(usize, &'_ Running)> {
        self.live
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (i, r)))
            .filter(|(_, r)| {
                r.job.request.is_shared()
                    && r.placements
                        .iter()
                        .any(|c| c.node == at.0 && c.gpus.contains(&at.1))
            })
            .collect()
    }

    /// Takes running job `live[i]` off `from` and, if `to` is given, holds it there for the
    /// rest of the pass; the decision says it moves.
    fn take_off(
        &mut self,
        i: usize,
        from: Gpu,
        to: Option<&Choice>,
        reason: String,
    ) -> Option<Decision> {
        let r = self.live.get_mut(i)?.take()?;
        if let Some(q) = self.tree.find(&r.job.queue) {
            let level = level_of(self.tree, &r.job, q);
            self.unhold(from.0, &[from.1], &r.job, q, level);
            match to {
                Some(to) => self.hold(to.node, &to.gpus, &r.job, q, level),
                None => self.usage.give_back(self.tree, q, &r.job.amounts()),
            }
        }
        Some(Decision::Move {
            job_id: r.job.id.clone(),
            from: Choice {
                node: from.0,
                gpus: vec![from.1],
            },
            share_milli: Self::wanted(&r.job),
            reason,
        })
    }

    /// Relieves the GPUs whose forecast demand outgrew them (the most outgrown first): by
    /// moving their best-effort work when that alone is enough, else their lowest-priority
    /// sized job that fits elsewhere with headroom. One move a GPU.
    pub(super) fn relieve_outgrown(&mut self, decisions: &mut Vec<Decision>) {
        let mut outgrown: Vec<(Gpu, u32)> = self
            .occupancy
            .wanting_more()
            .map(|(n, g)| ((n, g), self.demand_on(n, g)))
            .filter(|&(_, d)| d > GPU_MILLI)
            .collect();
        outgrown.sort_by_key(|&(at, d)| (std::cmp::Reverse(d), at));
        let cap = GPU_MILLI.saturating_sub(self.config.gpu_limits.sized_headroom_milli);
        for (at, demand) in outgrown {
            let on = self.sharing(at);
            let best_effort: Vec<usize> = on
                .iter()
                .filter(|(_, r)| r.job.best_effort)
                .map(|&(i, _)| i)
                .collect();
            let freed: u32 = on
                .iter()
                .filter(|(_, r)| r.job.best_effort)
                .map(|(_, r)| r.job.request.gpu_milli)
                .sum();
            // Relieved means the headroom is back: best-effort work moves first when its
            // leaving alone is enough for that (its share is the least there is, so in
            // practice when it holds more than that), else a sized job moves.
            if !best_effort.is_empty() && demand - freed <= cap {
                for i in best_effort {
                    let reason = format!(
                        "best-effort: moved off a GPU whose auto-sized jobs' forecast ({}) \
                         outgrew it",
                        milli(demand)
                    );
                    decisions.extend(self.take_off(i, at, None, reason));
                }
                continue;
            }
            // Only jobs that settled where they run: one started or moved a moment ago is
            // not moved again (it waits at its share meanwhile), or a GPU whose wants swing
            // would restart the same services pass after pass. The lowest priority first;
            // then the cheapest way to give the headroom back. A move
            // stops and starts the job, which costs a service in proportion to how fast its
            // requests come (about its share) plus a restart's worth: so the smallest job
            // whose leaving is enough, unless the smallest few together cost less (then
            // the smallest now, the next in the passes after).
            let excess = demand.saturating_sub(cap);
            let mut sized: Vec<(usize, i32, bool, u32)> = on
                .iter()
                .filter_map(|&(i, r)| {
                    let s = r.job.sizing.filter(|s| s.settled)?;
                    Some((i, r.job.priority, s.settled, Self::wanted(&r.job)))
                })
                .collect();
            sized.sort_by_key(|&(i, priority, settled, wanted)| (priority, !settled, wanted, i));
            if let Some(&(_, priority, settled, _)) = sized.first() {
                let peers: Vec<u32> = sized
                    .iter()
                    .filter(|&&(_, p, s, _)| (p, s) == (priority, settled))
                    .map(|&(_, _, _, w)| w)
                    .collect();
                let one = peers.iter().copied().find(|&w| w >= excess);
                let (mut few, mut n) = (0, 0u32);
                for &w in &peers {
                    if few >= excess {
                        break;
                    }
                    few += w;
                    n += 1;
                }
                let few_cost = few + n.saturating_sub(1) * MOVE_COST_MILLI;
                if let Some(w) = one
                    && w <= few_cost
                    && let Some(k) = sized
                        .iter()
                        .position(|&(_, p, s, x)| (p, s, x) == (priority, settled, w))
                {
                    // The one whose leaving is enough goes first.
                    let chosen = sized.remove(k);
                    sized.insert(0, chosen);
                }
            }
            for (i, _, _, wanted) in sized {
                let Some(r) = self.live[i] else { continue };
                let Some(q) = self.tree.find(&r.job.queue) else {
                    continue;
                };
                let level = level_of(self.tree, &r.job, q);
                // Where it would go, counted without it here.
                self.unhold(at.0, &[at.1], &r.job, q, level);
                let to = self.sized_fit(&r.job, q, level, cap, true, false, &[at]);
                self.hold(at.0, &[at.1], &r.job, q, level);
                let Some(to) = to else { continue };
                let reason = format!(
                    "moved: the auto-sized jobs on its GPU want {} of it ({} of that its own); \
                     to a GPU its forecast fits on with headroom",
                    milli(demand),
                    milli(wanted)
                );
                decisions.extend(self.take_off(i, at, Some(&to), reason));
                break;
            }
        }
    }

    /// Empties the GPU hosting sized work with the least forecast demand onto the other
    /// GPUs hosting work, when everything on it but best-effort work is sized and settled,
    /// and fits there with the headroom left. Only in a pass that placed and moved nothing
    /// else (what it placed is not among the running jobs it weighs).
    pub(super) fn consolidate(&mut self, decisions: &mut Vec<Decision>) {
        if decisions.iter().any(|d| {
            matches!(
                d,
                Decision::Move { .. } | Decision::Place { .. } | Decision::Preempt { .. }
            )
        }) {
            return;
        }
        let cap = GPU_MILLI.saturating_sub(self.config.gpu_limits.sized_headroom_milli);
        // Each GPU running work: whether everything on it is best-effort or a sized share
        // that settled (whole GPUs and shares their owners chose stay put).
        let mut sources: std::collections::HashMap<Gpu, bool> = std::collections::HashMap::new();
        for r in self.live.iter().flatten() {
            let movable = r.job.best_effort
                || r.job.request.is_shared() && r.job.sizing.is_some_and(|s| s.settled);
            for c in &r.placements {
                for &g in &c.gpus {
                    *sources.entry((c.node, g)).or_insert(true) &= movable;
                }
            }
        }
        let mut candidates: Vec<(u32, Gpu)> = sources
            .into_iter()
            .filter(|&(at, movable)| {
                movable && self.sharing(at).iter().any(|(_, r)| r.job.sizing.is_some())
            })
            .map(|(at, _)| (self.demand_on(at.0, at.1), at))
            .collect();
        candidates.sort_unstable();
        for (demand, at) in candidates {
            let mut sized: Vec<(usize, u32)> = self
                .sharing(at)
                .into_iter()
                .filter(|(_, r)| r.job.sizing.is_some())
                .map(|(i, r)| (i, Self::wanted(&r.job)))
                .collect();
            // The largest first: the hardest to fit.
            sized.sort_by_key(|&(i, wanted)| (std::cmp::Reverse(wanted), i));
            let mut trial: Vec<(usize, Choice)> = Vec::new();
            for &(i, _) in &sized {
                let Some(r) = self.live[i] else { break };
                let Some(q) = self.tree.find(&r.job.queue) else {
                    break;
                };
                let level = level_of(self.tree, &r.job, q);
                let Some(to) = self.sized_fit(&r.job, q, level, cap, true, true, &[at]) else {
                    break;
                };
                self.hold(to.node, &to.gpus, &r.job, q, level);
                trial.push((i, to));
            }
            if trial.len() == sized.len() {
                let n = trial.len();
                for (i, to) in trial {
                    // Held at its destination already: taken off its GPU only.
                    let reason = format!(
                        "moved: consolidating auto-sized work; the {n} sized job{} on its GPU \
                         ({} forecast) fit on the other GPUs hosting services, which frees it",
                        if n == 1 { "" } else { "s" },
                        milli(demand)
                    );
                    if let Some(r) = self.live[i]
                        && let Some(q) = self.tree.find(&r.job.queue)
                    {
                        let level = level_of(self.tree, &r.job, q);
                        self.unhold(to.node, &to.gpus, &r.job, q, level);
                    }
                    decisions.extend(self.take_off(i, at, Some(&to), reason));
                }
                return;
            }
            for (i, to) in trial {
                if let Some(r) = self.live[i]
                    && let Some(q) = self.tree.find(&r.job.queue)
                {
                    let level = level_of(self.tree, &r.job, q);
                    self.unhold(to.node, &to.gpus, &r.job, q, level);
                }
            }
        }
    }
}

/// Thousandths of a GPU as people read them.
fn milli(m: u32) -> String {
    format!("{:.3} GPU", f64::from(m) / f64::from(GPU_MILLI))
}

#[cfg(test)]
mod tests;
