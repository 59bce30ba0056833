//! Deposed writes, seen in the rows themselves: each job row records the epoch of the leader
//! handle that last wrote it (`jobs.writer_epoch`; NULL when the last writer was no leader
//! handle: a submit, a cancel through any replica), and `leader_terms` records when each
//! term began. A row last written under epoch e after a term e' > e had begun was written
//! by a leader that had already lost its lease.

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    WriterEpoch,
}

#[derive(DeriveIden)]
enum LeaderTerms {
    Table,
    Epoch,
    Holder,
    Instance,
    StartedAt,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(ColumnDef::new(Jobs::WriterEpoch).big_integer().null())
                .to_owned(),
        )
        .await?;
        // One row per term taken, written in the takeover's transaction: only ever appended.
        m.create_table(
            Table::create()
                .table(LeaderTerms::Table)
                .col(
                    ColumnDef::new(LeaderTerms::Epoch)
                        .big_integer()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(LeaderTerms::Holder).string().not_null())
                .col(ColumnDef::new(LeaderTerms::Instance).string().not_null())
                .col(ts(LeaderTerms::StartedAt))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(LeaderTerms::Table).to_owned())
            .await?;
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .drop_column(Jobs::WriterEpoch)
                .to_owned(),
        )
        .await
    }
}
