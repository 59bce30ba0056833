//! Tenant secrets: values sealed under the secrets key (`tenant_secrets.sealed`, bound to
//! their tenant and name), and the ones each job uses (`jobs.secrets`, JSON references by
//! name: never a value).

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Secrets,
}

#[derive(DeriveIden)]
enum TenantSecrets {
    Table,
    TenantId,
    Name,
    Sealed,
    UpdatedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(
                    ColumnDef::new(Jobs::Secrets)
                        .text()
                        .not_null()
                        .default("[]"),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(TenantSecrets::Table)
                .col(
                    ColumnDef::new(TenantSecrets::TenantId)
                        .string_len(36)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(TenantSecrets::Name)
                        .string_len(63)
                        .not_null(),
                )
                .col(ColumnDef::new(TenantSecrets::Sealed).text().not_null())
                .col(ts(TenantSecrets::UpdatedAt))
                .primary_key(
                    Index::create()
                        .col(TenantSecrets::TenantId)
                        .col(TenantSecrets::Name),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(TenantSecrets::Table, TenantSecrets::TenantId)
                        .to(Tenants::Table, Tenants::Id),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(TenantSecrets::Table).to_owned())
            .await?;
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .drop_column(Jobs::Secrets)
                .to_owned(),
        )
        .await
    }
}
