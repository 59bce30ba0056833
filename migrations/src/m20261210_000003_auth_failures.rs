//! Failed authentications per client address, in the database rather than one process's
//! memory, so every replica counts them together: the start of the source's window and
//! its failures in it.

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveIden)]
enum AuthFailures {
    Table,
    Source,
    WindowStart,
    Failures,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(AuthFailures::Table)
                .col(
                    ColumnDef::new(AuthFailures::Source)
                        .string_len(255)
                        .not_null()
                        .primary_key(),
                )
                .col(ts(AuthFailures::WindowStart))
                .col(ColumnDef::new(AuthFailures::Failures).integer().not_null())
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(AuthFailures::Table).to_owned())
            .await
    }
}
