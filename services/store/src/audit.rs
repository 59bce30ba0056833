//! Appending to the audit log inside the caller's transaction, and reading it back.
//!
//! Each append locks the log's head row (`SELECT … FOR UPDATE` on PostgreSQL; SQLite runs
//! one writer at a time), so sequence numbers are gap-free under concurrent writers, and
//! extends the head's Merkle frontier, so the head always holds the current tree.

use allot_audit::{CompactRange, Hash};
use allot_domain::{AuditContext, AuditEntry, AuditEvent};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};

use crate::convert::{to_i64, to_u64};
use crate::entities::{audit_entries, audit_logs};
use crate::{Store, StoreError};

/// An entry as stored: its position, the hash of its bytes, and the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    pub log: String,
    pub seq: u64,
    pub leaf_hash: Hash,
    pub body: String,
}

/// A log's current size and Merkle tree head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogHead {
    pub log: String,
    pub size: u64,
    pub root: Hash,
}

pub trait AuditRepo {
    /// Entries of `log` with `seq >= from`, in order, at most `limit`.
    fn audit_entries(
        &self,
        log: &str,
        from: u64,
        limit: u64,
    ) -> impl Future<Output = Result<Vec<StoredEntry>, StoreError>> + Send;
    /// The head of one log (size 0 and the empty root if nothing was recorded yet).
    fn audit_head(&self, log: &str) -> impl Future<Output = Result<LogHead, StoreError>> + Send;
    /// The heads of every log.
    fn audit_heads(&self) -> impl Future<Output = Result<Vec<LogHead>, StoreError>> + Send;
}

fn hash_from_hex(field: &str, s: &str) -> Result<Hash, StoreError> {
    let bytes = hex::decode(s).map_err(|e| StoreError::Corrupt(format!("{field}: {e}")))?;
    bytes
        .try_into()
        .map_err(|_| StoreError::Corrupt(format!("{field}: not 32 bytes")))
}

fn range_of(m: &audit_logs::Model) -> Result<CompactRange, StoreError> {
    let frontier = m
        .frontier
        .as_bytes()
        .chunks(64)
        .map(|c| hash_from_hex("frontier", std::str::from_utf8(c).unwrap_or("")))
        .collect::<Result<Vec<_>, _>>()?;
    CompactRange::from_parts(to_u64("size", m.size)?, frontier)
        .map_err(|e| StoreError::Corrupt(format!("audit log {}: {e}", m.log_id)))
}

/// Records `event` in its log as part of the caller's transaction; returns its sequence
/// number. If this fails, the caller's change must fail with it.
pub(crate) async fn record<C: ConnectionTrait>(
    db: &C,
    store: &Store,
    ctx: &AuditContext,
    event: AuditEvent,
) -> Result<u64, StoreError> {
    let now = store.clock.now();
    audit_logs::Entity::insert(audit_logs::ActiveModel {
        log_id: Set(event.log.clone()),
        size: Set(0),
        frontier: Set(String::new()),
        updated_at: Set(now),
    })
    .on_conflict(
        OnConflict::column(audit_logs::Column::LogId)
            .do_nothing()
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    let head = audit_logs::Entity::find_by_id(event.log.clone())
        .lock_exclusive()
        .one(db)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("audit log {} has no head", event.log)))?;
    let mut range = range_of(&head)?;
    let seq = range.size();
    let entry = AuditEntry {
        log: event.log,
        seq,
        time: AuditEntry::format_time(now),
        actor: ctx.actor.clone(),
        action: event.action,
        target: event.target,
        outcome: event.outcome,
        reason: event.reason,
        request_id: ctx.request_id.clone(),
        before: event.before,
        after: event.after,
    };
    let bytes = entry.canonical_bytes();
    let leaf = allot_audit::merkle::leaf_hash(&bytes);
    range.append(leaf);
    let body = String::from_utf8(bytes)
        .map_err(|e| StoreError::Corrupt(format!("audit entry is not UTF-8: {e}")))?;
    audit_entries::Entity::insert(audit_entries::ActiveModel {
        log_id: Set(entry.log.clone()),
        seq: Set(to_i64("seq", seq)?),
        at: Set(now),
        leaf_hash: Set(hex::encode(leaf)),
        body: Set(body),
    })
    .exec_without_returning(db)
    .await?;
    audit_logs::Entity::update(audit_logs::ActiveModel {
        log_id: Set(entry.log),
        size: Set(to_i64("size", range.size())?),
        frontier: Set(range.frontier().iter().map(hex::encode).collect()),
        updated_at: Set(now),
    })
    .exec(db)
    .await?;
    Ok(seq)
}

impl AuditRepo for Store {
    async fn audit_entries(
        &self,
        log: &str,
        from: u64,
        limit: u64,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        audit_entries::Entity::find()
            .filter(audit_entries::Column::LogId.eq(log))
            .filter(audit_entries::Column::Seq.gte(to_i64("from", from)?))
            .order_by_asc(audit_entries::Column::Seq)
            .limit(limit)
            .all(&self.db)
            .await?
            .into_iter()
            .map(|m| {
                Ok(StoredEntry {
                    seq: to_u64("seq", m.seq)?,
                    leaf_hash: hash_from_hex("leaf_hash", &m.leaf_hash)?,
                    log: m.log_id,
                    body: m.body,
                })
            })
            .collect()
    }

    async fn audit_head(&self, log: &str) -> Result<LogHead, StoreError> {
        match audit_logs::Entity::find_by_id(log.to_owned())
            .one(&self.db)
            .await?
        {
            Some(m) => {
                let range = range_of(&m)?;
                Ok(LogHead {
                    log: m.log_id,
                    size: range.size(),
                    root: range.root(),
                })
            }
            None => Ok(LogHead {
                log: log.to_owned(),
                size: 0,
                root: allot_audit::merkle::empty_root(),
            }),
        }
    }

    async fn audit_heads(&self) -> Result<Vec<LogHead>, StoreError> {
        audit_logs::Entity::find()
            .order_by_asc(audit_logs::Column::LogId)
            .all(&self.db)
            .await?
            .iter()
            .map(|m| {
                let range = range_of(m)?;
                Ok(LogHead {
                    log: m.log_id.clone(),
                    size: range.size(),
                    root: range.root(),
                })
            })
            .collect()
    }
}
