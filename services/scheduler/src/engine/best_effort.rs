//! The best-effort class: spread over what guaranteed and borrowed work leaves.

use super::*;
use crate::placement::Choice;

impl Pass<'_> {
    /// Best-effort work spreads over the room others leave: where a GPU that could take a
    /// best-effort job runs none while another runs two or more, the latest started of
    /// those (that ran the minimum time) is stopped and requeued, to be placed again by the
    /// best-effort rule (the GPU with the fewest). Room appears as jobs end or shrink after
    /// best-effort work was placed. One a pass: the next pass sees where it went.
    pub(super) fn spread_best_effort(&mut self, decisions: &mut Vec<Decision>) {
        let stacked = |r: &Running| {
            r.job.best_effort
                && r.placements.iter().any(|c| {
                    c.gpus
                        .iter()
                        .any(|&g| self.occupancy.best_effort_on(c.node, g) >= 2)
                })
        };
        let mut candidates: Vec<(usize, &Running)> = self
            .live
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (i, r)))
            .filter(|(_, r)| stacked(r) && self.now - r.started_at >= self.config.min_runtime_secs)
            .collect();
        candidates.sort_by_key(|(_, r)| {
            (
                std::cmp::Reverse(r.started_at),
                std::cmp::Reverse(r.job.seq),
            )
        });
        for (i, r) in candidates {
            let Some(q) = self.tree.find(&r.job.queue) else {
                continue;
            };
            let level = level_of(self.tree, &r.job, q);
            let Some(to) = self.best_effort_room(&r.job, q, level) else {
                continue;
            };
            if to
                .gpus
                .iter()
                .any(|&g| self.occupancy.best_effort_on(to.node, g) > 0)
            {
                continue;
            }
            for c in &r.placements {
                self.unhold(c.node, &c.gpus, &r.job, q, level);
            }
            self.usage.give_back(self.tree, q, &r.job.amounts());
            self.live[i] = None;
            decisions.push(Decision::Preempt {
                job_id: r.job.id.clone(),
                for_job: None,
                reason: "best-effort: moved to a GPU that runs no best-effort work (it shared \
                         its GPU with other best-effort work)"
                    .to_owned(),
            });
            return;
        }
    }

    /// Where best-effort `job` goes: of the GPUs it may take, the one with the fewest
    /// best-effort jobs, then the most compute free (what its other jobs leave idle), then
    /// the node that ranks first.
    pub(super) fn best_effort_room(&self, job: &Job, q: usize, level: Isolation) -> Option<Choice> {
        self.share_candidates(job, q, level)
            .min_by_key(|&(i, g, free)| {
                (
                    self.occupancy.best_effort_on(i, g),
                    std::cmp::Reverse(free),
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
}
