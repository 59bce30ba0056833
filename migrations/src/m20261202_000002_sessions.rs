//! Browser sessions of people signed in through the identity provider. Only the SHA-256 of
//! a session id is stored; the claims the provider vouched for at sign-in are kept, so
//! claim-based roles apply to the session as they would to a token.

use sea_orm_migration::prelude::*;

use crate::columns::{ts, ts_null};

#[derive(DeriveIden)]
enum Sessions {
    Table,
    IdHash,
    UserId,
    CsrfToken,
    Claims,
    CreatedAt,
    LastSeenAt,
    ExpiresAt,
    EndedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(Sessions::Table)
                .col(
                    ColumnDef::new(Sessions::IdHash)
                        .string_len(64)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(Sessions::UserId).string_len(36).not_null())
                .col(
                    ColumnDef::new(Sessions::CsrfToken)
                        .string_len(64)
                        .not_null(),
                )
                // JSON object.
                .col(ColumnDef::new(Sessions::Claims).text().not_null())
                .col(ts(Sessions::CreatedAt))
                .col(ts(Sessions::LastSeenAt))
                .col(ts(Sessions::ExpiresAt))
                .col(ts_null(Sessions::EndedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(Sessions::Table, Sessions::UserId)
                        .to(Users::Table, Users::Id),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(Sessions::Table).to_owned())
            .await
    }
}
