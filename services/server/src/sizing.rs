//! Auto-sized jobs on the leader (`--gpus auto`, `--gpu-memory auto`): each running sized
//! job's samples, from its node's heartbeats, feed an [`allot_sizing::Sizer`]; every second
//! the sizers decide, and what they decide is made as any resize is ([`Resizer`]): checked
//! against its GPU's other jobs and its tenants' hard limits, stored with its reason and
//! figures in the job's history and the audit log, and sent to the node.
//!
//! What each job wants and whether its forecast has settled go to the scheduling passes
//! ([`Sizing::forecasts`]), which place and move sized jobs by them
//! (`allot_scheduler::engine::forecast`); a growth that finds no room wakes a pass.
//!
//! The samples live in the leader's memory: a new leader starts its windows again, and a
//! new attempt too (keeping its daily pattern); a job then keeps its share until enough
//! samples say otherwise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_domain::{AuditContext, Job, JobState, Share};
use allot_sizing::{Bounds, Decision, Holding, Policy, Sample, Sizer};
use allot_store::{Fenced, JobFilter, JobRepo, NodeRepo, TenantScope};
use tokio_util::sync::CancellationToken;

use crate::resizing::{Refused, Resizer};

/// How often the sizers decide.
const EVERY: Duration = Duration::from_secs(1);

/// A refused resize is tried again after at least this long (and a settle of the rules).
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// How the leader sizes auto-sized jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rules {
    /// By forecast: `allot_sizing`'s rules (the product).
    #[default]
    Forecast,
    /// On the last sample alone, with no headroom, no hysteresis and no daily term: the
    /// negative control benchmarks measure the rules against. Its jobs never count as
    /// settled (nothing is consolidated on a last sample); they are still moved when their
    /// GPU's wants outgrow it.
    LastSample,
    /// Not at all: sized jobs keep the share they started at (a benchmark's control).
    Off,
}

impl Rules {
    /// The policy these rules size by, from the product's `policy`.
    pub fn policy(self, policy: Policy) -> Policy {
        match self {
            Rules::Forecast | Rules::Off => policy,
            Rules::LastSample => policy.on_the_last_sample(),
        }
    }
}

/// The sized jobs' sizers.
pub struct Sizing {
    policy: Policy,
    rules: Rules,
    origin: Instant,
    jobs: Mutex<HashMap<String, Tracked>>,
}

struct Tracked {
    attempt: u32,
    sizer: Sizer,
    /// Not before this is a refused resize asked again.
    retry_at: Option<Instant>,
    /// The share it wants and was not given (no room): what the passes place it by.
    wanted: Option<u32>,
}

impl Tracked {
    fn new(attempt: u32) -> Self {
        Self {
            attempt,
            sizer: Sizer::new(),
            retry_at: None,
            wanted: None,
        }
    }
}

impl Sizing {
    pub fn new(policy: Policy, rules: Rules) -> Self {
        Self {
            policy: rules.policy(policy),
            rules,
            origin: Instant::now(),
            jobs: Mutex::new(HashMap::new()),
        }
    }

    /// What each tracked job wants of its GPU and whether its forecast has settled, for
    /// the scheduling passes (`None` under [`Rules::Off`]: nothing is sized).
    pub fn forecasts(
        &self,
        now: Instant,
    ) -> Option<HashMap<String, allot_scheduler::engine::Sizing>> {
        if self.rules == Rules::Off {
            return None;
        }
        let at = self.at(now);
        let forecasts = self
            .lock()
            .iter()
            .map(|(id, t)| {
                (
                    id.clone(),
                    allot_scheduler::engine::Sizing {
                        wanted_milli: t.wanted.unwrap_or(0),
                        settled: self.has_settled(t, at),
                    },
                )
            })
            .collect();
        Some(forecasts)
    }

    /// Whether a scheduling pass should weigh the sized jobs now: one wants room it was
    /// not given, or one has settled (it may be consolidated).
    pub fn due(&self, now: Instant) -> bool {
        if self.rules == Rules::Off {
            return false;
        }
        let at = self.at(now);
        self.lock()
            .values()
            .any(|t| t.wanted.is_some() || self.has_settled(t, at))
    }

