//! Monthly GPU-hour budgets per tenant, in thousandths of a GPU-hour (NULL: none).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    GpuHourBudgetMilli,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .add_column(
                    ColumnDef::new(Tenants::GpuHourBudgetMilli)
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
                .drop_column(Tenants::GpuHourBudgetMilli)
                .to_owned(),
        )
        .await
    }
}
