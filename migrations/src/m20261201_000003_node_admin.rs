//! What operators decide about nodes: a cordoned node takes no new work; a drained GPU
//! takes none until it is returned to service.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Cordoned,
    DrainedGpus,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            ColumnDef::new(Nodes::Cordoned)
                .boolean()
                .not_null()
                .default(false)
                .take(),
            // JSON array of GPU UUIDs.
            ColumnDef::new(Nodes::DrainedGpus)
                .text()
                .not_null()
                .default("[]")
                .take(),
        ] {
            // SQLite alters one column per statement.
            m.alter_table(
                Table::alter()
                    .table(Nodes::Table)
                    .add_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [Nodes::Cordoned.into_iden(), Nodes::DrainedGpus.into_iden()] {
            m.alter_table(
                Table::alter()
                    .table(Nodes::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
