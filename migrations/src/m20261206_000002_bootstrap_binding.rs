//! Bootstrap tokens bound to the node they admit: `node_name` (a name, or a pattern with
//! `*`; tokens made before this admit no one) and `replace_existing` (whether it may take
//! over the name of a node already registered, an admin's explicit choice).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum BootstrapTokens {
    Table,
    NodeName,
    ReplaceExisting,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            ColumnDef::new(BootstrapTokens::NodeName)
                .string()
                .not_null()
                .default("")
                .take(),
            ColumnDef::new(BootstrapTokens::ReplaceExisting)
                .boolean()
                .not_null()
                .default(false)
                .take(),
        ] {
            m.alter_table(
                Table::alter()
                    .table(BootstrapTokens::Table)
                    .add_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [BootstrapTokens::NodeName, BootstrapTokens::ReplaceExisting] {
            m.alter_table(
                Table::alter()
                    .table(BootstrapTokens::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
