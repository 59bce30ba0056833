//! GPU samples, downsampled as they are written: one row per GPU per 10-second bucket (kept
//! a day) and per 5-minute bucket (kept 90 days), each holding sums and a count so that a
//! bucket's average is exact however many samples fell in it.

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveIden)]
enum GpuSamples {
    Table,
    GpuUuid,
    ResolutionSecs,
    At,
    NodeId,
    UtilizationSum,
    MemoryUsedSum,
    PowerSum,
    TemperatureSum,
    Count,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(GpuSamples::Table)
                .col(
                    ColumnDef::new(GpuSamples::GpuUuid)
                        .string_len(128)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(GpuSamples::ResolutionSecs)
                        .integer()
                        .not_null(),
                )
                .col(ts(GpuSamples::At))
                .col(ColumnDef::new(GpuSamples::NodeId).string_len(36).not_null())
                .col(
                    ColumnDef::new(GpuSamples::UtilizationSum)
                        .double()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(GpuSamples::MemoryUsedSum)
                        .double()
                        .not_null(),
                )
                .col(ColumnDef::new(GpuSamples::PowerSum).double().not_null())
                .col(
                    ColumnDef::new(GpuSamples::TemperatureSum)
                        .double()
                        .not_null(),
                )
                .col(ColumnDef::new(GpuSamples::Count).integer().not_null())
                .primary_key(
                    Index::create()
                        .col(GpuSamples::GpuUuid)
                        .col(GpuSamples::ResolutionSecs)
                        .col(GpuSamples::At),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("gpu_samples_by_time")
                .table(GpuSamples::Table)
                .col(GpuSamples::ResolutionSecs)
                .col(GpuSamples::At)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(GpuSamples::Table).to_owned())
            .await
    }
}
