//! More of each GPU sample: PCIe and NVLink traffic, throttle reasons (a bitmask of
//! `allot_domain::node::THROTTLE_REASONS`) and ECC counts.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum GpuSamples {
    Table,
    PcieRxSum,
    PcieTxSum,
    NvlinkRxSum,
    NvlinkTxSum,
    ThrottleMask,
    EccCorrected,
    EccUncorrected,
}

const SUMS: [GpuSamples; 4] = [
    GpuSamples::PcieRxSum,
    GpuSamples::PcieTxSum,
    GpuSamples::NvlinkRxSum,
    GpuSamples::NvlinkTxSum,
];
const COUNTS: [GpuSamples; 3] = [
    GpuSamples::ThrottleMask,
    GpuSamples::EccCorrected,
    GpuSamples::EccUncorrected,
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        let columns = SUMS
            .iter()
            .map(|c| ColumnDef::new(*c).double().not_null().default(0.0).take())
            .chain(COUNTS.iter().map(|c| {
                ColumnDef::new(*c)
                    .big_integer()
                    .not_null()
                    .default(0)
                    .take()
            }));
        for col in columns {
            m.alter_table(
                Table::alter()
                    .table(GpuSamples::Table)
                    .add_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in SUMS.iter().chain(COUNTS.iter()) {
            m.alter_table(
                Table::alter()
                    .table(GpuSamples::Table)
                    .drop_column(*col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
