//! A counter every change to the tenants table increments in its own transaction: a
//! replica keeps the tenant tree it last read and reads it again only when the counter,
//! read with each API token in the same statement, has moved.

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum TenantsVersion {
    Table,
    Id,
    Version,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(TenantsVersion::Table)
                .col(
                    ColumnDef::new(TenantsVersion::Id)
                        .integer()
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(TenantsVersion::Version)
                        .big_integer()
                        .not_null(),
                )
                .to_owned(),
        )
        .await?;
        let mut insert = Query::insert();
        insert
            .into_table(TenantsVersion::Table)
            .columns([TenantsVersion::Id, TenantsVersion::Version])
            .values([1i32.into(), 0i64.into()])
            .map_err(|e| DbErr::Custom(e.to_string()))?;
        m.exec_stmt(insert.to_owned()).await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(TenantsVersion::Table).to_owned())
            .await
    }
}
