//! Auto-sized jobs (`--gpus auto`, `--gpu-memory auto`): the most share Allot may give a job
//! whose share it sizes (`jobs.gpu_auto_max_milli`, null: a share that is fixed) and whether
//! it sizes the job's GPU memory limit (`jobs.gpu_memory_auto`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    GpuAutoMaxMilli,
    GpuMemoryAuto,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            ColumnDef::new(Jobs::GpuAutoMaxMilli)
                .integer()
                .null()
                .take(),
            ColumnDef::new(Jobs::GpuMemoryAuto)
                .boolean()
                .not_null()
                .default(false)
                .take(),
        ] {
            m.alter_table(Table::alter().table(Jobs::Table).add_column(col).to_owned())
                .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [Jobs::GpuAutoMaxMilli, Jobs::GpuMemoryAuto] {
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
