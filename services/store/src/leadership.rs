//! Leadership among control-plane replicas sharing one database: a lease in one row
//! (`leader_lease`: holder, epoch, expiry). A replica takes the lease over only once it has
//! expired, and each takeover increments the epoch. What the leader writes as leader it
//! writes through [`Store::fenced`] (a [`Fenced`] handle): every transaction of that handle checks, last thing
//! before it commits, that the row still names its holder and epoch unexpired, holding a
//! share lock on the row (PostgreSQL) so a takeover waits for the commit. A leader that was
//! paused (SIGSTOP, a stall, a partition from the database) past its lease therefore writes
//! nothing once it wakes: its epoch is gone, or its lease has expired by its own clock.
//!
//! Whether that held is seen in the rows themselves: every takeover records when its term
//! began (`leader_terms`), and every job row the epoch of the leader handle that last wrote
//! it (`jobs.writer_epoch`), so a row last written under an epoch after a later term had
//! begun is a deposed write ([`LeadershipRepo::deposed_job_writes`]).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DatabaseTransaction, DbBackend,
    EntityTrait, QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};

use crate::entities::leader_lease::{self, Column};
use crate::entities::{jobs, leader_terms};
use crate::{Store, StoreError};

/// The lease's row.
const LEASE: &str = "control-plane";

/// Who leads, as the database says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The replica that took the lease last (empty before anyone did).
    pub holder: String,
    /// Which process of it (drawn at its start).
    pub instance: String,
    /// Where that replica's agents' endpoint is reached.
    pub address: String,
    pub epoch: i64,
    pub expires_at: DateTime<Utc>,
    pub acquired_at: DateTime<Utc>,
}

impl Leader {
    /// Whether the lease still stands at `now`.
    pub fn holds_at(&self, now: DateTime<Utc>) -> bool {
        !self.holder.is_empty() && now < self.expires_at
    }
}

/// A lease this replica holds: the fencing token of what it writes as leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub holder: String,
    pub instance: String,
    pub epoch: i64,
    pub expires_at: DateTime<Utc>,
}

/// A term of leadership as recorded when it was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderTerm {
    pub epoch: i64,
    pub holder: String,
    pub instance: String,
    /// When the lease was taken, by the taker's clock.
    pub started_at: DateTime<Utc>,
}

/// Who last wrote a job row, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobWriter {
    pub job_id: String,
    /// The epoch of the leader handle that wrote it; `None` when no leader handle did (a
    /// submit, a cancel through any replica).
    pub writer_epoch: Option<i64>,
    /// The row's `updated_at`, by the writer's clock.
    pub written_at: DateTime<Utc>,
}

/// A job row last written by a leader handle after a later term had begun: a write its
/// fence should have refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeposedWrite {
    pub job_id: String,
    /// The epoch of the handle that wrote it.
    pub writer_epoch: i64,
    /// When it was written (the row's `updated_at`, by the writer's clock).
    pub written_at: DateTime<Utc>,
    /// The first later term that had begun before then.
    pub superseded_by: i64,
}

