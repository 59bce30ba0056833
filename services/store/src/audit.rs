//! Appending to the audit log inside the caller's transaction, and reading it back.
//!
//! Each append locks the log's head row (`SELECT … FOR UPDATE` on PostgreSQL; SQLite runs
//! one writer at a time), so sequence numbers are gap-free under concurrent writers, and
//! extends the head's Merkle frontier, so the head always holds the current tree.

use allot_audit::{CompactRange, Hash};
use allot_domain::{AuditContext, AuditEntry, AuditEvent, LegalHold, Outcome, SYSTEM_LOG};
use base64::Engine;
use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::sea_query::{
    Alias, CommonTableExpression, Expr, LikeExpr, PostgresQueryBuilder, WithClause,
};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DbBackend, EntityTrait, Order,
    QueryFilter, QueryOrder, QuerySelect, QueryTrait, Statement,
};

use crate::convert::{chunks, to_i64, to_u64};
use crate::entities::{audit_checkpoints, audit_entries, audit_holds, audit_logs};
use crate::group_commit::GroupCommit;
use crate::{Store, StoreError};

/// An entry as stored: its position, time, the hash of its bytes, and the bytes (`None`
/// once pruned: the leaf hash stays, so proofs still hold).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    pub log: String,
    pub seq: u64,
    pub at: DateTime<Utc>,
    pub leaf_hash: Hash,
    pub action: String,
    pub outcome: String,
    pub body: Option<String>,
}

/// Which entries to find, across the logs named (or every log).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditSearch {
    /// Only these logs; `None` is every log.
    pub logs: Option<Vec<String>>,
    /// `at >= since`.
    pub since: Option<DateTime<Utc>>,
    /// `at < until`.
    pub until: Option<DateTime<Utc>>,
    /// An actor as `<kind>:<id>`, or a bare id of any kind.
    pub actor: Option<String>,
    /// An exact action, or a prefix ending in `.*` (`token.*`).
    pub action: Option<String>,
    pub target: Option<String>,
    pub outcome: Option<Outcome>,
    /// Leave out what this actor (`<kind>:<id>`) read of the audit log (`audit.*`): an
    /// auditor's searches are not what they search for.
    pub hide_audit_reads_by: Option<String>,
    /// Newest first (descending (time, log, seq)); oldest first when false.
    pub newest_first: bool,
    /// Entries strictly beyond this position in the search's order: after it oldest first,
    /// before it newest first.
    pub after: Option<(DateTime<Utc>, String, u64)>,
    pub limit: u64,
}

/// A log's current size and Merkle tree head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogHead {
    pub log: String,
    pub size: u64,
    pub root: Hash,
}

/// A signed checkpoint as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub log: String,
    pub size: u64,
    pub root: Hash,
    /// The C2SP signed note.
    pub note: String,
}

