//! Each tenant's decayed past GPU use (`allot_scheduler::fair_share::PastUsage`), kept in
//! the database so the history outlives the scheduling process: the pass records it in
//! memory and the server saves it now and then, and loads it when it starts.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{ActiveValue::Set, EntityTrait};

use crate::entities::fair_share_usage;
use crate::{Store, StoreError};

/// Decayed GPU-seconds by tenant id, as of one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FairShareHistory {
    pub by_tenant: HashMap<String, f64>,
    /// When it was recorded; `None` when nothing was ever saved.
    pub recorded_at: Option<DateTime<Utc>>,
}

pub trait FairShareRepo {
    /// What was saved last (empty when nothing was).
    fn fair_share_history(
        &self,
    ) -> impl Future<Output = Result<FairShareHistory, StoreError>> + Send;
    /// Replaces what was saved with `history` (tenants absent from it are forgotten).
    fn save_fair_share_history(
        &self,
        history: &FairShareHistory,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl FairShareRepo for Store {
    async fn fair_share_history(&self) -> Result<FairShareHistory, StoreError> {
        let rows = fair_share_usage::Entity::find().all(&self.db).await?;
        Ok(FairShareHistory {
            recorded_at: rows.iter().map(|r| r.recorded_at).max(),
            by_tenant: rows
                .into_iter()
                .filter(|r| r.gpu_seconds.is_finite() && r.gpu_seconds > 0.0)
                .map(|r| (r.tenant_id, r.gpu_seconds))
                .collect(),
        })
    }

    async fn save_fair_share_history(&self, history: &FairShareHistory) -> Result<(), StoreError> {
        let at = history.recorded_at.unwrap_or_else(|| self.clock.now());
        let txn = self.begin().await?;
        fair_share_usage::Entity::delete_many().exec(&txn).await?;
        let rows: Vec<_> = history
            .by_tenant
            .iter()
            .filter(|(_, s)| s.is_finite() && **s > 0.0)
            .map(|(tenant, s)| fair_share_usage::ActiveModel {
                tenant_id: Set(tenant.clone()),
                gpu_seconds: Set(*s),
                recorded_at: Set(at),
            })
            .collect();
        if !rows.is_empty() {
            fair_share_usage::Entity::insert_many(rows)
                .exec_without_returning(&txn)
                .await?;
        }
        self.commit(txn).await?;
        Ok(())
    }
}
