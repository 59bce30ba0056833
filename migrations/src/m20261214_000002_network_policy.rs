//! A job's own network by default: tenants' network policy (`tenants.egress`, JSON, null for
//! the default egress: anywhere but the node, link-local addresses and other jobs; and
//! `tenants.allow_host_network`). Jobs not yet started that were stored with `host` (the
//! old default, which no tenant's policy allows yet) are moved to `private` (the new
//! default): no job gets the node's network without an admin's say.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Egress,
    AllowHostNetwork,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Network,
    State,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            ColumnDef::new(Tenants::Egress).text().null().take(),
            ColumnDef::new(Tenants::AllowHostNetwork)
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
        m.exec_stmt(
            Query::update()
                .table(Jobs::Table)
                .value(Jobs::Network, "private")
                .and_where(Expr::col(Jobs::Network).eq("host"))
                .and_where(Expr::col(Jobs::State).is_in(["pending", "scheduled"]))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [Tenants::Egress, Tenants::AllowHostNetwork] {
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