    /// Whether the job's forecast has settled where it runs (it may be consolidated): never
    /// under [`Rules::LastSample`], whose last sample is no forecast to pack by.
    fn has_settled(&self, t: &Tracked, at: Duration) -> bool {
        self.rules == Rules::Forecast && t.sizer.settled(at, &self.policy)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.origin)
    }

    /// A node's samples of its jobs (`on_node`: what the record places there): those of
    /// its running sized jobs are taken in.
    pub fn observe(&self, on_node: &[Job], samples: &[allot_proto::v1::JobSample], now: Instant) {
        let at = self.at(now);
        let mut jobs = self.lock();
        for s in samples {
            let Some(job) = on_node.iter().find(|j| {
                j.id == s.job_id && j.state == JobState::Running && j.spec.gpu_sizing.is_sized()
            }) else {
                continue;
            };
            if !(s.utilization.is_finite() && s.held_back.is_finite()) {
                continue;
            }
            let tracked = jobs
                .entry(job.id.clone())
                .or_insert_with(|| Tracked::new(job.attempt));
            // A new attempt is measured from its start (its daily pattern kept).
            if tracked.attempt != job.attempt {
                let sizer = tracked.sizer.restarted();
                *tracked = Tracked {
                    sizer,
                    ..Tracked::new(job.attempt)
                };
            }
            tracked.sizer.observe_under(
                Sample {
                    at,
                    busy: f64::from(s.utilization),
                    held_back: f64::from(s.held_back),
                    memory_bytes: s.memory_used_bytes,
                },
                &self.policy,
            );
        }
    }

    /// What each running sized job should hold now: (job id, what was decided, the GPU
    /// memory it keeps when its memory is not sized).
    fn decide(
        &self,
        running: &[Job],
        gpu_memory: &HashMap<String, u64>,
        now: Instant,
    ) -> Vec<(String, Decision, Option<u64>)> {
        let at = self.at(now);
        let mut jobs = self.lock();
        jobs.retain(|id, t| {
            running
                .iter()
                .any(|j| j.id == *id && j.attempt == t.attempt)
        });
        let mut decided = Vec::new();
        for job in running {
            let Some(tracked) = jobs.get_mut(&job.id) else {
                continue;
            };
            if tracked.retry_at.is_some_and(|t| now < t) {
                continue;
            }
            let Some(gpu) = job.gpu_uuids.first().and_then(|u| gpu_memory.get(u)) else {
                continue;
            };
            let share = job.share();
            let milli = share.gpu_milli;
            let holding = Holding {
                gpu_milli: milli,
                memory_bytes: share.memory_on(*gpu),
            };
            let sizing = job.spec.gpu_sizing;
            let bounds = Bounds {
                // A share that is not sized stays where it is.
                max_milli: sizing.max_milli.unwrap_or(milli),
                max_memory_bytes: *gpu,
                memory: sizing.memory,
            };
            let Some(mut d) = tracked.sizer.decide(at, holding, bounds, &self.policy) else {
                continue;
            };
            if sizing.max_milli.is_none() {
                d.gpu_milli = milli;
            }
            if d.gpu_milli == holding.gpu_milli && d.memory_bytes == holding.memory_bytes {
                continue;
            }
            let kept_memory = (!sizing.memory).then_some(share.gpu_memory_bytes);
            decided.push((job.id.clone(), d, kept_memory));
        }
        decided
    }

    /// `wanted` was decided and `applied` at `now` (granted its share, or less), or
    /// refused (asked again later); what it wants and was not given is remembered.
    fn settled(&self, job_id: &str, wanted: &Decision, applied: Option<&Decision>, now: Instant) {
        let retry = RETRY_AFTER.max(self.policy.settle);
        if let Some(t) = self.lock().get_mut(job_id) {
            let short = applied.map_or(wanted.from.gpu_milli, |d| d.gpu_milli);
            t.wanted = (wanted.gpu_milli > short).then_some(wanted.gpu_milli);
            match applied {
                Some(d) => {
                    t.sizer.applied(self.at(now), d);
                    t.retry_at = None;
                }
                None => t.retry_at = Some(now + retry),
            }
        }
    }
}

