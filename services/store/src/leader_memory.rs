//! What the leader's scheduling remembers between passes beyond the jobs (the placement
//! policy's learned mix, the elastic planner's state: each a named JSON value), saved by the
//! leader through its fence and taken up by the next leader when it takes office, so that
//! a change of leader changes no decision. Only a [`Fenced`] handle saves: a deposed leader
//! cannot overwrite what its successor remembers.

use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, EntityTrait};

use crate::entities::leader_memory;
use crate::{Fenced, Store, StoreError};

pub trait LeaderMemoryRepo {
    /// The value last saved under `name`, if any.
    fn leader_memory(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;
}

/// The leader's write of its memory.
pub trait LeaderMemoryWrite {
    /// Saves `value` under `name` (replacing what was), committed only while the term holds.
    fn save_leader_memory(
        &self,
        name: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl LeaderMemoryRepo for Store {
    async fn leader_memory(&self, name: &str) -> Result<Option<String>, StoreError> {
        Ok(leader_memory::Entity::find_by_id(name.to_owned())
            .one(&self.db)
            .await?
            .map(|m| m.value))
    }
}

impl LeaderMemoryWrite for Fenced {
    async fn save_leader_memory(&self, name: &str, value: &str) -> Result<(), StoreError> {
        let txn = self.begin().await?;
        leader_memory::Entity::insert(leader_memory::ActiveModel {
            name: Set(name.to_owned()),
            value: Set(value.to_owned()),
            saved_at: Set(self.clock.now()),
        })
        .on_conflict(
            OnConflict::column(leader_memory::Column::Name)
                .update_columns([leader_memory::Column::Value, leader_memory::Column::SavedAt])
                .to_owned(),
        )
        .exec(&txn)
        .await?;
        self.commit(txn).await
    }
}
