//! Failed authentications per client address, counted in the database so that every
//! replica of the control plane counts them together (`allot_api::limiter`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter};

use crate::entities::auth_failures;
use crate::{Store, StoreError};

/// Sources longer than this are cut (an address is far shorter).
const MAX_SOURCE: usize = 255;

pub trait AuthFailureRepo {
    /// Counts a failed authentication from `source` in its current window of `window`
    /// (a new window starts when the last one ended): the window's start and its failures,
    /// this one included.
    fn count_auth_failure(
        &self,
        source: &str,
        window: Duration,
    ) -> impl Future<Output = Result<(DateTime<Utc>, u32), StoreError>> + Send;
    /// Forgets windows that ended before now.
    fn sweep_auth_failures(
        &self,
        window: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

fn span(window: Duration) -> chrono::Duration {
    chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX)
}

impl AuthFailureRepo for Store {
    async fn count_auth_failure(
        &self,
        source: &str,
        window: Duration,
    ) -> Result<(DateTime<Utc>, u32), StoreError> {
        let source: String = source.chars().take(MAX_SOURCE).collect();
        // Replicas count at once: each change is conditional on the row as read, and read
        // again when another got there first.
        for _ in 0..16 {
            let now = self.clock.now();
            let row = auth_failures::Entity::find_by_id(source.clone())
                .one(&self.db)
                .await?;
            let Some(row) = row else {
                let inserted = auth_failures::Entity::insert(auth_failures::ActiveModel {
                    source: Set(source.clone()),
                    window_start: Set(now),
                    failures: Set(1),
                })
                .on_conflict(
                    OnConflict::column(auth_failures::Column::Source)
                        .do_nothing()
                        .to_owned(),
                )
                .exec_without_returning(&self.db)
                .await?;
                if inserted == 1 {
                    return Ok((now, 1));
                }
                continue;
            };
            let (start, failures) = if now >= row.window_start + span(window) {
                (now, 1)
            } else {
                (row.window_start, row.failures.saturating_add(1))
            };
            let res = auth_failures::Entity::update_many()
                .set(auth_failures::ActiveModel {
                    window_start: Set(start),
                    failures: Set(failures),
                    ..Default::default()
                })
                .filter(auth_failures::Column::Source.eq(source.as_str()))
                .filter(auth_failures::Column::WindowStart.eq(row.window_start))
                .filter(auth_failures::Column::Failures.eq(row.failures))
                .exec(&self.db)
                .await?;
            if res.rows_affected == 1 {
                return Ok((start, u32::try_from(failures).unwrap_or(0)));
            }
        }
        Err(StoreError::Conflict(format!(
            "failed authentications from {source} kept changing"
        )))
    }

    async fn sweep_auth_failures(&self, window: Duration) -> Result<u64, StoreError> {
        let ended_before = self.clock.now() - span(window);
        Ok(auth_failures::Entity::delete_many()
            .filter(auth_failures::Column::WindowStart.lt(ended_before))
            .exec(&self.db)
            .await?
            .rows_affected)
    }
}
