//! Fresh databases for tests: one new SQLite file or one new PostgreSQL database per call.
//!
//! PostgreSQL tests need `ALLOT_TEST_POSTGRES_URL` (a server URL whose user may create
//! databases); `scripts/test` starts a throwaway cluster and sets it. Without it they fail
//! with a message saying so, rather than passing silently.

use std::sync::Arc;

use allot_domain::{Clock, SystemClock};
use sea_orm::{ConnectionTrait, Database};

use crate::{Store, StoreError};

pub const POSTGRES_URL_ENV: &str = "ALLOT_TEST_POSTGRES_URL";

/// Which database a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A database that exists for one test. The SQLite file is removed on drop; PostgreSQL
/// databases live in the throwaway cluster and go with it.
#[derive(Debug)]
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> Result<Self, StoreError> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()
                    .map_err(|e| StoreError::Corrupt(format!("temp dir: {e}")))?;
                let url = format!(
                    "sqlite://{}?mode=rwc",
                    dir.path().join("allot.db").display()
                );
                Ok(Self {
                    url,
                    _dir: Some(dir),
                })
            }
            Backend::Postgres => {
                let admin = std::env::var(POSTGRES_URL_ENV).map_err(|_| {
                    StoreError::Corrupt(format!(
                        "{POSTGRES_URL_ENV} is not set: run ./scripts/test, which starts a throwaway PostgreSQL"
                    ))
                })?;
                let name = format!("allot_test_{}", uuid::Uuid::new_v4().simple());
                let conn = Database::connect(admin.as_str()).await?;
                conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await?;
                conn.close().await?;
                Ok(Self {
                    url: with_database(&admin, &name),
                    _dir: None,
                })
            }
        }
    }

    pub async fn store(&self, clock: Arc<dyn Clock>) -> Result<Store, StoreError> {
        Store::connect(&self.url, clock).await
    }

    pub async fn store_with_system_clock(&self) -> Result<Store, StoreError> {
        self.store(Arc::new(SystemClock)).await
    }

    /// This database's URL with another user and password.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let scheme_end = self.url.find("://").map_or(0, |i| i + 3);
        let rest = &self.url[scheme_end..];
        let host_start = match (rest.find('@'), rest.find('/')) {
            (Some(at), Some(slash)) if at < slash => at + 1,
            (Some(at), None) => at + 1,
            _ => 0,
        };
        format!(
            "{}{user}:{password}@{}",
            &self.url[..scheme_end],
            &rest[host_start..]
        )
    }
}

/// Replaces the database name in a PostgreSQL URL.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_part = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{host_part}/{db}?{q}"),
        None => format!("{host_part}/{db}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn replaces_database_name() {
        assert_eq!(
            super::with_database("postgres://u@127.0.0.1:5432/postgres", "x"),
            "postgres://u@127.0.0.1:5432/x"
        );
        assert_eq!(
            super::with_database("postgres://u@h:1?sslmode=disable", "x"),
            "postgres://u@h:1/x?sslmode=disable"
        );
    }
}
