//! Jobs by when their record last changed: the leader's scheduler reads only the jobs that
//! changed since its last pass instead of the whole backlog (the id in the index: the
//! listing of what changed reads the index alone).

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    UpdatedAt,
    Id,
}

const INDEX: &str = "idx_jobs_updated_at";

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_index(
            Index::create()
                .name(INDEX)
                .table(Jobs::Table)
                .col(Jobs::UpdatedAt)
                .col(Jobs::Id)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(Index::drop().name(INDEX).table(Jobs::Table).to_owned())
            .await
    }
}
