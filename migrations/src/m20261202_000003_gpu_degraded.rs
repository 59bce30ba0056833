//! GPUs can be degraded: suspect but working (an informational XID such as page retirement,
//! or rising ECC counts); they keep their jobs and take no new work.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Gpus {
    Table,
    Degraded,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Gpus::Table)
                .add_column(
                    ColumnDef::new(Gpus::Degraded)
                        .boolean()
                        .not_null()
                        .default(false),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Gpus::Table)
                .drop_column(Gpus::Degraded)
                .to_owned(),
        )
        .await
    }
}
