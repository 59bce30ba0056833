use sea_orm::{DbErr, SqlErr};

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
    /// A batched audit append failed (the message of the underlying error).
    #[error("audit batch failed: {0}")]
    Batch(String),
    /// A leader's write after its leadership ended (another replica leads now, or its
    /// lease expired unrenewed): refused, written nowhere.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The schema is behind and could not be brought up to date.
    #[error("database schema: {0}")]
    Migrate(String),
}

impl From<DbErr> for StoreError {
    fn from(err: DbErr) -> Self {
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
