//! Where a job writes its checkpoints, so that a later attempt can restore from them.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    CheckpointDir,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(ColumnDef::new(Jobs::CheckpointDir).text().null())
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .drop_column(Jobs::CheckpointDir)
                .to_owned(),
        )
        .await
    }
}
