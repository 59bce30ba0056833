//! Heartbeats in groups: what the nodes' heartbeats write (lease renewals, inventories that
//! changed, GPU samples) while the previous group commits is written together, in one
//! transaction, so thousands of nodes cost a few commits a second instead of one (and a
//! statement per GPU sample) each.

use allot_domain::GpuDevice;
use chrono::{DateTime, Utc};
use sea_orm::sea_query::{CaseStatement, Expr};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use crate::entities::nodes;
use crate::group_commit::GroupCommit;
use crate::nodes::replace_gpus;
use crate::samples::{NodeSamples, add_gpu_samples};
use crate::{Fenced, Store, StoreError};
use allot_domain::GpuSample;

/// Each GPU's sample, by GPU uuid.
pub type GpuSamples = Vec<(String, GpuSample)>;

/// What one heartbeat writes.
#[derive(Debug, Clone)]
pub struct Beat {
    pub node_id: String,
    pub lease_expires_at: DateTime<Utc>,
    /// The inventory, when it changed.
    pub gpus: Option<Vec<GpuDevice>>,
    /// GPU samples (each GPU's) taken at a time, when due.
    pub samples: Option<(DateTime<Utc>, GpuSamples)>,
    /// Why the node takes no new work (empty: it takes work), when that changed.
    pub unavailable: Option<String>,
}

/// The queue heartbeats' writes go through.
#[derive(Clone)]
pub struct BeatBatcher {
    queue: GroupCommit<Beat, ()>,
}

impl BeatBatcher {
    /// Starts the committing task; it ends when every clone of the batcher is dropped.
    /// Each group is written through the leader's handle `leader` gives at its commit (a
    /// heartbeat renews a node's lease only while this replica's term holds); while it
    /// gives none, every beat fails as `Fenced`.
    pub fn start(
        leader: impl Fn() -> Option<Fenced> + Send + Sync + 'static,
        max_batch: usize,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let leader = std::sync::Arc::new(leader);
        let (queue, task) = GroupCommit::start(
            max_batch,
            |_: &Beat| String::new(),
            move |_, beats| {
                let store = leader();
                async move {
                    match store {
                        Some(store) => commit(&store, beats).await,
                        None => beats
                            .iter()
                            .map(|_| {
                                Err(StoreError::Fenced(
                                    "this replica does not lead: heartbeats go to the leader"
                                        .into(),
                                ))
                            })
                            .collect(),
                    }
                }
            },
        );
        (Self { queue }, task)
    }

    /// Writes the beat once its group has committed; `NotFound` for a node that is gone.
    pub async fn write(&self, beat: Beat) -> Result<(), StoreError> {
        self.queue.submit(beat).await
    }
}

/// One group in one transaction; when that fails for something other than an unreachable
/// database, each beat again on its own, so one that cannot be written fails alone.
async fn commit(store: &Store, beats: Vec<Beat>) -> Vec<Result<(), StoreError>> {
    let n = beats.len();
    let together = async {
        let txn = store.begin().await?;
        write_in(&txn, store, &beats).await?;
        store.commit(txn).await
    }
    .await;
    match together {
        Ok(()) => (0..n).map(|_| Ok(())).collect(),
        Err(e @ StoreError::Unavailable(_)) => (0..n).map(|_| Err(e.retold())).collect(),
        Err(_) => {
            let mut out = Vec::with_capacity(n);
            for mut beat in beats {
                let mut result = alone(store, &beat).await;
                // Samples are kept as they can be: a node's lease never waits on them (a
                // report naming one GPU twice, say, cannot be bucketed in one statement).
                if let Err(e) = &result
                    && !matches!(e, StoreError::Unavailable(_) | StoreError::NotFound(_))
                    && beat.samples.take().is_some()
                {
                    tracing::warn!(node = %beat.node_id, error = %e, "GPU samples not stored");
                    result = alone(store, &beat).await;
                }
                out.push(result);
            }
            out
        }
    }
}

/// One beat in a transaction of its own.
async fn alone(store: &Store, beat: &Beat) -> Result<(), StoreError> {
    let txn = store.begin().await?;
    write_in(&txn, store, std::slice::from_ref(beat)).await?;
    store.commit(txn).await
}

/// The leases of `beats` renewed in one statement, then their inventories and samples.
pub(crate) async fn write_in<C: ConnectionTrait>(
    db: &C,
    store: &Store,
    beats: &[Beat],
) -> Result<(), StoreError> {
    let mut ids: Vec<&str> = beats.iter().map(|b| b.node_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut until: Option<CaseStatement> = None;
    for b in beats {
        let when = nodes::Column::Id.eq(b.node_id.clone());
        let then = Expr::value(b.lease_expires_at);
        until = Some(match until {
            None => Expr::case(when, then),
            Some(c) => c.case(when, then),
        });
    }
    let Some(until) = until else {
        return Ok(());
    };
    let renewed = nodes::Entity::update_many()
        .col_expr(
            nodes::Column::LeaseExpiresAt,
            until
                .finally(Expr::col(nodes::Column::LeaseExpiresAt))
                .into(),
        )
        .col_expr(
            nodes::Column::LastHeartbeatAt,
            Expr::value(store.clock.now()),
        )
        .filter(nodes::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await?
        .rows_affected;
    if renewed != ids.len() as u64 {
        return Err(StoreError::NotFound(match ids.as_slice() {
            [one] => format!("node {one}"),
            _ => format!("{} of {} nodes", ids.len() as u64 - renewed, ids.len()),
        }));
    }
    for b in beats {
        if let Some(gpus) = &b.gpus {
            replace_gpus(db, &b.node_id, gpus).await?;
        }
        if let Some(why) = &b.unavailable {
            nodes::Entity::update_many()
                .col_expr(nodes::Column::Unavailable, Expr::value(why.clone()))
                .filter(nodes::Column::Id.eq(b.node_id.clone()))
                .exec(db)
                .await?;
        }
    }
    let samples: Vec<NodeSamples<'_>> = beats
        .iter()
        .filter_map(|b| {
            let (at, s) = b.samples.as_ref()?;
            Some((b.node_id.as_str(), *at, s.as_slice()))
        })
        .collect();
    add_gpu_samples(db, &samples).await
}
