//! A node's GPUs by their node: every heartbeat reads its node's (and a changed inventory
//! replaces them), which without this index scanned every GPU of the fleet each time.

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Gpus {
    Table,
    NodeId,
    Idx,
}

const INDEX: &str = "idx_gpus_node_id";

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_index(
            Index::create()
                .name(INDEX)
                .table(Gpus::Table)
                .col(Gpus::NodeId)
                .col(Gpus::Idx)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(Index::drop().name(INDEX).table(Gpus::Table).to_owned())
            .await
    }
}