pub trait AuditRepo {
    /// Records a standalone event (one that changes nothing else, e.g. a denied request or
    /// an audit read) in its own transaction.
    fn record_event(
        &self,
        ctx: &AuditContext,
        event: AuditEvent,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// The leaf hashes of `log` for `seq < size`, in order (for proofs).
    /// Appends events that change nothing else to one log in one transaction, under one
    /// lock of its head (bulk and high-rate writers); returns the first sequence number.
    fn record_events(
        &self,
        ctx: &AuditContext,
        log: &str,
        events: Vec<AuditEvent>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    fn audit_leaf_hashes(
        &self,
        log: &str,
        size: u64,
    ) -> impl Future<Output = Result<Vec<Hash>, StoreError>> + Send;
    /// Stores a signed checkpoint; a second one for the same log and size is a conflict.
    fn insert_checkpoint(
        &self,
        cp: StoredCheckpoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The size of the largest checkpoint of every log that has one, in one query.
    fn checkpointed_sizes(
        &self,
    ) -> impl Future<Output = Result<std::collections::HashMap<String, u64>, StoreError>> + Send;
    /// The largest checkpoint of `log`, if any.
    fn latest_checkpoint(
        &self,
        log: &str,
    ) -> impl Future<Output = Result<Option<StoredCheckpoint>, StoreError>> + Send;
    /// Every checkpoint of `log` with `from <= size <= to`, smallest first.
    fn checkpoints(
        &self,
        log: &str,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<Vec<StoredCheckpoint>, StoreError>> + Send;
    /// Entries of `log` with `seq >= from`, in order, at most `limit`.
    fn audit_entries(
        &self,
        log: &str,
        from: u64,
        limit: u64,
    ) -> impl Future<Output = Result<Vec<StoredEntry>, StoreError>> + Send;
    /// Entries matching `q`, in (time, log, seq) order.
    fn search_audit(
        &self,
        q: &AuditSearch,
    ) -> impl Future<Output = Result<Vec<StoredEntry>, StoreError>> + Send;
    /// Clears the payload of `log`'s entries recorded before `before` (their leaf hashes
    /// stay); refused while the log is under legal hold. Recorded in the system log when
    /// anything was pruned. Returns how many entries were pruned.
    fn prune_audit(
        &self,
        ctx: &AuditContext,
        log: &str,
        before: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// Places `log` under legal hold; a second hold on the same log is a conflict.
    fn set_legal_hold(
        &self,
        ctx: &AuditContext,
        log: &str,
        reason: &str,
    ) -> impl Future<Output = Result<LegalHold, StoreError>> + Send;
    /// Releases the hold on `log`.
    fn release_legal_hold(
        &self,
        ctx: &AuditContext,
        log: &str,
    ) -> impl Future<Output = Result<LegalHold, StoreError>> + Send;
    fn legal_holds(&self) -> impl Future<Output = Result<Vec<LegalHold>, StoreError>> + Send;
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
    let log = event.log.clone();
    record_batch(db, store, &log, vec![(ctx.clone(), event)]).await
}

/// Appends `events` to `log` under one lock of its head; returns the first sequence number.
pub(crate) async fn record_batch<C: ConnectionTrait>(
    db: &C,
    store: &Store,
    log: &str,
    events: Vec<(AuditContext, AuditEvent)>,
) -> Result<u64, StoreError> {
    // Microseconds, as entries carry and PostgreSQL keeps: search cursors compare exactly.
    let now = chrono::SubsecRound::trunc_subsecs(store.clock.now(), 6);
    let lock_head = || {
        audit_logs::Entity::find_by_id(log.to_owned())
            .lock_exclusive()
            .one(db)
    };
    // A log's first entry makes its head (once, whoever races to it).
    let head = match lock_head().await? {
        Some(head) => head,
        None => {
            audit_logs::Entity::insert(audit_logs::ActiveModel {
                log_id: Set(log.to_owned()),
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
            lock_head()
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("audit log {log} has no head")))?
        }
    };
    let mut range = range_of(&head)?;
    let first = range.size();
    let time = AuditEntry::format_time(now);
    let mut rows = Vec::with_capacity(events.len());
    for (ctx, event) in events {
        if event.log != log {
            return Err(StoreError::Corrupt(format!(
                "an event for log {} in a batch for {log}",
                event.log
            )));
        }
        let mut actor = ctx.actor.clone();
        if let Some(fence) = &store.fence
            && actor.source.is_none()
        {
            actor.source = Some(fence.source());
        }
        let entry = AuditEntry {
            log: event.log,
            seq: range.size(),
            time: time.clone(),
            prev_root: base64::engine::general_purpose::STANDARD.encode(range.root()),
            actor,
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
        let body = String::from_utf8(bytes)
            .map_err(|e| StoreError::Corrupt(format!("audit entry is not UTF-8: {e}")))?;
        rows.push(audit_entries::ActiveModel {
            seq: Set(to_i64("seq", entry.seq)?),
            at: Set(now),
            leaf_hash: Set(hex::encode(leaf)),
            body: Set(Some(body)),
            actor: Set(Some(entry.actor.key())),
            action: Set(entry.action),
            target: Set(Some(entry.target)),
            outcome: Set(entry.outcome.as_str().to_owned()),
            log_id: Set(entry.log),
        });
        range.append(leaf);
    }
    let head = audit_logs::Entity::update_many()
        .col_expr(
            audit_logs::Column::Size,
            Expr::value(to_i64("size", range.size())?),
        )
        .col_expr(
            audit_logs::Column::Frontier,
            Expr::value(range.frontier().iter().map(hex::encode).collect::<String>()),
        )
        .col_expr(audit_logs::Column::UpdatedAt, Expr::value(now))
        .filter(audit_logs::Column::LogId.eq(log))
        .into_query();
    // Bounded statements: PostgreSQL takes at most 65535 bind parameters.
    const PER_STATEMENT: usize = 1000;
    if db.get_database_backend() == DbBackend::Postgres && rows.len() <= PER_STATEMENT {
        // The entries and the new head in one statement: the head stays locked for one
        // round trip fewer, and every replica appending to this log waits that much less.
        let entries = audit_entries::Entity::insert_many(rows).into_query();
        let appended = WithClause::new()
            .cte(
                CommonTableExpression::new()
                    .query(entries)
                    .table_name(Alias::new("appended"))
                    .to_owned(),
            )
            .to_owned()
            .query(head);
        let (sql, values) = appended.build(PostgresQueryBuilder);
        db.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await?;
        return Ok(first);
    }
    for chunk in chunks(rows, PER_STATEMENT) {
        audit_entries::Entity::insert_many(chunk)
            .exec_without_returning(db)
            .await?;
    }
    db.execute(&head).await?;
    Ok(first)
}

/// Group commit for events that change nothing else (denials, reads, bulk imports): callers
/// queue, one task appends whatever has queued in one transaction per log, so a busy log
/// pays one commit per batch instead of one per event.
#[derive(Clone)]
pub struct AuditBatcher {
    queue: GroupCommit<(AuditContext, AuditEvent), u64>,
}

impl AuditBatcher {
    /// Starts the appending task; it ends when every clone of the batcher is dropped.
    pub fn start(store: Store, max_batch: usize) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, task) = GroupCommit::start(
            max_batch,
            |(_, event): &(AuditContext, AuditEvent)| event.log.clone(),
            move |log, items| {
                let store = store.clone();
                async move {
                    let n = items.len();
                    let result = async {
                        let txn = store.begin().await?;
                        let first = record_batch(&txn, &store, &log, items).await?;
                        store.commit(txn).await?;
                        Ok::<u64, StoreError>(first)
                    }
                    .await;
                    (0..n)
                        .map(|i| match &result {
                            Ok(first) => Ok(first + i as u64),
                            Err(e) => Err(e.retold()),
                        })
                        .collect()
                }
            },
        );
        (Self { queue }, task)
    }

    /// Queues one event and waits until it is committed; returns its sequence number.
    pub async fn record(&self, ctx: AuditContext, event: AuditEvent) -> Result<u64, StoreError> {
        self.queue.submit((ctx, event)).await
    }
}

fn entry_of(m: audit_entries::Model) -> Result<StoredEntry, StoreError> {
    Ok(StoredEntry {
        seq: to_u64("seq", m.seq)?,
        at: m.at,
        leaf_hash: hash_from_hex("leaf_hash", &m.leaf_hash)?,
        log: m.log_id,
        action: m.action,
        outcome: m.outcome,
        body: m.body,
    })
}

fn hold_of(m: audit_holds::Model) -> LegalHold {
    LegalHold {
        log: m.log_id,
        reason: m.reason,
        set_by: m.set_by,
        set_at: m.set_at,
    }
}

fn search_condition(q: &AuditSearch) -> Result<Condition, StoreError> {
    use audit_entries::Column as C;
    let mut cond = Condition::all();
    if let Some(logs) = &q.logs {
        cond = cond.add(C::LogId.is_in(logs.clone()));
    }
    if let Some(since) = q.since {
        cond = cond.add(C::At.gte(since));
    }
    if let Some(until) = q.until {
        cond = cond.add(C::At.lt(until));
    }
    if let Some(actor) = &q.actor {
        cond = cond.add(if actor.contains(':') {
            C::Actor.eq(actor.clone())
        } else {
            C::Actor.is_in(["token", "node", "system"].map(|k| format!("{k}:{actor}")))
        });
    }
    if let Some(action) = &q.action {
        cond = cond.add(match action.strip_suffix('*') {
            Some(prefix) => {
                let escaped: String = prefix
                    .chars()
                    .flat_map(|c| match c {
                        '\\' | '%' | '_' => vec!['\\', c],
                        c => vec![c],
                    })
                    .collect();
                C::Action.like(LikeExpr::new(format!("{escaped}%")).escape('\\'))
            }
            None => C::Action.eq(action.clone()),
        });
    }
    if let Some(target) = &q.target {
        cond = cond.add(C::Target.eq(target.clone()));
    }
    if let Some(outcome) = q.outcome {
        cond = cond.add(C::Outcome.eq(outcome.as_str()));
    }
    if let Some(me) = &q.hide_audit_reads_by {
        cond = cond.add(
            Condition::any()
                .add(C::Actor.ne(me.clone()))
                .add(C::Actor.is_null())
                .add(C::Action.not_like(LikeExpr::new("audit.%"))),
        );
    }
    if let Some((at, log, seq)) = &q.after {
        let seq = to_i64("after", *seq)?;
        let (at_beyond, log_beyond, seq_beyond) = if q.newest_first {
            (C::At.lt(*at), C::LogId.lt(log.clone()), C::Seq.lt(seq))
        } else {
            (C::At.gt(*at), C::LogId.gt(log.clone()), C::Seq.gt(seq))
        };
        cond = cond.add(
            Condition::any().add(at_beyond).add(
                Condition::all().add(C::At.eq(*at)).add(
                    Condition::any().add(log_beyond).add(
                        Condition::all()
                            .add(C::LogId.eq(log.clone()))
                            .add(seq_beyond),
                    ),
                ),
            ),
        );
    }
    Ok(cond)
}

fn checkpoint_of(m: audit_checkpoints::Model) -> Result<StoredCheckpoint, StoreError> {
    Ok(StoredCheckpoint {
        size: to_u64("size", m.size)?,
        root: hash_from_hex("root", &m.root)?,
        log: m.log_id,
        note: m.note,
    })
}

impl AuditRepo for Store {
    async fn record_event(&self, ctx: &AuditContext, event: AuditEvent) -> Result<u64, StoreError> {
        let txn = self.begin().await?;
        let seq = record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(seq)
    }

    async fn record_events(
        &self,
        ctx: &AuditContext,
        log: &str,
        events: Vec<AuditEvent>,
    ) -> Result<u64, StoreError> {
        let txn = self.begin().await?;
        let items = events.into_iter().map(|e| (ctx.clone(), e)).collect();
        let first = record_batch(&txn, self, log, items).await?;
        self.commit(txn).await?;
        Ok(first)
    }

    async fn audit_leaf_hashes(&self, log: &str, size: u64) -> Result<Vec<Hash>, StoreError> {
        let rows: Vec<String> = audit_entries::Entity::find()
            .select_only()
            .column(audit_entries::Column::LeafHash)
            .filter(audit_entries::Column::LogId.eq(log))
            .filter(audit_entries::Column::Seq.lt(to_i64("size", size)?))
            .order_by_asc(audit_entries::Column::Seq)
            .into_tuple()
            .all(&self.db)
            .await?;
        if rows.len() as u64 != size {
            return Err(StoreError::NotFound(format!(
                "{size} entries in audit log {log} (it has {})",
                rows.len()
            )));
        }
        rows.iter().map(|h| hash_from_hex("leaf_hash", h)).collect()
    }

    async fn insert_checkpoint(&self, cp: StoredCheckpoint) -> Result<(), StoreError> {
        let txn = self.begin().await?;
        audit_checkpoints::Entity::insert(audit_checkpoints::ActiveModel {
            log_id: Set(cp.log),
            size: Set(to_i64("size", cp.size)?),
            root: Set(hex::encode(cp.root)),
            note: Set(cp.note),
            created_at: Set(self.clock.now()),
        })
        .exec_without_returning(&txn)
        .await?;
        self.commit(txn).await
    }

    async fn checkpointed_sizes(
        &self,
    ) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        let rows: Vec<(String, Option<i64>)> = audit_checkpoints::Entity::find()
            .select_only()
            .column(audit_checkpoints::Column::LogId)
            .column_as(audit_checkpoints::Column::Size.max(), "size")
            .group_by(audit_checkpoints::Column::LogId)
            .into_tuple()
            .all(&self.db)
            .await?;
        rows.into_iter()
            .filter_map(|(log, size)| size.map(|s| (log, s)))
            .map(|(log, size)| Ok((log, to_u64("size", size)?)))
            .collect()
    }

    async fn latest_checkpoint(&self, log: &str) -> Result<Option<StoredCheckpoint>, StoreError> {
        audit_checkpoints::Entity::find()
            .filter(audit_checkpoints::Column::LogId.eq(log))
            .order_by_desc(audit_checkpoints::Column::Size)
            .one(&self.db)
            .await?
            .map(checkpoint_of)
            .transpose()
    }

    async fn checkpoints(
        &self,
        log: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<StoredCheckpoint>, StoreError> {
        audit_checkpoints::Entity::find()
            .filter(audit_checkpoints::Column::LogId.eq(log))
            .filter(audit_checkpoints::Column::Size.gte(to_i64("from", from)?))
            .filter(audit_checkpoints::Column::Size.lte(to_i64("to", to)?))
            .order_by_asc(audit_checkpoints::Column::Size)
            .all(&self.db)
            .await?
            .into_iter()
            .map(checkpoint_of)
            .collect()
    }

    async fn audit_entries(
        &self,
        log: &str,
        from: u64,
        limit: u64,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        audit_entries::Entity::find()
            .filter(audit_entries::Column::LogId.eq(log))
            .filter(audit_entries::Column::Seq.gte(to_i64("from", from)?))
            // Sequence numbers have no gaps, so the page is a closed range: without the upper
            // bound PostgreSQL may fetch and sort the whole rest of the log for every page.
            .filter(audit_entries::Column::Seq.lt(to_i64("to", from.saturating_add(limit))?))
            .order_by_asc(audit_entries::Column::Seq)
            .limit(limit)
            .all(&self.db)
            .await?
            .into_iter()
            .map(entry_of)
            .collect()
    }

    async fn search_audit(&self, q: &AuditSearch) -> Result<Vec<StoredEntry>, StoreError> {
        let order = if q.newest_first {
            Order::Desc
        } else {
            Order::Asc
        };
        audit_entries::Entity::find()
            .filter(search_condition(q)?)
            .order_by(audit_entries::Column::At, order.clone())
            .order_by(audit_entries::Column::LogId, order.clone())
            .order_by(audit_entries::Column::Seq, order)
            .limit(q.limit)
            .all(&self.db)
            .await?
            .into_iter()
            .map(entry_of)
            .collect()
    }

    async fn prune_audit(
        &self,
        ctx: &AuditContext,
        log: &str,
        before: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        use audit_entries::Column as C;
        let txn = self.begin().await?;
        if let Some(hold) = audit_holds::Entity::find_by_id(log.to_owned())
            .one(&txn)
            .await?
        {
            return Err(StoreError::Conflict(format!(
                "audit log {log} is under legal hold ({}); release it before pruning",
                hold.reason
            )));
        }
        let pruned = audit_entries::Entity::update_many()
            .col_expr(C::Body, Expr::value(Option::<String>::None))
            .col_expr(C::Actor, Expr::value(Option::<String>::None))
            .col_expr(C::Target, Expr::value(Option::<String>::None))
            .filter(C::LogId.eq(log))
            .filter(C::At.lt(before))
            .filter(C::Body.is_not_null())
            .exec(&txn)
            .await?
            .rows_affected;
        if pruned == 0 {
            // Nothing changed, so there is nothing to record.
            return Ok(0);
        }
        let event = AuditEvent::success(SYSTEM_LOG, "audit.prune", format!("audit-log/{log}"))
            .after(serde_json::json!({
                "before": AuditEntry::format_time(before),
                "pruned": pruned,
            }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(pruned)
    }

    async fn set_legal_hold(
        &self,
        ctx: &AuditContext,
        log: &str,
        reason: &str,
    ) -> Result<LegalHold, StoreError> {
        let txn = self.begin().await?;
        let hold = LegalHold {
            log: log.to_owned(),
            reason: reason.to_owned(),
            set_by: ctx.actor.key(),
            set_at: self.clock.now(),
        };
        audit_holds::Entity::insert(audit_holds::ActiveModel {
            log_id: Set(hold.log.clone()),
            reason: Set(hold.reason.clone()),
            set_by: Set(hold.set_by.clone()),
            set_at: Set(hold.set_at),
        })
        .exec_without_returning(&txn)
        .await
        .map_err(|e| match StoreError::from(e) {
            StoreError::Conflict(_) => {
                StoreError::Conflict(format!("audit log {log} is already under legal hold"))
            }
            e => e,
        })?;
        let event = AuditEvent::success(SYSTEM_LOG, "audit.hold.set", format!("audit-log/{log}"))
            .after(serde_json::json!({ "reason": reason }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(hold)
    }

    async fn release_legal_hold(
        &self,
        ctx: &AuditContext,
        log: &str,
    ) -> Result<LegalHold, StoreError> {
        let txn = self.begin().await?;
        let hold = audit_holds::Entity::find_by_id(log.to_owned())
            .one(&txn)
            .await?
            .map(hold_of)
            .ok_or_else(|| StoreError::NotFound(format!("audit log {log} has no legal hold")))?;
        audit_holds::Entity::delete_by_id(log.to_owned())
            .exec(&txn)
            .await?;
        let event =
            AuditEvent::success(SYSTEM_LOG, "audit.hold.release", format!("audit-log/{log}"))
                .before(serde_json::json!({
                    "reason": hold.reason,
                    "set_by": hold.set_by,
                    "set_at": AuditEntry::format_time(hold.set_at),
                }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(hold)
    }

    async fn legal_holds(&self) -> Result<Vec<LegalHold>, StoreError> {
        Ok(audit_holds::Entity::find()
            .order_by_asc(audit_holds::Column::LogId)
            .all(&self.db)
            .await?
            .into_iter()
            .map(hold_of)
            .collect())
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
