//! Anti-affinity after faults: a job requeued for a device fault avoids the GPUs it held, and
//! one requeued because its node was lost avoids that node, until `avoid_until`.

use sea_orm_migration::prelude::*;

use crate::columns::ts_null;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    AvoidNodeId,
    AvoidGpus,
    AvoidUntil,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            ColumnDef::new(Jobs::AvoidNodeId)
                .string_len(36)
                .null()
                .take(),
            ColumnDef::new(Jobs::AvoidGpus).text().null().take(),
            ts_null(Jobs::AvoidUntil),
        ] {
            m.alter_table(Table::alter().table(Jobs::Table).add_column(col).to_owned())
                .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [Jobs::AvoidNodeId, Jobs::AvoidGpus, Jobs::AvoidUntil] {
            m.alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
