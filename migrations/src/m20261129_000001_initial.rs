//! Tenants, API tokens, nodes and their GPUs, jobs and their state history.

use sea_orm_migration::prelude::*;

use crate::columns::{id, ts, ts_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
    Name,
    MaxGpus,
    MaxGpuMemoryBytes,
    CreatedAt,
}

#[derive(DeriveIden)]
enum ApiTokens {
    Table,
    Id,
    Name,
    TenantId,
    Role,
    SecretHash,
    CreatedAt,
    ExpiresAt,
    RevokedAt,
    LastUsedAt,
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Id,
    Name,
    SecretHash,
    AgentVersion,
    GpuBackend,
    RegisteredAt,
    LastHeartbeatAt,
    LeaseExpiresAt,
}

#[derive(DeriveIden)]
enum Gpus {
    Table,
    Uuid,
    NodeId,
    Idx,
    Model,
    MemoryBytes,
    Healthy,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Id,
    TenantId,
    Name,
    State,
    Gpus,
    GpuMemoryBytes,
    Command,
    Env,
    Workdir,
    PendingCode,
    PendingMessage,
    NodeId,
    GpuUuids,
    CancelRequested,
    Pid,
    ExitCode,
    Message,
    LogTail,
    CreatedAt,
    UpdatedAt,
    ScheduledAt,
    StartedAt,
    FinishedAt,
}

#[derive(DeriveIden)]
enum JobEvents {
    Table,
    Id,
    JobId,
    FromState,
    ToState,
    At,
    Message,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(Tenants::Table)
                .col(id(Tenants::Id))
                .col(
                    ColumnDef::new(Tenants::Name)
                        .string_len(63)
                        .not_null()
                        .unique_key(),
                )
                .col(ColumnDef::new(Tenants::MaxGpus).integer().null())
                .col(
                    ColumnDef::new(Tenants::MaxGpuMemoryBytes)
                        .big_integer()
                        .null(),
                )
                .col(ts(Tenants::CreatedAt))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(ApiTokens::Table)
                .col(id(ApiTokens::Id))
                .col(ColumnDef::new(ApiTokens::Name).string_len(128).not_null())
                .col(ColumnDef::new(ApiTokens::TenantId).string_len(36).null())
                .col(ColumnDef::new(ApiTokens::Role).string_len(32).not_null())
                .col(
                    ColumnDef::new(ApiTokens::SecretHash)
                        .string_len(64)
                        .not_null()
                        .unique_key(),
                )
                .col(ts(ApiTokens::CreatedAt))
                .col(ts_null(ApiTokens::ExpiresAt))
                .col(ts_null(ApiTokens::RevokedAt))
                .col(ts_null(ApiTokens::LastUsedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(ApiTokens::Table, ApiTokens::TenantId)
                        .to(Tenants::Table, Tenants::Id),
                )
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Nodes::Table)
                .col(id(Nodes::Id))
                .col(
                    ColumnDef::new(Nodes::Name)
                        .string_len(253)
                        .not_null()
                        .unique_key(),
                )
                .col(
                    ColumnDef::new(Nodes::SecretHash)
                        .string_len(64)
                        .not_null()
                        .unique_key(),
                )
                .col(
                    ColumnDef::new(Nodes::AgentVersion)
                        .string_len(64)
                        .not_null(),
                )
                .col(ColumnDef::new(Nodes::GpuBackend).string_len(32).not_null())
                .col(ts(Nodes::RegisteredAt))
                .col(ts(Nodes::LastHeartbeatAt))
                .col(ts(Nodes::LeaseExpiresAt))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Gpus::Table)
                .col(
                    ColumnDef::new(Gpus::Uuid)
                        .string_len(128)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(Gpus::NodeId).string_len(36).not_null())
                .col(ColumnDef::new(Gpus::Idx).integer().not_null())
                .col(ColumnDef::new(Gpus::Model).string_len(128).not_null())
                .col(ColumnDef::new(Gpus::MemoryBytes).big_integer().not_null())
                .col(ColumnDef::new(Gpus::Healthy).boolean().not_null())
                .foreign_key(
                    ForeignKey::create()
                        .from(Gpus::Table, Gpus::NodeId)
                        .to(Nodes::Table, Nodes::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Jobs::Table)
                .col(id(Jobs::Id))
                .col(ColumnDef::new(Jobs::TenantId).string_len(36).not_null())
                .col(ColumnDef::new(Jobs::Name).string_len(128).not_null())
                .col(ColumnDef::new(Jobs::State).string_len(16).not_null())
                .col(ColumnDef::new(Jobs::Gpus).integer().not_null())
                .col(ColumnDef::new(Jobs::GpuMemoryBytes).big_integer().null())
                .col(ColumnDef::new(Jobs::Command).text().not_null())
                .col(ColumnDef::new(Jobs::Env).text().not_null())
                .col(ColumnDef::new(Jobs::Workdir).text().null())
                .col(ColumnDef::new(Jobs::PendingCode).string_len(64).null())
                .col(ColumnDef::new(Jobs::PendingMessage).text().null())
                .col(ColumnDef::new(Jobs::NodeId).string_len(36).null())
                .col(ColumnDef::new(Jobs::GpuUuids).text().not_null())
                .col(ColumnDef::new(Jobs::CancelRequested).boolean().not_null())
                .col(ColumnDef::new(Jobs::Pid).big_integer().null())
                .col(ColumnDef::new(Jobs::ExitCode).integer().null())
                .col(ColumnDef::new(Jobs::Message).text().null())
                .col(ColumnDef::new(Jobs::LogTail).text().null())
                .col(ts(Jobs::CreatedAt))
                .col(ts(Jobs::UpdatedAt))
                .col(ts_null(Jobs::ScheduledAt))
                .col(ts_null(Jobs::StartedAt))
                .col(ts_null(Jobs::FinishedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(Jobs::Table, Jobs::TenantId)
                        .to(Tenants::Table, Tenants::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("idx_jobs_state")
                .table(Jobs::Table)
                .col(Jobs::State)
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("idx_jobs_tenant")
                .table(Jobs::Table)
                .col(Jobs::TenantId)
                .col(Jobs::Id)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(JobEvents::Table)
                .col(
                    ColumnDef::new(JobEvents::Id)
                        .big_integer()
                        .not_null()
                        .auto_increment()
                        .primary_key(),
                )
                .col(ColumnDef::new(JobEvents::JobId).string_len(36).not_null())
                .col(ColumnDef::new(JobEvents::FromState).string_len(16).null())
                .col(ColumnDef::new(JobEvents::ToState).string_len(16).not_null())
                .col(ts(JobEvents::At))
                .col(ColumnDef::new(JobEvents::Message).text().null())
                .foreign_key(
                    ForeignKey::create()
                        .from(JobEvents::Table, JobEvents::JobId)
                        .to(Jobs::Table, Jobs::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("idx_job_events_job")
                .table(JobEvents::Table)
                .col(JobEvents::JobId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            JobEvents::Table.into_iden(),
            Jobs::Table.into_iden(),
            Gpus::Table.into_iden(),
            Nodes::Table.into_iden(),
            ApiTokens::Table.into_iden(),
            Tenants::Table.into_iden(),
        ] {
            m.drop_table(Table::drop().table(table).to_owned()).await?;
        }
        Ok(())
    }
}
