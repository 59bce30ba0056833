//! Job logs: each attempt's output as its node ships it while it runs, in chunks keyed by
//! their byte offset in the attempt's log. Only each attempt's last part is kept
//! (`allot_domain::joblog::KEPT_BYTES`); older chunks are deleted as new ones arrive.

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum JobLogs {
    Table,
    JobId,
    Attempt,
    Offset,
    Data,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(JobLogs::Table)
                .col(ColumnDef::new(JobLogs::JobId).string_len(36).not_null())
                .col(ColumnDef::new(JobLogs::Attempt).integer().not_null())
                .col(ColumnDef::new(JobLogs::Offset).big_integer().not_null())
                .col(ColumnDef::new(JobLogs::Data).blob().not_null())
                .primary_key(
                    Index::create()
                        .col(JobLogs::JobId)
                        .col(JobLogs::Attempt)
                        .col(JobLogs::Offset),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(JobLogs::Table).to_owned())
            .await
    }
}
