use sea_orm::{DbErr, RuntimeErr, SqlErr};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    /// A uniqueness rule or a concurrent change got in the way.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Credentials that do not (or no longer) admit their holder, or a request the
    /// stored state cannot take.
    #[error("refused: {0}")]
    Refused(String),
    /// A row that does not map back to the domain (a bug or a hand-edited database).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("database error: {0}")]
    Db(DbErr),
    /// The database cannot be reached, or cannot take writes just now (its primary is
    /// failing over): nothing was written, and the same request may succeed when retried.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A batched audit append failed (the message of the underlying error).
    #[error("audit batch failed: {0}")]
    Batch(String),
    /// A leader's write after its leadership ended (another replica leads now, or its
    /// lease expired unrenewed): refused, written nowhere.
    #[error("fenced: {0}")]
    Fenced(String),
    /// What a decision was made on changed before it could be written (the tenants'
    /// quotas, for a placement): nothing was written; decide again on a fresh read.
    #[error("stale: {0}")]
    Stale(String),
    /// The schema is behind and could not be brought up to date.
    #[error("database schema: {0}")]
    Migrate(String),
}

impl From<DbErr> for StoreError {
    fn from(err: DbErr) -> Self {
        if unavailable(&err) {
            return StoreError::Unavailable(err.to_string());
        }
        match err.sql_err() {
            Some(SqlErr::UniqueConstraintViolation(msg)) => StoreError::Conflict(msg),
            _ => StoreError::Db(err),
        }
    }
}

impl From<allot_domain::TransitionError> for StoreError {
    fn from(err: allot_domain::TransitionError) -> Self {
        StoreError::Conflict(err.to_string())
    }
}

/// Whether `err` says the database could not be reached or could not take a write at that
/// moment rather than that the statement was wrong: the connection failed or broke, the
/// pool had no connection to give, or the server it reached is shutting down, starting up
/// or read-only (a standby, mid-failover).
fn unavailable(err: &DbErr) -> bool {
    use sea_orm::sqlx::Error as Sqlx;
    match err {
        DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => true,
        DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) => {
            match &**e {
                Sqlx::Io(_)
                | Sqlx::Tls(_)
                | Sqlx::Protocol(_)
                | Sqlx::PoolTimedOut
                | Sqlx::PoolClosed
                | Sqlx::WorkerCrashed => true,
                Sqlx::Database(db) => db.code().is_some_and(|code| unavailable_sqlstate(&code)),
                _ => false,
            }
        }
        _ => false,
    }
}

/// PostgreSQL's codes for a server that cannot serve the statement now: connection
/// exceptions (class 08), a read-only transaction (25006: a standby), and the shutdown and
/// start-up codes of class 57 (57P01–57P03).
fn unavailable_sqlstate(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "25006" | "57P01" | "57P02" | "57P03")
}

impl StoreError {
    /// The same error, for a second waiter on one failed operation: unavailability stays
    /// unavailability, anything else is told as a failed batch.
    pub(crate) fn retold(&self) -> StoreError {
        match self {
            StoreError::Unavailable(msg) => StoreError::Unavailable(msg.clone()),
            e => StoreError::Batch(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standby_and_shutdown_codes_are_unavailability_and_constraint_errors_are_not() {
        for code in ["08006", "08001", "25006", "57P01", "57P03"] {
            assert!(unavailable_sqlstate(code), "{code}");
        }
        for code in ["23505", "40001", "42P01", "25P02", "5"] {
            assert!(!unavailable_sqlstate(code), "{code}");
        }
        let conn = DbErr::Conn(RuntimeErr::Internal("refused".into()));
        assert!(matches!(StoreError::from(conn), StoreError::Unavailable(_)));
        let acquire = DbErr::ConnectionAcquire(sea_orm::error::ConnAcquireErr::Timeout);
        assert!(matches!(
            StoreError::from(acquire),
            StoreError::Unavailable(_)
        ));
        let custom = DbErr::Custom("no".into());
        assert!(matches!(StoreError::from(custom), StoreError::Db(_)));
    }
}
