//! Gangs: a job of several replicas, each a job record tied to the gang (its first
//! replica's id) by `gang_id` and its `replica_rank`; `replicas` is how many it has. Nodes
//! say the `address` other nodes reach them at (a gang's rendezvous on its first replica).

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Replicas,
    GangId,
    ReplicaRank,
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Address,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            ColumnDef::new(Jobs::Replicas)
                .integer()
                .not_null()
                .default(1)
                .take(),
            ColumnDef::new(Jobs::GangId).string_len(36).null().take(),
            ColumnDef::new(Jobs::ReplicaRank)
                .integer()
                .not_null()
                .default(0)
                .take(),
        ] {
            m.alter_table(Table::alter().table(Jobs::Table).add_column(col).to_owned())
                .await?;
        }
        m.create_index(
            Index::create()
                .name("jobs_gang")
                .table(Jobs::Table)
                .col(Jobs::GangId)
                .col(Jobs::ReplicaRank)
                .unique()
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(
                    ColumnDef::new(Nodes::Address)
                        .string_len(255)
                        .not_null()
                        .default(""),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(
            Index::drop()
                .name("jobs_gang")
                .table(Jobs::Table)
                .to_owned(),
        )
        .await?;
        for col in [Jobs::Replicas, Jobs::GangId, Jobs::ReplicaRank] {
            m.alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .drop_column(Nodes::Address)
                .to_owned(),
        )
        .await
    }
}
