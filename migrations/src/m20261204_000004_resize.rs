//! Live resizing: whether a job on shares of GPUs allows it (`jobs.gpu_resizable`), and the
//! share a job holds from an event on (`job_events.gpu_milli`, `.gpu_memory_bytes`: set at
//! placement and at each resize), which accounting follows.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    GpuResizable,
}

#[derive(DeriveIden)]
enum JobEvents {
    Table,
    GpuMilli,
    GpuMemoryBytes,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(
                    ColumnDef::new(Jobs::GpuResizable)
                        .boolean()
                        .not_null()
                        .default(false),
                )
                .to_owned(),
        )
        .await?;
        for col in [
            ColumnDef::new(JobEvents::GpuMilli).integer().null().take(),
            ColumnDef::new(JobEvents::GpuMemoryBytes)
                .big_integer()
                .null()
                .take(),
        ] {
            m.alter_table(
                Table::alter()
                    .table(JobEvents::Table)
                    .add_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .drop_column(Jobs::GpuResizable)
                .to_owned(),
        )
        .await?;
        for col in [JobEvents::GpuMilli, JobEvents::GpuMemoryBytes] {
            m.alter_table(
                Table::alter()
                    .table(JobEvents::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