pub trait LeadershipRepo {
    /// The lease as it stands.
    fn leader(&self) -> impl Future<Output = Result<Leader, StoreError>> + Send;
    /// Takes the lease for `holder`'s process `instance` (reached at `address`) for `ttl`,
    /// if it has expired or that very process held it last: the new term, with the next
    /// epoch; `None` while another holds it — another replica, or another process under
    /// the same name (a replica started again waits out the lease its earlier run held;
    /// two live ones given one name never take it from each other).
    fn acquire(
        &self,
        holder: &str,
        instance: &str,
        address: &str,
        ttl: chrono::Duration,
    ) -> impl Future<Output = Result<Option<Term>, StoreError>> + Send;
    /// Extends `term` by `ttl` from now, if it still holds: the renewed term, or `None` when
    /// it expired or was taken over (the holder is no longer the leader).
    fn renew(
        &self,
        term: &Term,
        ttl: chrono::Duration,
    ) -> impl Future<Output = Result<Option<Term>, StoreError>> + Send;
    /// Gives the lease up now (a clean stop), so another replica takes over at once.
    fn resign(&self, term: &Term) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Every term taken since terms were recorded, oldest first.
    fn leader_terms(&self) -> impl Future<Output = Result<Vec<LeaderTerm>, StoreError>> + Send;
    /// Every job row's last writer and when it wrote, by job id.
    fn job_writers(&self) -> impl Future<Output = Result<Vec<JobWriter>, StoreError>> + Send;
    /// The job rows whose last write was made under an epoch after a later term had begun
    /// (`updated_at` later than that term's `started_at`), by job id. Empty when fencing
    /// held. It dates writes by `updated_at`, so it sees neither a write that sets no
    /// `updated_at` (a pending reason) unless the row was last dated by a later write, nor
    /// a deposed write hidden by a later one; and it compares the clocks of different
    /// replicas, so it assumes they agree to well within a lease.
    fn deposed_job_writes(
        &self,
    ) -> impl Future<Output = Result<Vec<DeposedWrite>, StoreError>> + Send;
}

impl LeadershipRepo for Store {
    async fn leader(&self) -> Result<Leader, StoreError> {
        let row = leader_lease::Entity::find_by_id(LEASE)
            .one(&self.db)
            .await?
            .ok_or_else(|| StoreError::Corrupt("the leader lease row is missing".into()))?;
        Ok(Leader {
            holder: row.holder,
            instance: row.instance,
            address: row.address,
            epoch: row.epoch,
            expires_at: row.expires_at,
            acquired_at: row.acquired_at,
        })
    }

    async fn acquire(
        &self,
        holder: &str,
        instance: &str,
        address: &str,
        ttl: chrono::Duration,
    ) -> Result<Option<Term>, StoreError> {
        let now = self.clock.now();
        let txn = self.db.begin().await?;
        let taken = leader_lease::Entity::update_many()
            .col_expr(Column::Epoch, Expr::col(Column::Epoch).add(1))
            .set(leader_lease::ActiveModel {
                holder: Set(holder.to_owned()),
                instance: Set(instance.to_owned()),
                address: Set(address.to_owned()),
                expires_at: Set(now + ttl),
                acquired_at: Set(now),
                ..Default::default()
            })
            .filter(Column::Name.eq(LEASE))
            .filter(
                Condition::any().add(Column::ExpiresAt.lte(now)).add(
                    Condition::all()
                        .add(Column::Holder.eq(holder))
                        .add(Column::Instance.eq(instance)),
                ),
            )
            .exec(&txn)
            .await?;
        if taken.rows_affected == 0 {
            txn.rollback().await?;
            return Ok(None);
        }
        let row = leader_lease::Entity::find_by_id(LEASE)
            .one(&txn)
            .await?
            .ok_or_else(|| StoreError::Corrupt("the leader lease row is missing".into()))?;
        // The term's start, in the takeover's own transaction: what later writes under the
        // epochs before it are dated against.
        leader_terms::Entity::insert(leader_terms::ActiveModel {
            epoch: Set(row.epoch),
            holder: Set(row.holder.clone()),
            instance: Set(row.instance.clone()),
            started_at: Set(now),
        })
        .exec_without_returning(&txn)
        .await?;
        txn.commit().await?;
        Ok(Some(Term {
            holder: row.holder,
            instance: row.instance,
            epoch: row.epoch,
            expires_at: row.expires_at,
        }))
    }

