//! When pending jobs are estimated to start, as Slurm's `squeue --start` says it: running
//! jobs end at their time limits, and pending jobs, taken in order (priority, then age with
//! interrupted work first), start on the first node whose GPUs are free for as long as
//! their own limit, within their tenant's and its parents' GPU limits, reserving both. GPUs
//! and GPU limits only: guarantees, fair share between tenants and preemption can move a
//! start either way; a job behind one without a time limit gets no estimate (nobody knows
//! when it ends), nor does one held back by a spent budget or an elastic share. A gang's
//! pending replicas are estimated together: one start for all, when every replica has room
//! at once (as the engine places them, all or none). Pure: the
//! store's nodes, tenants and jobs in, times out.

use std::collections::HashMap;

use allot_domain::{GPU_MILLI, Job, Node, NodeStatus, Tenant};
use chrono::{DateTime, Utc};

use crate::admission::model_key;

/// Pending jobs estimated at most, in order: the rest are too far back to say.
pub const MAX_ESTIMATED: usize = 200;

/// What a GPU holds over time: (from, until (none: no end known), milli).
#[derive(Debug, Default)]
struct Timeline(Vec<(DateTime<Utc>, Option<DateTime<Utc>>, u64)>);

impl Timeline {
    /// The most held at any moment of `[from, until)` (`until` none: from on, for ever).
    fn peak(&self, from: DateTime<Utc>, until: Option<DateTime<Utc>>) -> u64 {
        let overlaps = |s: DateTime<Utc>, e: Option<DateTime<Utc>>| {
            e.is_none_or(|e| e > from) && until.is_none_or(|u| s < u)
        };
        let mut moments = vec![from];
        moments.extend(
            self.0
                .iter()
                .filter(|(s, e, _)| *s > from && overlaps(*s, *e))
                .map(|(s, _, _)| *s),
        );
        moments
            .into_iter()
            .map(|t| {
                self.0
                    .iter()
                    .filter(|(s, e, _)| *s <= t && e.is_none_or(|e| e > t))
                    .map(|(_, _, m)| m)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }
}

struct Gpu {
    model: String,
    held: Timeline,
}

/// When each of `pending`'s jobs that asks for GPUs is estimated to start, given the
/// `nodes` and the jobs `holding` GPUs now; jobs with no estimate are left out.
pub fn start_estimates(
    nodes: &[Node],
    tenants: &[Tenant],
    holding: &[Job],
    pending: &[Job],
    now: DateTime<Utc>,
) -> HashMap<String, DateTime<Utc>> {
    // Each tenant and its parents that limit GPUs: what their jobs hold over time.
    let chain = |tenant: &str| -> Vec<usize> {
        let mut out = Vec::new();
        let mut at = tenants.iter().position(|t| t.id == tenant);
        while let Some(i) = at {
            if out.contains(&i) {
                break;
            }
            out.push(i);
            at = tenants[i]
                .parent_id
                .as_ref()
                .and_then(|p| tenants.iter().position(|t| t.id == *p));
        }
        out.retain(|&i| tenants[i].quota.limit.gpu_milli.is_some());
        out
    };
    let mut quota: Vec<Timeline> = tenants.iter().map(|_| Timeline::default()).collect();
    // Nodes that take work, and their GPUs that do (not in MIG mode, healthy, not drained).
    let mut fleet: Vec<(String, Vec<(String, Gpu)>)> = nodes
        .iter()
        .filter(|n| n.status(now) == NodeStatus::Ready && n.takes_work())
        .map(|n| {
            let gpus = n
                .gpus
                .iter()
                .filter(|g| {
                    g.mig.is_none() && g.health(n.drained_gpus.contains(&g.uuid)) == "healthy"
                })
                .map(|g| {
                    (
                        g.uuid.clone(),
                        Gpu {
                            model: model_key(&g.model),
                            held: Timeline::default(),
                        },
                    )
                })
                .collect();
            (n.id.clone(), gpus)
        })
        .collect();
    let limit = |j: &Job| j.spec.time_limit();
    // What runs now holds its GPUs until its limit from its start.
    let mut ends: Vec<DateTime<Utc>> = Vec::new();
    for j in holding {
        let until = limit(j).map(|l| (j.started_at.unwrap_or(now) + l).max(now));
        ends.extend(until);
        let held = u64::from(j.spec.gpus) * u64::from(j.share().gpu_milli);
        for i in chain(&j.tenant_id) {
            quota[i].0.push((now, until, held));
        }
        for (_, gpus) in fleet
            .iter_mut()
            .filter(|(id, _)| j.node_id.as_deref() == Some(id))
        {
            for (uuid, gpu) in gpus.iter_mut() {
                if j.gpu_uuids.iter().any(|u| u == uuid) {
                    gpu.held
                        .0
                        .push((now, until, u64::from(j.share().gpu_milli)));
                }
            }
        }
    }
    let mut order: Vec<&Job> = pending.iter().collect();
    order.sort_by(|a, b| {
        b.spec
            .priority
            .cmp(&a.spec.priority)
            .then_with(|| (a.attempt <= 1).cmp(&(b.attempt <= 1)))
            .then_with(|| a.created_at.cmp(&b.created_at))
            .then_with(|| a.id.cmp(&b.id))
    });
    // A gang's pending replicas start together: one unit, where its first replica stands.
    let mut units: Vec<Vec<&Job>> = Vec::new();
    let mut gang_unit: HashMap<&str, usize> = HashMap::new();
    for job in order.into_iter().take(MAX_ESTIMATED) {
        match &job.replica {
            Some(r) => match gang_unit.get(r.gang_id.as_str()) {
                Some(&u) => units[u].push(job),
                None => {
                    gang_unit.insert(r.gang_id.as_str(), units.len());
                    units.push(vec![job]);
                }
            },
            None => units.push(vec![job]),
        }
    }
    let mut out = HashMap::new();
    for unit in units {
        let job = unit[0];
        let held_back = job
            .pending_reason
            .as_ref()
            .is_some_and(|r| matches!(r.code.as_str(), "BudgetExhausted" | "ElasticShare"));
        if job.spec.gpus == 0 || job.spec.mig_profile.is_some() || held_back {
            continue;
        }
        let need = job.spec.gpus as usize;
        let share = u64::from(job.share().gpu_milli);
        let total = need as u64 * share * unit.len() as u64;
        let limits = chain(&job.tenant_id);
        let wanted: Vec<String> = job.spec.gpu_models.iter().map(|m| model_key(m)).collect();
        let runs = limit(job);
        let earliest = job.retry_at.map_or(now, |r| r.max(now));
        let mut times: Vec<DateTime<Utc>> = std::iter::once(earliest)
            .chain(ends.iter().copied().filter(|e| *e > earliest))
            .collect();
        times.sort_unstable();
        times.dedup();
        let found = times.iter().find_map(|&t| {
            let until = runs.map(|r| t + r);
            let within = limits.iter().all(|&i| {
                let cap = tenants[i].quota.limit.gpu_milli.unwrap_or(u64::MAX);
                quota[i].peak(t, until) + total <= cap
            });
            if !within {
                return None;
            }
            // Every replica on some node at once, each seeing what the ones before took.
            let mut placed: Vec<(usize, Vec<usize>)> = Vec::with_capacity(unit.len());
            for _ in &unit {
                let room = fleet.iter().enumerate().find_map(|(n, (_, gpus))| {
                    let fits: Vec<usize> = gpus
                        .iter()
                        .enumerate()
                        .filter(|(_, (_, g))| wanted.is_empty() || wanted.contains(&g.model))
                        .filter(|(i, (_, g))| {
                            let taken = placed
                                .iter()
                                .filter(|(pn, pg)| *pn == n && pg.contains(i))
                                .count() as u64;
                            g.held.peak(t, until) + (taken + 1) * share <= u64::from(GPU_MILLI)
                        })
                        .map(|(i, _)| i)
                        .take(need)
                        .collect();
                    (fits.len() == need).then_some((n, fits))
                });
                placed.push(room?);
            }
            Some((t, until, placed))
        });
        let Some((t, until, placed)) = found else {
            // Nothing frees in time that anyone knows of: it and whoever it would block
            // are not estimated; those behind may still fit elsewhere.
            continue;
        };
        for (n, fits) in placed {
            for i in fits {
                fleet[n].1[i].1.held.0.push((t, until, share));
            }
        }
        for &i in &limits {
            quota[i].0.push((t, until, total));
        }
        ends.extend(until);
        for replica in unit {
            out.insert(replica.id.clone(), t);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{node, now, pending_job, tenant};
    use allot_domain::JobState;
    use chrono::Duration;

    fn job(id: &str, gpus: u32, limit: Option<u64>, minutes_ago: i64) -> Job {
        let mut j = pending_job(id, "t", gpus, None);
        j.spec.time_limit_secs = limit;
        j.created_at = now() - Duration::minutes(minutes_ago);
        j
    }

    fn running(mut j: Job, n: &Node, gpus: &[usize], started_minutes_ago: i64) -> Job {
        j.state = JobState::Running;
        j.node_id = Some(n.id.clone());
        j.gpu_uuids = gpus.iter().map(|&i| n.gpus[i].uuid.clone()).collect();
        j.started_at = Some(now() - Duration::minutes(started_minutes_ago));
        j
    }

    #[test]
    fn jobs_start_as_running_ones_reach_their_limits_in_order() {
        let n = node("n1", &["H200", "H200"]);
        // Both GPUs held: one for 10 more minutes, one for 30.
        let holding = [
            running(job("a", 1, Some(20 * 60), 90), &n, &[0], 10),
            running(job("b", 1, Some(40 * 60), 90), &n, &[1], 10),
        ];
        // First in line: one GPU for an hour; then two GPUs; then one more GPU.
        let pending = [
            job("first", 1, Some(3600), 30),
            job("pair", 2, Some(600), 20),
            job("last", 1, Some(600), 10),
        ];
        let est = start_estimates(std::slice::from_ref(&n), &[], &holding, &pending, now());
        assert_eq!(est["first"], now() + Duration::minutes(10), "on a's GPU");
        // Both GPUs are free together only after `first` ends (10 + 60 minutes).
        assert_eq!(est["pair"], now() + Duration::minutes(70));
        // b's GPU is free from 30 minutes until `pair` takes it at 70: room for 10.
        assert_eq!(est["last"], now() + Duration::minutes(30), "backfilled");
    }

    #[test]
    fn a_job_behind_one_without_a_limit_gets_no_estimate() {
        let n = node("n1", &["H200"]);
        let holding = [running(job("forever", 1, None, 90), &n, &[0], 5)];
        let pending = [job("waits", 1, Some(60), 1)];
        let est = start_estimates(std::slice::from_ref(&n), &[], &holding, &pending, now());
        assert!(est.is_empty(), "{est:?}");
    }

    #[test]
    fn a_free_gpu_of_the_wanted_model_means_now() {
        let h = node("h", &["H200"]);
        let t4 = node("t4", &["T4"]);
        let holding = [running(job("busy", 1, None, 90), &h, &[0], 5)];
        let mut wants_t4 = job("small", 1, Some(60), 1);
        wants_t4.spec.gpu_models = vec!["NVIDIA T4".into()];
        let est = start_estimates(&[h, t4], &[], &holding, &[wants_t4], now());
        assert_eq!(est["small"], now());
    }

    #[test]
    fn a_job_at_its_tenants_limit_starts_when_its_tenant_has_room() {
        let n = node("n1", &["H200", "H200", "H200"]);
        let mut t = tenant("t", 0);
        t.quota.limit.gpu_milli = Some(1000);
        // One GPU of t's one runs for 20 more minutes; two GPUs stand free.
        let holding = [running(job("a", 1, Some(30 * 60), 90), &n, &[0], 10)];
        let pending = [job("next", 1, Some(600), 5)];
        let est = start_estimates(std::slice::from_ref(&n), &[t], &holding, &pending, now());
        assert_eq!(
            est["next"],
            now() + Duration::minutes(20),
            "free GPUs, but not within t's limit until a ends"
        );
    }

    #[test]
    fn a_gangs_replicas_start_together_when_all_have_room() {
        let (a, b) = (node("a", &["H200"]), node("b", &["H200"]));
        // a's GPU frees in 10 minutes, b's in 40.
        let holding = [
            running(job("x", 1, Some(20 * 60), 90), &a, &[0], 10),
            running(job("y", 1, Some(50 * 60), 90), &b, &[0], 10),
        ];
        let replica = |id: &str, rank: u32| {
            let mut j = job(id, 1, Some(600), 30);
            j.replica = Some(allot_domain::Replica {
                gang_id: "g".into(),
                rank,
            });
            j
        };
        let pending = [
            replica("g", 0),
            replica("g-1", 1),
            job("solo", 1, Some(600), 5),
        ];
        let est = start_estimates(&[a, b], &[], &holding, &pending, now());
        // Alone, replica 0 would start on a in 10 minutes; the gang needs both GPUs.
        assert_eq!(est["g"], now() + Duration::minutes(40));
        assert_eq!(est["g-1"], now() + Duration::minutes(40));
        // The single job behind it fits on a before the gang needs it.
        assert_eq!(est["solo"], now() + Duration::minutes(10), "backfilled");
    }
}
