//! Persistence for the control plane: sea-orm over PostgreSQL (production) or SQLite (the
//! embedded default). The schema comes only from `allot-migrations`, applied on connect.
//!
//! Repositories are traits (`TenantRepo`, `TokenRepo`, `NodeRepo`, `JobRepo`) implemented by
//! [`Store`]; callers depend on the traits, and every method maps rows to `allot-domain` types
//! so nothing above this crate sees sea-orm.

mod audit;
mod auth_failures;
mod beats;
mod convert;
mod credentials;
mod enrollment;
pub mod entities;
mod error;
mod fair_share;
mod group_commit;
mod identity;
mod jobs;
mod leader_memory;
mod leadership;
mod logs;
mod nodes;
mod pending;
mod samples;
mod scope;
mod sealed;
mod secrets;
mod sessions;
mod sign_ins;
mod sqlite_files;
mod submits;
mod tenant_secrets;
mod tenants;
#[cfg(feature = "testing")]
pub mod testing;
mod tokens;
mod volumes;
mod wakeups;

use std::sync::Arc;
use std::time::Duration;

use allot_domain::Clock;
use allot_migrations::{Migrator, MigratorTrait};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr,
    TransactionTrait,
};

pub use audit::{AuditBatcher, AuditRepo, AuditSearch, LogHead, StoredCheckpoint, StoredEntry};
pub use auth_failures::AuthFailureRepo;
pub use beats::{Beat, BeatBatcher, GpuSamples};
pub use credentials::CredentialRepo;
pub use enrollment::{
    Admission, BootstrapToken, EnrollmentRepo, NewBootstrapToken, NewNodeCertificate,
    NodeCertificate, REGISTRATION_RETRY_WINDOW,
};
pub use error::StoreError;
pub use fair_share::{FairShareHistory, FairShareRepo};
pub use identity::{IdentityRepo, NewBinding, SignIn};
pub use jobs::{JobFilter, JobPage, JobRepo, JobUpdate, LeaderRepo, NewJob};
pub use leader_memory::{LeaderMemoryRepo, LeaderMemoryWrite};
pub use leadership::{DeposedWrite, Fenced, JobWriter, Leader, LeaderTerm, LeadershipRepo, Term};
pub use logs::LogRepo;
pub use nodes::{NodeAdmin, NodeRegistration, NodeRepo};
pub use pending::PendingJobs;
pub use samples::{JobSample, JobSamplePoint, RESOLUTIONS, SamplePoint, SampleRepo};
pub use scope::TenantScope;
pub use secrets::{SecretKeys, SecretsError};
pub use sessions::{NewSession, SessionRepo};
pub use sign_ins::{PendingSignIn, SignInRepo};
pub use submits::SubmitBatcher;
pub use tenant_secrets::SecretRepo;
pub use tenants::{TenantDeletion, TenantRepo};
pub use tokens::{NewToken, TokenReader, TokenRepo};
pub use volumes::VolumeRepo;
pub use wakeups::{WAKEUP_CHANNEL, Wakeup, WakeupListener};

