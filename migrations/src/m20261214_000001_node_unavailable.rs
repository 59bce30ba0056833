//! Why a node takes no new work, as its agent says in its heartbeats (its data dir's file
//! system is low on space); empty: it takes work.

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Unavailable,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(
                    ColumnDef::new(Nodes::Unavailable)
                        .text()
                        .not_null()
                        .default(""),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .drop_column(Nodes::Unavailable)
                .to_owned(),
        )
        .await
    }
}
