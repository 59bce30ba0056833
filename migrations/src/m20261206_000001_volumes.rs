//! Shared storage and private registries: named volumes an operator declares (`volumes`),
//! the volumes a job mounts (`jobs.volumes`, JSON), tenants' registry pull credentials,
//! sealed (`registry_credentials.sealed`), and each tenant's host uid range on every node
//! (`tenants.uid_slot`), the same everywhere so files it writes to shared storage on one
//! node are its own on the next. And how a node holds jobs on each GPU to their GPU
//! memory (`gpus.memory_enforcement`).

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
    UidSlot,
}

#[derive(DeriveIden)]
enum Gpus {
    Table,
    MemoryEnforcement,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Volumes,
}

#[derive(DeriveIden)]
enum Volumes {
    Table,
    Name,
    HostPath,
    Tenants,
    ReadOnly,
    CreatedAt,
}

#[derive(DeriveIden)]
enum RegistryCredentials {
    Table,
    TenantId,
    Registry,
    Sealed,
    UpdatedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .add_column(ColumnDef::new(Tenants::UidSlot).integer().null())
                .to_owned(),
        )
        .await?;
        // Existing tenants get slots in the order they were made.
        m.get_connection()
            .execute_unprepared(
                "UPDATE tenants SET uid_slot = (SELECT COUNT(*) FROM tenants t2 \
                 WHERE t2.created_at < tenants.created_at \
                 OR (t2.created_at = tenants.created_at AND t2.id < tenants.id))",
            )
            .await?;
        m.create_index(
            Index::create()
                .name("tenants_uid_slot")
                .table(Tenants::Table)
                .col(Tenants::UidSlot)
                .unique()
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(
                    ColumnDef::new(Jobs::Volumes)
                        .text()
                        .not_null()
                        .default("[]"),
                )
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Gpus::Table)
                .add_column(
                    ColumnDef::new(Gpus::MemoryEnforcement)
                        .string()
                        .not_null()
                        .default("check"),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Volumes::Table)
                .col(
                    ColumnDef::new(Volumes::Name)
                        .string_len(63)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(Volumes::HostPath).text().not_null())
                .col(ColumnDef::new(Volumes::Tenants).text().not_null())
                .col(ColumnDef::new(Volumes::ReadOnly).boolean().not_null())
                .col(ts(Volumes::CreatedAt))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(RegistryCredentials::Table)
                .col(
                    ColumnDef::new(RegistryCredentials::TenantId)
                        .string_len(36)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(RegistryCredentials::Registry)
                        .string_len(255)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(RegistryCredentials::Sealed)
                        .text()
                        .not_null(),
                )
                .col(ts(RegistryCredentials::UpdatedAt))
                .primary_key(
                    Index::create()
                        .col(RegistryCredentials::TenantId)
                        .col(RegistryCredentials::Registry),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(RegistryCredentials::Table, RegistryCredentials::TenantId)
                        .to(Tenants::Table, Tenants::Id),
                )
                .to_owned(),
        )
        .await?;
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(RegistryCredentials::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(Volumes::Table).to_owned())
            .await?;
        m.alter_table(
            Table::alter()
                .table(Gpus::Table)
                .drop_column(Gpus::MemoryEnforcement)
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .drop_column(Jobs::Volumes)
                .to_owned(),
        )
        .await?;
        m.drop_index(
            Index::drop()
                .name("tenants_uid_slot")
                .table(Tenants::Table)
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .drop_column(Tenants::UidSlot)
                .to_owned(),
        )
        .await
    }
}
