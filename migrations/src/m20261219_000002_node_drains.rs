//! A drain as operators use it (`allot node drain NODE --reason TEXT --grace 10m`, as
//! Slurm's `scontrol update state=drain reason=…`): why the node was drained, shown beside
//! it, and until when its running jobs may finish before they are requeued elsewhere.

use sea_orm_migration::prelude::*;

use crate::columns::ts_null;

#[derive(DeriveIden)]
enum Nodes {
    Table,
    DrainReason,
    DrainDeadline,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(ColumnDef::new(Nodes::DrainReason).string_len(512).null())
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(ts_null(Nodes::DrainDeadline))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [Nodes::DrainDeadline, Nodes::DrainReason] {
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
