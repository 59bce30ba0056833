//! Queue places: where each pending job stands in its tenant's queue, in the engine's
//! age order.

use super::*;

/// The engine's age order: work that already ran and was interrupted (requeued after a
/// lost node or a preemption) first, then by submission.
pub(super) fn age_order(a: &StoredJob, b: &StoredJob) -> std::cmp::Ordering {
    (a.attempt <= 1)
        .cmp(&(b.attempt <= 1))
        .then(a.created_at.cmp(&b.created_at))
        .then(a.id.cmp(&b.id))
}

/// A pending job's place in its tenant's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePlace {
    /// 1 for the job the scheduler takes next from this queue.
    pub position: u64,
    /// How many of the tenant's jobs wait in it.
    pub length: u64,
}

/// Each of `pending`'s jobs' place in its tenant's queue, in the order in which the
/// engine takes a tenant's jobs: higher priority first, then the older (interrupted work
/// before new). Which tenant's queue goes next is decided on each pass, by guarantees,
/// priority and fair share, so this is a place in one queue, not in the fleet's.
pub fn queue_places(pending: &[StoredJob]) -> HashMap<String, QueuePlace> {
    let mut queues: HashMap<&str, Vec<&StoredJob>> = HashMap::new();
    // A gang waits as one job: its replica 0.
    for j in pending
        .iter()
        .filter(|j| j.replica.as_ref().is_none_or(|r| r.rank == 0))
    {
        queues.entry(j.tenant_id.as_str()).or_default().push(j);
    }
    let mut places = HashMap::with_capacity(pending.len());
    for queue in queues.values_mut() {
        queue.sort_by(|a, b| {
            b.spec
                .priority
                .cmp(&a.spec.priority)
                .then_with(|| age_order(a, b))
        });
        let length = queue.len() as u64;
        for (i, j) in queue.iter().enumerate() {
            places.insert(
                j.id.clone(),
                QueuePlace {
                    position: i as u64 + 1,
                    length,
                },
            );
        }
    }
    places
}
