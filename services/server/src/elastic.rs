//! Elastic shares in the scheduling loop (`--elastic`): each pass, the fleet and every
//! workload class's jobs go to `allot_elastic::live::plan`, whose preemptions are made
//! (with the policy's grace period, for jobs to checkpoint) and whose held-back classes'
//! pending jobs wait with the reason. Demand is recorded for the forecast that moves
//! capacity ahead of window changes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use allot_domain::{Job, JobState, Node, NodeStatus};
use allot_elastic::ElasticPolicy;
use allot_elastic::live::{BurstState, ClassLoad, DemandHistory, Plan, Victim, plan};
use chrono::{DateTime, Utc};

/// The policy and what it remembers between passes.
pub struct ElasticShares {
    policy: ElasticPolicy,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    memory: ElasticMemory,
    /// The last pass's plan and forecast error, for the metrics.
    last: Option<(Plan, BTreeMap<String, f64>)>,
}

/// What the planner remembers between passes: the burst's state and the demand history. A
/// leader keeps it in the database (`allot_store::LeaderMemoryRepo`) and a new one takes it
/// up, so the burst and the forecast carry on across a change of leader.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ElasticMemory {
    burst: BurstState,
    history: DemandHistory,
    last_recorded: Option<DateTime<Utc>>,
}

/// GPUs that take work: whole GPUs (not in MIG mode) on ready nodes, healthy and not
/// drained.
fn fleet(nodes: &[Node], now: DateTime<Utc>) -> f64 {
    nodes
        .iter()
        .filter(|n| n.status(now) == NodeStatus::Ready && n.takes_work())
        .flat_map(|n| {
            n.gpus.iter().filter(move |g| {
                g.healthy && !g.degraded && g.mig.is_none() && !n.drained_gpus.contains(&g.uuid)
            })
        })
        .count() as f64
}

impl ElasticShares {
    pub fn new(policy: ElasticPolicy) -> Self {
        ElasticShares {
            policy,
            state: Mutex::new(State::default()),
        }
    }

    /// Seconds a preempted job gets to checkpoint before it is killed.
    pub fn grace_seconds(&self) -> u32 {
        self.policy.preemption.grace_seconds
    }

    /// This pass's plan for the jobs holding capacity and those pending.
    pub fn plan(
        &self,
        now: DateTime<Utc>,
        nodes: &[Node],
        holding: &[Job],
        pending: &[Job],
    ) -> Plan {
        let mut classes: BTreeMap<String, ClassLoad> = BTreeMap::new();
        for j in holding {
            let Some(class) = j.spec.class else {
                continue;
            };
            let load = classes.entry(class.as_str().to_owned()).or_default();
            let gpus = j.gpu_equivalents();
            if j.preempt_reason.is_some() {
                load.leaving += gpus;
                continue;
            }
            load.held += gpus;
            if j.spec.preemptible && j.state == JobState::Running {
                load.preemptible.push(Victim {
                    job_id: j.id.clone(),
                    gpus,
                    priority: j.spec.priority,
                    started_at: j.started_at.unwrap_or(j.created_at),
                });
            }
        }
        for j in pending {
            let Some(class) = j.spec.class else {
                continue;
            };
            let load = classes.entry(class.as_str().to_owned()).or_default();
            load.pending += j.gpu_equivalents();
            load.oldest_pending_since = Some(
                load.oldest_pending_since
                    .map_or(j.created_at, |t| t.min(j.created_at)),
            );
        }
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State {
            memory: state,
            last,
        } = &mut *guard;
        // Demand at most once a minute: the history is hourly.
        if state
            .last_recorded
            .is_none_or(|t| now - t >= chrono::Duration::minutes(1))
        {
            let demand = classes
                .iter()
                .map(|(c, l)| (c.clone(), l.held + l.pending))
                .collect();
            state.history.record(now, &demand);
            state.last_recorded = Some(now);
        }
        let forecast = state.history.forecast(now);
        let fleet = fleet(nodes, now);
        let p = plan(
            &self.policy,
            now,
            fleet,
            &classes,
            &forecast,
            &mut state.burst,
        );
        let error = state.history.forecast_error(now);
        *last = Some((p.clone(), error));
        p
    }

    /// What the planner remembers now.
    pub fn memory(&self) -> ElasticMemory {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .memory
            .clone()
    }

    /// Carries on from `memory` (a new term's leader, from what the last one saved); with
    /// none saved, from nothing: what this process remembers of an earlier term of its own
    /// is stale.
    pub fn take_up(&self, memory: Option<ElasticMemory>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.memory = memory.unwrap_or_default();
        state.last = None;
    }

    /// The last plan and the forecast error per class, for the metrics.
    pub fn last(&self) -> Option<(Plan, BTreeMap<String, f64>)> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last
            .clone()
    }
}
