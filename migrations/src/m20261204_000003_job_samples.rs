//! Per-job samples (utilization and GPU memory), downsampled on write like GPU samples: 10-second
//! buckets kept a day, 5-minute buckets kept 90 days.

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveIden)]
enum JobSamples {
    Table,
    JobId,
    ResolutionSecs,
    At,
    UtilizationSum,
    MemoryUsedSum,
    Count,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(JobSamples::Table)
                .col(ColumnDef::new(JobSamples::JobId).string_len(36).not_null())
                .col(
                    ColumnDef::new(JobSamples::ResolutionSecs)
                        .integer()
                        .not_null(),
                )
                .col(ts(JobSamples::At))
                .col(
                    ColumnDef::new(JobSamples::UtilizationSum)
                        .double()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(JobSamples::MemoryUsedSum)
                        .double()
                        .not_null(),
                )
                .col(ColumnDef::new(JobSamples::Count).integer().not_null())
                .primary_key(
                    Index::create()
                        .col(JobSamples::JobId)
                        .col(JobSamples::ResolutionSecs)
                        .col(JobSamples::At),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("job_samples_by_time")
                .table(JobSamples::Table)
                .col(JobSamples::ResolutionSecs)
                .col(JobSamples::At)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(JobSamples::Table).to_owned())
            .await
    }
}
