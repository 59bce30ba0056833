//! MIG in the control plane: each GPU's reported MIG instances (JSON; NULL when the GPU is
//! not in MIG mode), the MIG profile a job asks for, and each tenant's per-profile limits
//! (a JSON object of profile name to instance count).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Gpus {
    Table,
    MigLayout,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    MigProfile,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    MigLimits,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Gpus::Table)
                .add_column(ColumnDef::new(Gpus::MigLayout).text().null())
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(ColumnDef::new(Jobs::MigProfile).string_len(32).null())
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .add_column(
                    ColumnDef::new(Tenants::MigLimits)
                        .text()
                        .not_null()
                        .default("{}"),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for (table, col) in [
            (Gpus::Table.into_iden(), Gpus::MigLayout.into_iden()),
            (Jobs::Table.into_iden(), Jobs::MigProfile.into_iden()),
            (Tenants::Table.into_iden(), Tenants::MigLimits.into_iden()),
        ] {
            m.alter_table(Table::alter().table(table).drop_column(col).to_owned())
                .await?;
        }
        Ok(())
    }
}