/// The newest PostgreSQL server programs installed here (`initdb`, `pg_ctl`, `postgres`), in
/// Debian's layout (`/usr/lib/postgresql/<major>/bin`): for the throwaway clusters the
/// benchmarks and tests start.
pub fn postgres_server_bindir() -> Option<std::path::PathBuf> {
    let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

/// How long PostgreSQL lets a transaction sit idle before it ends the session.
pub const IDLE_TRANSACTION_TIMEOUT: &str = "5s";

/// The database handle shared by the API, the gRPC service and the scheduler loop.
#[derive(Clone, Debug)]
pub struct Store {
    db: DatabaseConnection,
    clock: Arc<dyn Clock>,
    /// Seals the secrets kept in the database (see [`SecretKeys`]).
    secrets: Arc<SecretKeys>,
    /// Set on a leader's handle ([`Store::fenced`]): its transactions commit only while
    /// the leader's term holds.
    fence: Option<Arc<leadership::Fence>>,
}

impl Store {
    /// Connects to `url` (`sqlite://…` or `postgres://…`) and applies pending migrations.
    pub async fn connect(url: &str, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let mut opts = ConnectOptions::new(url.to_owned());
        opts.connect_timeout(Duration::from_secs(10))
            .acquire_timeout(Duration::from_secs(30))
            .sqlx_logging(false);
        if url.starts_with("sqlite:") {
            sqlite_files::make_private(url)?;
            // SQLite allows one writer; a single connection serialises access instead of
            // failing with SQLITE_BUSY when two transactions upgrade to write at once.
            opts.max_connections(1).min_connections(1);
        } else {
            opts.max_connections(16)
                // A connection in use within the last second is taken as alive, not pinged
                // first: a round trip saved on each statement outside a transaction. One
                // that broke meanwhile (a database failover) fails its statement as
                // unavailable, and the pool replaces it.
                .test_before_acquire_if_idle_for(Duration::from_secs(1));
            // A transaction left idle (its process frozen, stalled or cut off mid-commit)
            // is ended by the server, releasing its row locks: otherwise a leader frozen
            // while it holds the lease row, or a job's or an audit log's row, would stall
            // every replica waiting on them, a takeover included.
            opts.map_sqlx_postgres_opts(|o| {
                o.options([(
                    "idle_in_transaction_session_timeout",
                    IDLE_TRANSACTION_TIMEOUT,
                )])
            });
        }
        let db = Database::connect(opts).await?;
        if db.get_database_backend() == DbBackend::Sqlite {
            db.execute_unprepared("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON;")
                .await?;
        }
        migrate(&db).await?;
        let secrets =
            Arc::new(SecretKeys::ephemeral().map_err(|e| StoreError::Refused(e.to_string()))?);
        Ok(Self {
            db,
            clock,
            secrets,
            fence: None,
        })
    }

    /// Seals and opens stored secrets with `keys` instead of a key that lives only as long
    /// as the process.
    pub fn with_secret_keys(mut self, keys: SecretKeys) -> Self {
        self.secrets = Arc::new(keys);
        self
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.db.ping().await.map_err(StoreError::from)
    }

    /// `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self.db.get_database_backend() {
            DbBackend::Sqlite => "sqlite",
            DbBackend::Postgres => "postgres",
            _ => "other",
        }
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// This handle's database, pool and fence, stamping times from `clock` instead: what
    /// another replica, whose clock is not this one's, writes.
    pub fn with_clock(&self, clock: Arc<dyn Clock>) -> Store {
        Store {
            clock,
            ..self.clone()
        }
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(self) -> Result<(), StoreError> {
        self.db.close().await.map_err(StoreError::from)
    }
}

/// Applies pending migrations. A schema that is already current is left alone without
/// touching DDL, so the PostgreSQL application role (which may not create or alter tables;
/// see `allot_migrations::postgres_app_role_grants`) connects once the owner has migrated.
///
/// On PostgreSQL the migrations run in one transaction holding [`MIGRATION_LOCK`]: replicas
/// started together on an empty or older database migrate one after the other, the later
/// ones finding the work done, instead of racing to create the same tables.
async fn migrate(db: &DatabaseConnection) -> Result<(), StoreError> {
    if schema_current(db).await {
        return Ok(());
    }
    let failed = |e: DbErr| {
        StoreError::Migrate(format!(
            "{e} (pending migrations need the schema owner: start once as the owner, or run `allot db migrate`)"
        ))
    };
    if db.get_database_backend() != DbBackend::Postgres {
        return Migrator::up(db, None).await.map_err(failed);
    }
    let txn = db.begin().await?;
    txn.execute_unprepared(&format!("SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        .await?;
    // Another replica may have migrated while this one waited for the lock. The check
    // runs in a savepoint: on a database never migrated it fails (no migrations table),
    // which would otherwise abort the whole transaction.
    let check = txn.begin().await?;
    let current = schema_current(&check).await;
    check.rollback().await?;
    if !current {
        Migrator::up(&txn, None).await.map_err(failed)?;
    }
    txn.commit().await?;
    Ok(())
}

/// The PostgreSQL advisory lock key migrations are applied under (any fixed number no
/// other application on the database uses; this one spells "allot mig" in ASCII hex,
/// truncated to fit a bigint).
pub const MIGRATION_LOCK: i64 = 0x616c_6c6f_746d_6967;

/// Whether every migration this build knows has been applied.
async fn schema_current(db: &impl ConnectionTrait) -> bool {
    let applied = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT version FROM seaql_migrations",
        ))
        .await
        .and_then(|rows| {
            rows.iter()
                .map(|r| r.try_get::<String>("", "version"))
                .collect::<Result<Vec<_>, _>>()
        });
    applied.is_ok_and(|applied| {
        Migrator::migrations()
            .iter()
            .all(|m| applied.iter().any(|a| a == m.name()))
    })
}

/// A fresh, time-ordered identifier (UUIDv7) from the injected clock.
pub(crate) fn new_id(clock: &dyn Clock) -> String {
    let now = clock.now();
    let ts = uuid::Timestamp::from_unix(
        uuid::NoContext,
        now.timestamp().max(0) as u64,
        now.timestamp_subsec_nanos(),
    );
    uuid::Uuid::new_v7(ts).to_string()
}
