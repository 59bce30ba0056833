//! Jobs found by their short id (`allot_domain::job::short_id`, the last 12 hex digits of
//! their UUID): an index on that expression, the same text in SQLite and PostgreSQL, and
//! the very expression the store's lookup filters on, so the lookup uses it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.get_connection()
            .execute_unprepared(
                r#"CREATE INDEX IF NOT EXISTS idx_jobs_short_id ON jobs (substr("id", 25))"#,
            )
            .await
            .map(|_| ())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.get_connection()
            .execute_unprepared("DROP INDEX IF EXISTS idx_jobs_short_id")
            .await
            .map(|_| ())
    }
}