/// What to try for a decision, largest first, each with its own reason: a growth that does
/// not fit is tried smaller, down to a step above what the job holds. `memory`: whether the
/// job's memory is sized, else the bytes it keeps.
fn candidates(d: &Decision, memory: Option<u64>) -> Vec<(Share, Decision)> {
    let share = |d: &Decision| Share {
        gpu_milli: d.gpu_milli,
        gpu_memory_bytes: memory.unwrap_or(d.memory_bytes),
    };
    let mut tried = vec![(share(d), *d)];
    let from = d.from.gpu_milli;
    if d.gpu_milli > from {
        let step = (d.gpu_milli - from).div_ceil(4).max(1);
        let mut m = d.gpu_milli;
        while m > from + step {
            m -= step;
            let smaller = d.granted(m);
            tried.push((share(&smaller), smaller));
        }
    }
    tried
}

/// Decides every second while this replica leads (its term's `store`), until `stop`.
pub async fn run(
    sizing: Arc<Sizing>,
    resizer: Arc<Resizer>,
    store: Fenced,
    stop: CancellationToken,
) {
    let ctx = AuditContext::system("sizing");
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if sizing.lock().is_empty() {
            continue;
        }
        let running = match store
            .list_jobs(JobFilter {
                states: vec![JobState::Running],
                ..JobFilter::new(TenantScope::All)
            })
            .await
        {
            Ok(list) => list.jobs,
            Err(e) => {
                tracing::warn!(error = %e, "sizing: running jobs not read");
                continue;
            }
        };
        let running: Vec<Job> = running
            .into_iter()
            .filter(|j| j.spec.gpu_sizing.is_sized())
            .collect();
        let gpu_memory: HashMap<String, u64> = match store.list_nodes().await {
            Ok(nodes) => nodes
                .into_iter()
                .flat_map(|n| n.gpus.into_iter().map(|g| (g.uuid, g.memory_bytes)))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "sizing: nodes not read");
                continue;
            }
        };
        if sizing.rules == Rules::Off {
            continue;
        }
        for (id, decision, kept_memory) in sizing.decide(&running, &gpu_memory, Instant::now()) {
            let tried = candidates(&decision, kept_memory);
            let asks: Vec<(Share, Option<String>)> = tried
                .iter()
                .map(|(share, d)| (*share, Some(d.to_string())))
                .collect();
            match resizer.resize(&store, &ctx, &id, &asks).await {
                Ok((job, i)) => {
                    let applied = &tried[i].1;
                    tracing::info!(job = %id, gpu_milli = job.share().gpu_milli, why = %applied, "auto-sized");
                    sizing.settled(&id, &decision, Some(applied), Instant::now());
                    if i > 0 {
                        // Granted less than it wants: a pass may give it room elsewhere.
                        resizer.notify.notify_one();
                    }
                }
                Err(Refused::NoRoom(reason)) => {
                    tracing::info!(job = %id, wanted = %decision, %reason, "auto-size held back: no room");
                    sizing.settled(&id, &decision, None, Instant::now());
                    resizer.notify.notify_one();
                }
                Err(Refused::NotHolding(_)) => {}
                Err(Refused::Store(e)) => {
                    tracing::warn!(job = %id, error = %e, "auto-size not stored");
                    sizing.settled(&id, &decision, None, Instant::now());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_sizing::Reason;

    #[test]
    fn a_growth_that_does_not_fit_is_tried_smaller_each_saying_what_it_grants() {
        let d = Decision {
            gpu_milli: 650,
            memory_bytes: 7,
            reason: Reason::HeldBack { held_back: 0.5 },
            forecast_milli: 900,
            held_back: 0.5,
            peak_memory_bytes: 1,
            samples: 3,
            span: Duration::from_secs(2),
            from: allot_sizing::Holding {
                gpu_milli: 250,
                memory_bytes: 7,
            },
        };
        let tried = candidates(&d, None);
        let got: Vec<u32> = tried.iter().map(|(s, _)| s.gpu_milli).collect();
        assert_eq!(got, vec![650, 550, 450, 350]);
        assert!(
            tried
                .iter()
                .all(|(s, d)| s.gpu_memory_bytes == 7 && s.gpu_milli == d.gpu_milli)
        );
        assert!(
            tried[1].1.to_string().contains("0.250 → 0.550"),
            "{}",
            tried[1].1
        );
        let fixed = candidates(&d, Some(3));
        assert!(fixed.iter().all(|(s, _)| s.gpu_memory_bytes == 3));
        let down = d.granted(100);
        assert_eq!(candidates(&down, None).len(), 1);
    }
}