    async fn renew(&self, term: &Term, ttl: chrono::Duration) -> Result<Option<Term>, StoreError> {
        let now = self.clock.now();
        let until = now + ttl;
        let renewed = leader_lease::Entity::update_many()
            .set(leader_lease::ActiveModel {
                expires_at: Set(until),
                ..Default::default()
            })
            .filter(Column::Name.eq(LEASE))
            .filter(Column::Holder.eq(&term.holder))
            .filter(Column::Instance.eq(&term.instance))
            .filter(Column::Epoch.eq(term.epoch))
            .filter(Column::ExpiresAt.gt(now))
            .exec(&self.db)
            .await?;
        Ok((renewed.rows_affected == 1).then(|| Term {
            expires_at: until,
            ..term.clone()
        }))
    }

    async fn resign(&self, term: &Term) -> Result<(), StoreError> {
        leader_lease::Entity::update_many()
            .set(leader_lease::ActiveModel {
                expires_at: Set(self.clock.now()),
                ..Default::default()
            })
            .filter(Column::Name.eq(LEASE))
            .filter(Column::Holder.eq(&term.holder))
            .filter(Column::Epoch.eq(term.epoch))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    async fn leader_terms(&self) -> Result<Vec<LeaderTerm>, StoreError> {
        Ok(leader_terms::Entity::find()
            .order_by_asc(leader_terms::Column::Epoch)
            .all(&self.db)
            .await?
            .into_iter()
            .map(|t| LeaderTerm {
                epoch: t.epoch,
                holder: t.holder,
                instance: t.instance,
                started_at: t.started_at,
            })
            .collect())
    }

    async fn job_writers(&self) -> Result<Vec<JobWriter>, StoreError> {
        let rows: Vec<(String, Option<i64>, DateTime<Utc>)> = jobs::Entity::find()
            .select_only()
            .column(jobs::Column::Id)
            .column(jobs::Column::WriterEpoch)
            .column(jobs::Column::UpdatedAt)
            .order_by_asc(jobs::Column::Id)
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(job_id, writer_epoch, written_at)| JobWriter {
                job_id,
                writer_epoch,
                written_at,
            })
            .collect())
    }

    async fn deposed_job_writes(&self) -> Result<Vec<DeposedWrite>, StoreError> {
        let terms = self.leader_terms().await?;
        let Some(newest) = terms.last().map(|t| t.epoch) else {
            return Ok(Vec::new());
        };
        // Compared here rather than in SQL: SQLite keeps timestamps as text.
        let rows: Vec<(String, Option<i64>, DateTime<Utc>)> = jobs::Entity::find()
            .select_only()
            .column(jobs::Column::Id)
            .column(jobs::Column::WriterEpoch)
            .column(jobs::Column::UpdatedAt)
            .filter(jobs::Column::WriterEpoch.lt(newest))
            .order_by_asc(jobs::Column::Id)
            .into_tuple()
            .all(&self.db)
            .await?;
        // The earliest start among each term and those after it: most rows were written in
        // their term and are passed over at one look.
        let mut earliest = terms.iter().map(|t| t.started_at).collect::<Vec<_>>();
        for i in (1..earliest.len()).rev() {
            earliest[i - 1] = std::cmp::min(earliest[i - 1], earliest[i]);
        }
        Ok(rows
            .into_iter()
            .filter_map(|(job_id, writer_epoch, written_at)| {
                let writer_epoch = writer_epoch?;
                let later = terms.partition_point(|t| t.epoch <= writer_epoch);
                if *earliest.get(later)? >= written_at {
                    return None;
                }
                let superseded_by = terms[later..]
                    .iter()
                    .find(|t| t.started_at < written_at)
                    .map(|t| t.epoch)?;
                Some(DeposedWrite {
                    job_id,
                    writer_epoch,
                    written_at,
                    superseded_by,
                })
            })
            .collect())
    }
}

/// What a leader's handle's transactions check before they commit, and the term its audit
/// entries name.
#[derive(Debug)]
pub(crate) struct Fence {
    holder: String,
    epoch: i64,
    /// Whether commits are checked (off only for the negative control,
    /// [`Store::unfenced_for_testing`]).
    enforce: bool,
}

