//! When the control plane received each chunk of a job's log, so that `allot job logs
//! --since 10m` starts at the first output written since (chunks are shipped every half
//! second, so that is the precision). Chunks kept before this migration have no time.

use sea_orm_migration::prelude::*;

use crate::columns::ts_null;

#[derive(DeriveIden)]
enum JobLogs {
    Table,
    WrittenAt,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(JobLogs::Table)
                .add_column(ts_null(JobLogs::WrittenAt))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(JobLogs::Table)
                .drop_column(JobLogs::WrittenAt)
                .to_owned(),
        )
        .await
    }
}
