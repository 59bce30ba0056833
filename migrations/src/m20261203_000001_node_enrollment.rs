//! Node enrollment over mutual TLS: one-time bootstrap tokens (only their SHA-256 is kept)
//! and every node certificate the internal CA issued, by serial, so that a certificate
//! authenticates only while its row says it is current.

use sea_orm_migration::prelude::*;

use crate::columns::{id, ts, ts_null};

#[derive(DeriveIden)]
enum BootstrapTokens {
    Table,
    Id,
    SecretHash,
    Description,
    CreatedBy,
    CreatedAt,
    ExpiresAt,
    UsedAt,
    UsedBy,
}

#[derive(DeriveIden)]
enum NodeCertificates {
    Table,
    Serial,
    NodeId,
    IssuedAt,
    ExpiresAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum Nodes {
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
                .table(BootstrapTokens::Table)
                .col(id(BootstrapTokens::Id))
                .col(
                    ColumnDef::new(BootstrapTokens::SecretHash)
                        .string_len(64)
                        .not_null()
                        .unique_key(),
                )
                .col(
                    ColumnDef::new(BootstrapTokens::Description)
                        .string_len(200)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(BootstrapTokens::CreatedBy)
                        .string_len(255)
                        .not_null(),
                )
                .col(ts(BootstrapTokens::CreatedAt))
                .col(ts(BootstrapTokens::ExpiresAt))
                .col(ts_null(BootstrapTokens::UsedAt))
                // The name of the node that used it.
                .col(
                    ColumnDef::new(BootstrapTokens::UsedBy)
                        .string_len(253)
                        .null(),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(NodeCertificates::Table)
                .col(
                    ColumnDef::new(NodeCertificates::Serial)
                        .string_len(40)
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(NodeCertificates::NodeId)
                        .string_len(36)
                        .not_null(),
                )
                .col(ts(NodeCertificates::IssuedAt))
                .col(ts(NodeCertificates::ExpiresAt))
                .col(ts_null(NodeCertificates::RevokedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(NodeCertificates::Table, NodeCertificates::NodeId)
                        .to(Nodes::Table, Nodes::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("node_certificates_node")
                .table(NodeCertificates::Table)
                .col(NodeCertificates::NodeId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(NodeCertificates::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(BootstrapTokens::Table).to_owned())
            .await
    }
}
