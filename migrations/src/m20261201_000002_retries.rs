//! Retry policy: how often a job's failed attempts are retried, how many failed, and when
//! the next may start.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    MaxRetries,
    Failures,
    RetryAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            ColumnDef::new(Jobs::MaxRetries)
                .integer()
                .not_null()
                .default(0)
                .take(),
            ColumnDef::new(Jobs::Failures)
                .integer()
                .not_null()
                .default(0)
                .take(),
            ColumnDef::new(Jobs::RetryAt)
                .timestamp_with_time_zone()
                .null()
                .take(),
        ] {
            // SQLite alters one column per statement.
            m.alter_table(Table::alter().table(Jobs::Table).add_column(col).to_owned())
                .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            Jobs::MaxRetries.into_iden(),
            Jobs::Failures.into_iden(),
            Jobs::RetryAt.into_iden(),
        ] {
            m.alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
