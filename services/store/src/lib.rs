//! Persistence for the control plane: sea-orm over PostgreSQL (production) or SQLite (the
//! embedded default). The schema comes only from `allot-migrations`, applied on connect.
//!
//! Repositories are traits (`TenantRepo`, `TokenRepo`, `NodeRepo`, `JobRepo`) implemented by
//! [`Store`]; callers depend on the traits, and every method maps rows to `allot-domain` types
//! so nothing above this crate sees sea-orm.

mod audit;
mod auth_failures;
mod convert;
mod credentials;
mod enrollment;
pub mod entities;
mod error;
mod fair_share;
mod identity;
mod jobs;
mod leadership;
mod logs;
mod nodes;
mod samples;
mod scope;
mod secrets;
mod sessions;
mod sign_ins;
mod tenant_secrets;
mod tenants;
#[cfg(feature = "testing")]
pub mod testing;
mod tokens;
mod volumes;

use std::sync::Arc;
use std::time::Duration;

use allot_domain::Clock;
use allot_migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend};

pub use audit::{AuditBatcher, AuditRepo, AuditSearch, LogHead, StoredCheckpoint, StoredEntry};
pub use auth_failures::AuthFailureRepo;
pub use credentials::CredentialRepo;
pub use enrollment::{
    Admission, BootstrapToken, EnrollmentRepo, NewBootstrapToken, NewNodeCertificate,
    NodeCertificate,
};
pub use error::StoreError;
pub use fair_share::{FairShareHistory, FairShareRepo};
pub use identity::{IdentityRepo, NewBinding, SignIn};
pub use jobs::{JobFilter, JobPage, JobRepo, JobUpdate, NewJob};
pub use leadership::{Leader, LeadershipRepo, Term};
pub use logs::LogRepo;
pub use nodes::{NodeAdmin, NodeRegistration, NodeRepo};
pub use samples::{JobSample, JobSamplePoint, RESOLUTIONS, Sample, SamplePoint, SampleRepo};
pub use scope::TenantScope;
pub use secrets::{SecretKeys, SecretsError};
pub use sessions::{NewSession, SessionRepo};
pub use sign_ins::{PendingSignIn, SignInRepo};
pub use tenant_secrets::SecretRepo;
pub use tenants::{TenantDeletion, TenantRepo};
pub use tokens::{NewToken, TokenRepo};
pub use volumes::VolumeRepo;

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
            // SQLite allows one writer; a single connection serialises access instead of
            // failing with SQLITE_BUSY when two transactions upgrade to write at once.
            opts.max_connections(1).min_connections(1);
        } else {
            opts.max_connections(16);
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

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(self) -> Result<(), StoreError> {
        self.db.close().await.map_err(StoreError::from)
    }
}

/// Applies pending migrations. A schema that is already current is left alone without
/// touching DDL, so the PostgreSQL application role (which may not create or alter tables;
/// see `allot_migrations::postgres_app_role_grants`) connects once the owner has migrated.
async fn migrate(db: &DatabaseConnection) -> Result<(), StoreError> {
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
    if let Ok(applied) = applied
        && Migrator::migrations()
            .iter()
            .all(|m| applied.iter().any(|a| a == m.name()))
    {
        return Ok(());
    }
    Migrator::up(db, None).await.map_err(|e| {
        StoreError::Migrate(format!(
            "{e} (pending migrations need the schema owner: start once as the owner, or run `allot db migrate`)"
        ))
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
