//! Default and most CPU and memory per job, per tenant (as a Kubernetes LimitRange): a job
//! asking for none gets the default, one asking for more than the maximum is refused. Each
//! column is the tenant's own setting; NULL takes the parent's, then the platform's.

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    JobDefaultCpuMilli,
    JobDefaultMemoryBytes,
    JobMaxCpuMilli,
    JobMaxMemoryBytes,
}

const COLUMNS: [Tenants; 4] = [
    Tenants::JobDefaultCpuMilli,
    Tenants::JobDefaultMemoryBytes,
    Tenants::JobMaxCpuMilli,
    Tenants::JobMaxMemoryBytes,
];

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters a table one change at a time.
        for col in COLUMNS {
            m.alter_table(
                Table::alter()
                    .table(Tenants::Table)
                    .add_column(ColumnDef::new(col).big_integer().null())
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in COLUMNS {
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
