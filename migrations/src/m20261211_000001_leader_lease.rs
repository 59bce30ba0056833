//! Leadership among control-plane replicas: one row saying which replica leads, under which
//! epoch and until when. A replica takes it over only once it has expired, incrementing the
//! epoch; every write the leader makes as leader checks, in its own transaction, that the
//! row still holds its epoch unexpired (the fencing token), so a leader that was paused and
//! lost the lease writes nothing when it wakes.

use sea_orm_migration::prelude::*;

use crate::columns::ts;

#[derive(DeriveIden)]
enum LeaderLease {
    Table,
    Name,
    Holder,
    Address,
    Epoch,
    ExpiresAt,
    AcquiredAt,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(LeaderLease::Table)
                .col(
                    ColumnDef::new(LeaderLease::Name)
                        .string_len(32)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(LeaderLease::Holder).string().not_null())
                .col(ColumnDef::new(LeaderLease::Address).string().not_null())
                .col(ColumnDef::new(LeaderLease::Epoch).big_integer().not_null())
                .col(ts(LeaderLease::ExpiresAt))
                .col(ts(LeaderLease::AcquiredAt))
                .to_owned(),
        )
        .await?;
        // The one row, expired since the epoch began: the first replica to look takes it.
        let never = sea_orm_migration::sea_orm::prelude::ChronoDateTimeUtc::UNIX_EPOCH;
        let mut insert = Query::insert();
        insert
            .into_table(LeaderLease::Table)
            .columns([
                LeaderLease::Name,
                LeaderLease::Holder,
                LeaderLease::Address,
                LeaderLease::Epoch,
                LeaderLease::ExpiresAt,
                LeaderLease::AcquiredAt,
            ])
            .values([
                "control-plane".into(),
                "".into(),
                "".into(),
                0i64.into(),
                never.into(),
                never.into(),
            ])
            .map_err(|e| DbErr::Custom(e.to_string()))?;
        m.exec_stmt(insert.to_owned()).await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(LeaderLease::Table).to_owned())
            .await
    }
}
