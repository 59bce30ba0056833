//! Deleted tenants: a tenant is marked deleted, never removed, so that its audit log, its
//! jobs' history and its host uid range keep naming it (the name and the uid slot stay
//! taken).

use sea_orm_migration::prelude::*;

use crate::columns::ts_null;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    DeletedAt,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .add_column(ts_null(Tenants::DeletedAt))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .drop_column(Tenants::DeletedAt)
                .to_owned(),
        )
        .await
    }
}
