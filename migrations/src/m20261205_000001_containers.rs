//! Confined jobs: the image a job runs (`jobs.image`), the digest its tag resolved to at
//! its first pull (`jobs.image_digest`), its network (`jobs.network`); what runs a node's
//! jobs (`nodes.runtime`); and a tenant's policy: the image registries it may use
//! (`tenants.image_registries`, JSON) and whether its jobs must run confined
//! (`tenants.require_confinement`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Image,
    ImageDigest,
    Network,
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Runtime,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    ImageRegistries,
    RequireConfinement,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            ColumnDef::new(Jobs::Image).string().null().take(),
            ColumnDef::new(Jobs::ImageDigest).string().null().take(),
            ColumnDef::new(Jobs::Network)
                .string()
                .not_null()
                .default("host")
                .take(),
        ] {
            m.alter_table(Table::alter().table(Jobs::Table).add_column(col).to_owned())
                .await?;
        }
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(
                    ColumnDef::new(Nodes::Runtime)
                        .string()
                        .not_null()
                        .default(""),
                )
                .to_owned(),
        )
        .await?;
        for col in [
            ColumnDef::new(Tenants::ImageRegistries)
                .text()
                .not_null()
                .default("[]")
                .take(),
            ColumnDef::new(Tenants::RequireConfinement)
                .boolean()
                .not_null()
                .default(false)
                .take(),
        ] {
            m.alter_table(
                Table::alter()
                    .table(Tenants::Table)
                    .add_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [Jobs::Image, Jobs::ImageDigest, Jobs::Network] {
            m.alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .drop_column(Nodes::Runtime)
                .to_owned(),
        )
        .await?;
        for col in [Tenants::ImageRegistries, Tenants::RequireConfinement] {
            m.alter_table(
                Table::alter()
                    .table(Tenants::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
