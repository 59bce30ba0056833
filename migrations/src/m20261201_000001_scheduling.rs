//! What the scheduling engine decides with: tenants nest (teams) and have a guarantee, a
//! hard limit and a weight per resource plus a minimum isolation; jobs ask for CPU, memory,
//! GPU shares, models, priority, preemptibility and isolation, and remember their placement's
//! share, whether it borrows, their attempt and a pending preemption; nodes offer CPU and
//! memory.
//!
//! Existing whole-GPU caps become GPU-milli limits (`max_gpus * 1000`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    ParentId,
    MaxGpus,
    GuaranteedGpuMilli,
    GuaranteedCpuMilli,
    GuaranteedMemoryBytes,
    GuaranteedGpuMemoryBytes,
    MaxGpuMilli,
    MaxCpuMilli,
    MaxMemoryBytes,
    Weight,
    MinIsolation,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    CpuMilli,
    MemoryBytes,
    GpuMilli,
    GpuModels,
    Priority,
    Preemptible,
    Isolation,
    WorkloadClass,
    HeldGpuMilli,
    Borrowing,
    Attempt,
    PreemptReason,
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    CpuMilli,
    MemoryBytes,
}

fn big(col: impl IntoIden, default: i64) -> ColumnDef {
    ColumnDef::new(col)
        .big_integer()
        .not_null()
        .default(default)
        .take()
}

fn int(col: impl IntoIden, default: i32) -> ColumnDef {
    ColumnDef::new(col)
        .integer()
        .not_null()
        .default(default)
        .take()
}

fn flag(col: impl IntoIden, default: bool) -> ColumnDef {
    ColumnDef::new(col)
        .boolean()
        .not_null()
        .default(default)
        .take()
}

