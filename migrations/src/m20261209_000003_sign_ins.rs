//! Web sign-ins in progress: what the callback needs, kept in the database so that the
//! provider may send the browser back to any replica. Keyed by the SHA-256 of the sign-in's
//! `state`; the PKCE verifier, the nonce and where to return are sealed under the secrets
//! key. Taken once; expired ones are swept as new ones start.

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveIden)]
enum SignIns {
    Table,
    StateHash,
    Sealed,
    StartedAt,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(SignIns::Table)
                .col(
                    ColumnDef::new(SignIns::StateHash)
                        .string_len(64)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(SignIns::Sealed).text().not_null())
                .col(ts(SignIns::StartedAt))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(SignIns::Table).to_owned())
            .await
    }
}
