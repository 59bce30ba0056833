//! Job logs as nodes ship them: chunks of each attempt's output by offset, of which the
//! last [`KEPT_BYTES`] are kept.

use allot_domain::joblog::{CHUNK_MAX_BYTES, KEPT_BYTES, LogChunk};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::entities::job_logs;
use crate::{Store, StoreError};

/// A byte count or offset as the table stores it.
fn column(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn attempt_column(attempt: u32) -> i32 {
    i32::try_from(attempt).unwrap_or(i32::MAX)
}

pub trait LogRepo {
    /// Keeps a chunk of an attempt's log (a chunk already kept at that offset stays as it
    /// is), and drops the attempt's chunks that start more than [`KEPT_BYTES`] before its
    /// end. Chunks over [`CHUNK_MAX_BYTES`] are the caller's to refuse.
    fn append_job_log(
        &self,
        job_id: &str,
        attempt: u32,
        offset: u64,
        data: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The kept chunks of an attempt that hold bytes at or after `from`, oldest first, at
    /// most about `max_bytes` of them.
    fn job_log(
        &self,
        job_id: &str,
        attempt: u32,
        from: u64,
        max_bytes: u64,
    ) -> impl Future<Output = Result<Vec<LogChunk>, StoreError>> + Send;
    /// The offset after the last byte kept of an attempt's log (0 when none is).
    fn job_log_end(
        &self,
        job_id: &str,
        attempt: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

impl LogRepo for Store {
    async fn append_job_log(
        &self,
        job_id: &str,
        attempt: u32,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        use job_logs::Column as C;
        let row = job_logs::ActiveModel {
            job_id: Set(job_id.to_owned()),
            attempt: Set(attempt_column(attempt)),
            offset: Set(column(offset)),
            data: Set(data.to_vec()),
        };
        job_logs::Entity::insert(row)
            .on_conflict(
                OnConflict::columns([C::JobId, C::Attempt, C::Offset])
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(&self.db)
            .await?;
        let end = offset + data.len() as u64;
        job_logs::Entity::delete_many()
            .filter(C::JobId.eq(job_id))
            .filter(C::Attempt.eq(attempt_column(attempt)))
            .filter(C::Offset.lt(column(end.saturating_sub(KEPT_BYTES))))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    async fn job_log(
        &self,
        job_id: &str,
        attempt: u32,
        from: u64,
        max_bytes: u64,
    ) -> Result<Vec<LogChunk>, StoreError> {
        use job_logs::Column as C;
        // A chunk holding `from` starts at most a chunk's length before it.
        let rows = job_logs::Entity::find()
            .filter(C::JobId.eq(job_id))
            .filter(C::Attempt.eq(attempt_column(attempt)))
            .filter(C::Offset.gte(column(from.saturating_sub(CHUNK_MAX_BYTES - 1))))
            .order_by_asc(C::Offset)
            .limit(max_bytes.div_ceil(CHUNK_MAX_BYTES).max(1) + 1)
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|m| LogChunk {
                offset: u64::try_from(m.offset).unwrap_or_default(),
                data: m.data,
            })
            .filter(|c| c.end() > from)
            .collect())
    }

    async fn job_log_end(&self, job_id: &str, attempt: u32) -> Result<u64, StoreError> {
        use job_logs::Column as C;
        let last = job_logs::Entity::find()
            .filter(C::JobId.eq(job_id))
            .filter(C::Attempt.eq(attempt_column(attempt)))
            .order_by_desc(C::Offset)
            .one(&self.db)
            .await?;
        Ok(last.map_or(0, |m| {
            u64::try_from(m.offset).unwrap_or_default() + m.data.len() as u64
        }))
    }
}
