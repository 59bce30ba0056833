//! Each tenant's decayed past GPU use (fair share over time, `--fair-share-half-life`), in
//! the database rather than the scheduling process's memory, so a restarted control plane
//! (or another replica taking over) carries the history on: GPU-seconds as of `recorded_at`.

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveIden)]
enum FairShareUsage {
    Table,
    TenantId,
    GpuSeconds,
    RecordedAt,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(FairShareUsage::Table)
                .col(
                    ColumnDef::new(FairShareUsage::TenantId)
                        .string_len(36)
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(FairShareUsage::GpuSeconds)
                        .double()
                        .not_null(),
                )
                .col(ts(FairShareUsage::RecordedAt))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(FairShareUsage::Table).to_owned())
            .await
    }
}