impl Fence {
    /// What the audit entries written under this term name as their source.
    pub(crate) fn source(&self) -> String {
        format!("leader {} epoch {}", self.holder, self.epoch)
    }
}

impl Fence {
    /// Fails unless the lease still names this holder and epoch, unexpired at `now`; on
    /// PostgreSQL the row stays share-locked until `txn` ends, so no takeover commits between
    /// this check and the caller's commit.
    async fn hold(&self, txn: &DatabaseTransaction, now: DateTime<Utc>) -> Result<(), StoreError> {
        let mut query = leader_lease::Entity::find_by_id(LEASE)
            .filter(Column::Holder.eq(&self.holder))
            .filter(Column::Epoch.eq(self.epoch))
            .filter(Column::ExpiresAt.gt(now));
        if txn.get_database_backend() == DbBackend::Postgres {
            query = query.lock_shared();
        }
        match query.one(txn).await? {
            Some(_) => Ok(()),
            None => Err(StoreError::Fenced(format!(
                "this replica's leadership (epoch {}) has ended",
                self.epoch
            ))),
        }
    }
}

/// The leader's handle: the store, with every transaction committing only while the term it
/// was made for holds (checked last thing before commit, the lease row share-locked on
/// PostgreSQL). The writes only a leader makes — placements, moves, resizes
/// ([`crate::LeaderRepo`]) — exist on this type alone, so what has no term has no way to
/// make them; everything a [`Store`] does, it does too, fenced.
#[derive(Clone)]
pub struct Fenced(Store);

impl std::ops::Deref for Fenced {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.0
    }
}

impl std::fmt::Debug for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0.fence {
            Some(fence) => write!(f, "Fenced({})", fence.source()),
            None => f.write_str("Fenced(?)"),
        }
    }
}

impl Store {
    /// The epoch this handle's job writes record as their writer (`jobs.writer_epoch`): its
    /// term's, enforced or not, so the negative control's deposed writes show; `None` on a
    /// handle that is no leader's, whose writes clear it (the column names the last writer,
    /// not the last leader that wrote).
    pub(crate) fn writer_epoch(&self) -> Option<i64> {
        self.fence.as_ref().map(|f| f.epoch)
    }

    /// The leader's handle for `term`: what a leader writes as leader (scheduling, lease
    /// lapses, checkpoints, retention, what its nodes report) goes through it. Audit
    /// entries written through it name the term as their source.
    pub fn fenced(&self, term: &Term) -> Fenced {
        Fenced(self.leader_handle(term, true))
    }

    /// [`Store::fenced`] without the check: its entries name the term, and it writes
    /// whether or not the term holds. Only for showing what fencing prevents (the failover
    /// benchmark's and the fencing tests' negative control): compiled only with the
    /// `unfenced-for-testing` feature, which only tests and benchmarks enable.
    #[cfg(feature = "unfenced-for-testing")]
    pub fn unfenced_for_testing(&self, term: &Term) -> Fenced {
        Fenced(self.leader_handle(term, false))
    }

    fn leader_handle(&self, term: &Term, enforce: bool) -> Store {
        Store {
            fence: Some(Arc::new(Fence {
                holder: term.holder.clone(),
                epoch: term.epoch,
                enforce,
            })),
            ..self.clone()
        }
    }

    /// Begins a transaction (the one way this crate does).
    pub(crate) async fn begin(&self) -> Result<DatabaseTransaction, StoreError> {
        Ok(self.db.begin().await?)
    }

    /// Commits `txn`, after checking the fence when this handle has one.
    pub(crate) async fn commit(&self, txn: DatabaseTransaction) -> Result<(), StoreError> {
        if let Some(fence) = self.fence.as_ref().filter(|f| f.enforce) {
            fence.hold(&txn, self.clock.now()).await?;
        }
        txn.commit().await?;
        Ok(())
    }
}
