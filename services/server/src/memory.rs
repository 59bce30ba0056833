//! What a leader's scheduling remembers between passes, kept in the database so that the
//! next leader carries on exactly where the last one stopped (a change of leader changes no
//! decision): the tenants' fair-share history, the scheduler's memory (the placement
//! policy's learned mix, the last job it was told of, its pass count) and the elastic
//! planner's burst state and demand history. Saved after every pass that changed it,
//! through the fence; taken up when a term's scheduling loop starts.
//!
//! What is not here is rebuilt from the nodes: the GPUs held back for jobs whose end a node
//! has not yet confirmed and the launches awaiting confirmation come from each node's first
//! heartbeat and re-subscription in the term (a node places nothing new until both:
//! `Hub::placeable`), and the heartbeat pacing count is taken before the term serves anyone.

use std::time::Duration;

use allot_scheduler::{LiveScheduler, SchedulerMemory};
use allot_store::{FairShareRepo, Fenced, LeaderMemoryRepo, LeaderMemoryWrite, Store};

use crate::elastic::{ElasticMemory, ElasticShares};

/// The names the parts are saved under.
const SCHEDULER: &str = "scheduler";
const ELASTIC: &str = "elastic";

/// What was last saved, so that only a change is written.
#[derive(Debug, Default)]
pub struct Saved {
    fair_share_at: Option<f64>,
    scheduler: Option<String>,
    elastic: Option<String>,
}

/// Takes up what the last leader saved: the fair-share history (the time since it was
/// recorded counted as what is held then, for at most `max_gap`: see
/// `allot_scheduler::fair_share::PastUsage::restore`), the scheduler's memory and the
/// elastic planner's. What cannot be read is started afresh, and said.
pub async fn take_up(
    store: &Store,
    scheduler: &mut LiveScheduler,
    elastic: Option<&ElasticShares>,
    max_gap: Duration,
) -> Saved {
    let mut saved = Saved::default();
    if scheduler.past_usage().is_some() {
        match store.fair_share_history().await {
            Ok(h) => {
                if let Some(at) = h.recorded_at {
                    let secs = |t: chrono::DateTime<chrono::Utc>| t.timestamp_millis() as f64 / 1e3;
                    let tenants = h.by_tenant.len();
                    scheduler.restore_past_usage(
                        h.by_tenant,
                        secs(at),
                        secs(store.clock().now()),
                        max_gap.as_secs_f64(),
                    );
                    saved.fair_share_at = Some(secs(at));
                    tracing::info!(tenants, recorded_at = %at, "fair-share history taken up");
                }
            }
            Err(e) => tracing::warn!(error = %e, "fair-share history not read; starting afresh"),
        }
    }
    if let Some(json) = read(store, SCHEDULER).await {
        match serde_json::from_str::<SchedulerMemory>(&json) {
            Ok(m) => {
                tracing::info!(passes = m.passes, "scheduler memory taken up");
                scheduler.take_up(m);
                saved.scheduler = Some(json);
            }
            Err(e) => tracing::warn!(error = %e, "scheduler memory unreadable; starting afresh"),
        }
    }
    if let Some(elastic) = elastic {
        let memory = match read(store, ELASTIC).await {
            Some(json) => match serde_json::from_str::<ElasticMemory>(&json) {
                Ok(m) => {
                    saved.elastic = Some(json);
                    Some(m)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "elastic memory unreadable; starting afresh");
                    None
                }
            },
            None => None,
        };
        elastic.take_up(memory);
    }
    saved
}

async fn read(store: &Store, name: &str) -> Option<String> {
    match store.leader_memory(name).await {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, part = name, "leader memory not read; starting afresh");
            None
        }
    }
}

/// What a leader remembers now, read at once (the scheduler is not held across a save).
pub struct Remembered {
    fair_share: Option<(f64, allot_store::FairShareHistory)>,
    scheduler: SchedulerMemory,
    elastic: Option<ElasticMemory>,
}

impl Remembered {
    pub fn of(scheduler: &LiveScheduler, elastic: Option<&ElasticShares>) -> Self {
        let fair_share = scheduler.past_usage().and_then(|past| {
            let at = past.recorded_at()?;
            Some((
                at,
                allot_store::FairShareHistory {
                    by_tenant: past.by_queue().clone(),
                    recorded_at: chrono::DateTime::from_timestamp_millis((at * 1e3) as i64),
                },
            ))
        });
        Self {
            fair_share,
            scheduler: scheduler.memory(),
            elastic: elastic.map(ElasticShares::memory),
        }
    }
}

/// Saves what changed since `saved`, through the fence (a deposed leader saves nothing).
pub async fn save(store: &Fenced, now: Remembered, saved: &mut Saved) {
    if let Some((at, history)) = now.fair_share
        && saved.fair_share_at != Some(at)
    {
        match store.save_fair_share_history(&history).await {
            Ok(()) => saved.fair_share_at = Some(at),
            Err(e) => tracing::warn!(error = %e, "fair-share history not saved"),
        }
    }
    write(store, SCHEDULER, &now.scheduler, &mut saved.scheduler).await;
    if let Some(elastic) = &now.elastic {
        write(store, ELASTIC, elastic, &mut saved.elastic).await;
    }
}

async fn write<T: serde::Serialize>(
    store: &Fenced,
    name: &str,
    value: &T,
    last: &mut Option<String>,
) {
    let json = match serde_json::to_string(value) {
        Ok(j) => j,
        Err(e) => {
            tracing::warn!(error = %e, part = name, "leader memory not serialised");
            return;
        }
    };
    if last.as_deref() == Some(json.as_str()) {
        return;
    }
    match store.save_leader_memory(name, &json).await {
        Ok(()) => *last = Some(json),
        Err(e) => tracing::warn!(error = %e, part = name, "leader memory not saved"),
    }
}
