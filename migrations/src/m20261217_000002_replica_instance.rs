//! A replica is its name and an instance drawn when its process starts
//! (`leader_lease.instance`): the lease is renewed, and taken back before it lapses, only by
//! the instance that holds it, so two live replicas given one name no longer take the lease
//! from each other.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum LeaderLease {
    Table,
    Instance,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(LeaderLease::Table)
                .add_column(
                    ColumnDef::new(LeaderLease::Instance)
                        .string()
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
                .table(LeaderLease::Table)
                .drop_column(LeaderLease::Instance)
                .to_owned(),
        )
        .await
    }
}
