//! Topology: each GPU's NVLink domain (GPUs of one domain talk over NVLink or NVSwitch;
//! NULL: none), each node's labels (an operator's, e.g. `rack=r12`), a JSON object, and
//! a gang's `pack` (the label its replicas share a value of, JSON; NULL: none).

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Gpus {
    Table,
    NvlinkDomain,
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Labels,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Pack,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Gpus::Table)
                .add_column(ColumnDef::new(Gpus::NvlinkDomain).integer().null())
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(
                    ColumnDef::new(Nodes::Labels)
                        .text()
                        .not_null()
                        .default("{}"),
                )
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(ColumnDef::new(Jobs::Pack).text().null())
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Gpus::Table)
                .drop_column(Gpus::NvlinkDomain)
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .drop_column(Nodes::Labels)
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .drop_column(Jobs::Pack)
                .to_owned(),
        )
        .await
    }
}
