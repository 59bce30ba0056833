//! The GPUs a node may report (`nodes.approved_gpus`, a JSON array of UUIDs): those it
//! registered with using a bootstrap token. A heartbeat or a registration with the node's
//! certificate that claims any other is refused: a stolen node key cannot invent GPUs to
//! attract work. NULL for nodes registered before: their stored inventory stands for it.

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Nodes {
    Table,
    ApprovedGpus,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(ColumnDef::new(Nodes::ApprovedGpus).text().null())
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .drop_column(Nodes::ApprovedGpus)
                .to_owned(),
        )
        .await
    }
}
