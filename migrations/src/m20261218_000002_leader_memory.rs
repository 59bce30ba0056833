//! What the leader's scheduling remembers between passes beyond the jobs themselves (the
//! placement policy's learned workload mix and the last job it was told of, the pass count
//! its generator is drawn from, the elastic planner's burst state and demand history), saved
//! by the leader after each pass that changed it and taken up by the next leader, so a
//! change of leader changes no decision. One row per part, its value JSON.

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveIden)]
enum LeaderMemory {
    Table,
    Name,
    Value,
    SavedAt,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(LeaderMemory::Table)
                .col(
                    ColumnDef::new(LeaderMemory::Name)
                        .string_len(64)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(LeaderMemory::Value).text().not_null())
                .col(ts(LeaderMemory::SavedAt))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(LeaderMemory::Table).to_owned())
            .await
    }
}
