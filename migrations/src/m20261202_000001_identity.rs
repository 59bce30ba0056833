//! People who sign in through the identity provider, and the roles granted to them or to a
//! claim they carry (`groups=ml-team`) through the API.

use sea_orm_migration::prelude::*;

use crate::columns::{id, ts, ts_null};

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    Issuer,
    Subject,
    Email,
    Name,
    CreatedAt,
    LastSeenAt,
    DeletedAt,
}

#[derive(DeriveIden)]
enum RoleBindings {
    Table,
    Id,
    UserId,
    Claim,
    ClaimValue,
    Role,
    TenantId,
    CreatedAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(Users::Table)
                .col(id(Users::Id))
                .col(ColumnDef::new(Users::Issuer).string_len(512).not_null())
                .col(ColumnDef::new(Users::Subject).string_len(255).not_null())
                .col(ColumnDef::new(Users::Email).string_len(320).null())
                .col(ColumnDef::new(Users::Name).string_len(256).null())
                .col(ts(Users::CreatedAt))
                .col(ts(Users::LastSeenAt))
                .col(ts_null(Users::DeletedAt))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("users_issuer_subject")
                .table(Users::Table)
                .col(Users::Issuer)
                .col(Users::Subject)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(RoleBindings::Table)
                .col(id(RoleBindings::Id))
                // Exactly one subject: a user, or a claim and its value.
                .col(ColumnDef::new(RoleBindings::UserId).string_len(36).null())
                .col(ColumnDef::new(RoleBindings::Claim).string_len(128).null())
                .col(
                    ColumnDef::new(RoleBindings::ClaimValue)
                        .string_len(512)
                        .null(),
                )
                .col(ColumnDef::new(RoleBindings::Role).string_len(32).not_null())
                .col(ColumnDef::new(RoleBindings::TenantId).string_len(36).null())
                .col(ts(RoleBindings::CreatedAt))
                .col(ts_null(RoleBindings::RevokedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(RoleBindings::Table, RoleBindings::UserId)
                        .to(Users::Table, Users::Id),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(RoleBindings::Table, RoleBindings::TenantId)
                        .to(Tenants::Table, Tenants::Id),
                )
                .check(
                    Expr::col(RoleBindings::UserId)
                        .is_not_null()
                        .and(Expr::col(RoleBindings::Claim).is_null())
                        .or(Expr::col(RoleBindings::UserId).is_null().and(
                            Expr::col(RoleBindings::Claim)
                                .is_not_null()
                                .and(Expr::col(RoleBindings::ClaimValue).is_not_null()),
                        )),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("role_bindings_user")
                .table(RoleBindings::Table)
                .col(RoleBindings::UserId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(RoleBindings::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(Users::Table).to_owned())
            .await
    }
}

#[derive(DeriveMigrationName)]
pub struct Migration;
