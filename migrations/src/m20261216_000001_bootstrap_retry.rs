//! A registration whose answer was lost may be sent again with its bootstrap token: the
//! token remembers the key it admitted (`bootstrap_tokens.used_key`, the hex SHA-256 of the
//! key's subject public key info), and a retry proves it holds that key.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum BootstrapTokens {
    Table,
    UsedKey,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(BootstrapTokens::Table)
                .add_column(ColumnDef::new(BootstrapTokens::UsedKey).string().null())
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(BootstrapTokens::Table)
                .drop_column(BootstrapTokens::UsedKey)
                .to_owned(),
        )
        .await
    }
}
