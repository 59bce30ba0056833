//! Jobs' time limits: the longest an attempt may run, in seconds (none: no limit).

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    TimeLimitSecs,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(ColumnDef::new(Jobs::TimeLimitSecs).big_integer().null())
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .drop_column(Jobs::TimeLimitSecs)
                .to_owned(),
        )
        .await
    }
}