/// SQLite alters one column per statement, so every column gets its own.
async fn add(m: &SchemaManager<'_>, table: impl IntoIden, col: ColumnDef) -> Result<(), DbErr> {
    m.alter_table(Table::alter().table(table).add_column(col).to_owned())
        .await
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        let t = || Tenants::Table;
        add(
            m,
            t(),
            ColumnDef::new(Tenants::ParentId)
                .string_len(36)
                .null()
                .take(),
        )
        .await?;
        add(m, t(), big(Tenants::GuaranteedGpuMilli, 0)).await?;
        add(m, t(), big(Tenants::GuaranteedCpuMilli, 0)).await?;
        add(m, t(), big(Tenants::GuaranteedMemoryBytes, 0)).await?;
        add(m, t(), big(Tenants::GuaranteedGpuMemoryBytes, 0)).await?;
        for col in [
            Tenants::MaxGpuMilli,
            Tenants::MaxCpuMilli,
            Tenants::MaxMemoryBytes,
        ] {
            add(m, t(), ColumnDef::new(col).big_integer().null().take()).await?;
        }
        add(m, t(), int(Tenants::Weight, 1)).await?;
        add(
            m,
            t(),
            ColumnDef::new(Tenants::MinIsolation)
                .string_len(16)
                .not_null()
                .default("shared")
                .take(),
        )
        .await?;
        m.exec_stmt(
            Query::update()
                .table(Tenants::Table)
                .value(Tenants::MaxGpuMilli, Expr::col(Tenants::MaxGpus).mul(1000))
                .and_where(Expr::col(Tenants::MaxGpus).is_not_null())
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Tenants::Table)
                .drop_column(Tenants::MaxGpus)
                .to_owned(),
        )
        .await?;

        let j = || Jobs::Table;
        add(m, j(), int(Jobs::CpuMilli, 0)).await?;
        add(m, j(), big(Jobs::MemoryBytes, 0)).await?;
        add(
            m,
            j(),
            ColumnDef::new(Jobs::GpuMilli).integer().null().take(),
        )
        .await?;
        add(
            m,
            j(),
            ColumnDef::new(Jobs::GpuModels)
                .text()
                .not_null()
                .default("[]")
                .take(),
        )
        .await?;
        add(m, j(), int(Jobs::Priority, 0)).await?;
        add(m, j(), flag(Jobs::Preemptible, true)).await?;
        add(
            m,
            j(),
            ColumnDef::new(Jobs::Isolation).string_len(16).null().take(),
        )
        .await?;
        add(
            m,
            j(),
            ColumnDef::new(Jobs::WorkloadClass)
                .string_len(16)
                .null()
                .take(),
        )
        .await?;
        add(
            m,
            j(),
            ColumnDef::new(Jobs::HeldGpuMilli).integer().null().take(),
        )
        .await?;
        add(m, j(), flag(Jobs::Borrowing, false)).await?;
        add(m, j(), int(Jobs::Attempt, 1)).await?;
        add(
            m,
            j(),
            ColumnDef::new(Jobs::PreemptReason).text().null().take(),
        )
        .await?;

        add(m, Nodes::Table, big(Nodes::CpuMilli, 0)).await?;
        add(m, Nodes::Table, big(Nodes::MemoryBytes, 0)).await?;
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        add(
            m,
            Tenants::Table,
            ColumnDef::new(Tenants::MaxGpus).integer().null().take(),
        )
        .await?;
        m.exec_stmt(
            Query::update()
                .table(Tenants::Table)
                .value(Tenants::MaxGpus, Expr::col(Tenants::MaxGpuMilli).div(1000))
                .and_where(Expr::col(Tenants::MaxGpuMilli).is_not_null())
                .to_owned(),
        )
        .await?;
        let drops = [
            (Tenants::Table.into_iden(), Tenants::ParentId.into_iden()),
            (
                Tenants::Table.into_iden(),
                Tenants::GuaranteedGpuMilli.into_iden(),
            ),
            (
                Tenants::Table.into_iden(),
                Tenants::GuaranteedCpuMilli.into_iden(),
            ),
            (
                Tenants::Table.into_iden(),
                Tenants::GuaranteedMemoryBytes.into_iden(),
            ),
            (
                Tenants::Table.into_iden(),
                Tenants::GuaranteedGpuMemoryBytes.into_iden(),
            ),
            (Tenants::Table.into_iden(), Tenants::MaxGpuMilli.into_iden()),
            (Tenants::Table.into_iden(), Tenants::MaxCpuMilli.into_iden()),
            (
                Tenants::Table.into_iden(),
                Tenants::MaxMemoryBytes.into_iden(),
            ),
            (Tenants::Table.into_iden(), Tenants::Weight.into_iden()),
            (
                Tenants::Table.into_iden(),
                Tenants::MinIsolation.into_iden(),
            ),
            (Jobs::Table.into_iden(), Jobs::CpuMilli.into_iden()),
            (Jobs::Table.into_iden(), Jobs::MemoryBytes.into_iden()),
            (Jobs::Table.into_iden(), Jobs::GpuMilli.into_iden()),
            (Jobs::Table.into_iden(), Jobs::GpuModels.into_iden()),
            (Jobs::Table.into_iden(), Jobs::Priority.into_iden()),
            (Jobs::Table.into_iden(), Jobs::Preemptible.into_iden()),
            (Jobs::Table.into_iden(), Jobs::Isolation.into_iden()),
            (Jobs::Table.into_iden(), Jobs::WorkloadClass.into_iden()),
            (Jobs::Table.into_iden(), Jobs::HeldGpuMilli.into_iden()),
            (Jobs::Table.into_iden(), Jobs::Borrowing.into_iden()),
            (Jobs::Table.into_iden(), Jobs::Attempt.into_iden()),
            (Jobs::Table.into_iden(), Jobs::PreemptReason.into_iden()),
            (Nodes::Table.into_iden(), Nodes::CpuMilli.into_iden()),
            (Nodes::Table.into_iden(), Nodes::MemoryBytes.into_iden()),
        ];
        for (table, col) in drops {
            m.alter_table(Table::alter().table(table).drop_column(col).to_owned())
                .await?;
        }
        Ok(())
    }
}
