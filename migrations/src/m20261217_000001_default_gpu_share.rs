//! The share an auto-sized job starts at is its tenant's (`tenants.job_default_gpu_milli`,
//! thousandths of a GPU; absent: its parent's, else the platform's), as the tenant's
//! other job defaults are.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    JobDefaultGpuMilli,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .add_column(
                    ColumnDef::new(Tenants::JobDefaultGpuMilli)
                        .big_integer()
                        .null(),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .drop_column(Tenants::JobDefaultGpuMilli)
                .to_owned(),
        )
        .await
    }
}
