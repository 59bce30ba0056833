//! Job logs as nodes ship them: chunks of each attempt's output by offset, of which the
//! first [`HEAD_BYTES`] and the last [`TAIL_BYTES`] are kept.

use allot_domain::joblog::{self, CHUNK_MAX_BYTES, HEAD_BYTES, LogChunk, TAIL_BYTES};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder};

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
    /// Keeps what is new of a chunk of an attempt's log (what lies before the kept log's end
    /// was kept or dropped already: a chunk sent again, after a reconnect or an agent
    /// restart, is kept once), and drops the attempt's chunks past the first
    /// [`HEAD_BYTES`] that lie wholly before its last [`TAIL_BYTES`]. Chunks over
    /// [`CHUNK_MAX_BYTES`] are the caller's to refuse.
    fn append_job_log(
        &self,
        job_id: &str,
        attempt: u32,
        offset: u64,
        data: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The kept chunks of an attempt that hold bytes at or after `from` (the one holding
    /// `from`, if any, and those after it), oldest first, at most about `max_bytes` of them.
    fn job_log(
        &self,
        job_id: &str,
        attempt: u32,
        from: u64,
        max_bytes: u64,
    ) -> impl Future<Output = Result<Vec<LogChunk>, StoreError>> + Send;
    /// Where the first kept chunk of an attempt's log received at or after `since` starts;
    /// `None` when none was (nothing written since, as far as is kept).
    fn job_log_offset_since(
        &self,
        job_id: &str,
        attempt: u32,
        since: chrono::DateTime<chrono::Utc>,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;
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
        let kept_end = self.job_log_end(job_id, attempt).await?;
        let Some((offset, skip)) = joblog::new_part(offset, data.len() as u64, kept_end) else {
            return Ok(());
        };
        let data = data
            .get(usize::try_from(skip).unwrap_or(usize::MAX)..)
            .unwrap_or_default();
        let row = job_logs::ActiveModel {
            job_id: Set(job_id.to_owned()),
            attempt: Set(attempt_column(attempt)),
            offset: Set(column(offset)),
            data: Set(data.to_vec()),
            written_at: Set(Some(self.clock.now())),
        };
        job_logs::Entity::insert(row)
            .on_conflict(
                OnConflict::columns([C::JobId, C::Attempt, C::Offset])
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(&self.db)
            .await?;
        // Chunks are at most CHUNK_MAX_BYTES long, so one starting before this bound ends
        // before the kept tail, and one starting at or after the head lies past it.
        let end = offset + data.len() as u64;
        let before_tail = end.saturating_sub(TAIL_BYTES + CHUNK_MAX_BYTES);
        if before_tail > HEAD_BYTES {
            job_logs::Entity::delete_many()
                .filter(C::JobId.eq(job_id))
                .filter(C::Attempt.eq(attempt_column(attempt)))
                .filter(C::Offset.gte(column(HEAD_BYTES)))
                .filter(C::Offset.lt(column(before_tail)))
                .exec(&self.db)
                .await?;
        }
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
        let chunk = |m: job_logs::Model| LogChunk {
            offset: u64::try_from(m.offset).unwrap_or_default(),
            data: m.data,
            received_at: m.written_at,
        };
        // The chunk holding `from` starts at or before it: the last one that does.
        let holding = job_logs::Entity::find()
            .filter(C::JobId.eq(job_id))
            .filter(C::Attempt.eq(attempt_column(attempt)))
            .filter(C::Offset.lte(column(from)))
            .order_by_desc(C::Offset)
            .one(&self.db)
            .await?
            .map(chunk)
            .filter(|c| c.end() > from);
        // What is kept of an attempt is bounded (its head and tail), so reading the rest of
        // it whole costs at most that much; the answer stops once it holds `max_bytes`.
        let after = job_logs::Entity::find()
            .filter(C::JobId.eq(job_id))
            .filter(C::Attempt.eq(attempt_column(attempt)))
            .filter(C::Offset.gt(column(from)))
            .order_by_asc(C::Offset)
            .all(&self.db)
            .await?;
        let mut bytes = 0u64;
        Ok(holding
            .into_iter()
            .chain(after.into_iter().map(chunk))
            .take_while(|c| {
                let more = bytes < max_bytes.max(1);
                bytes += c.data.len() as u64;
                more
            })
            .collect())
    }

    async fn job_log_offset_since(
        &self,
        job_id: &str,
        attempt: u32,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<u64>, StoreError> {
        use job_logs::Column as C;
        Ok(job_logs::Entity::find()
            .filter(C::JobId.eq(job_id))
            .filter(C::Attempt.eq(attempt_column(attempt)))
            .filter(C::WrittenAt.gte(since))
            .order_by_asc(C::Offset)
            .one(&self.db)
            .await?
            .map(|m| u64::try_from(m.offset).unwrap_or_default()))
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
