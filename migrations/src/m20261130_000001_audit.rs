//! The audit log: one head row per log (its size and the right edge of its Merkle tree),
//! append-only entries, and triggers that refuse to change or remove an entry.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum AuditLogs {
    Table,
    LogId,
    Size,
    Frontier,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum AuditEntries {
    Table,
    LogId,
    Seq,
    At,
    LeafHash,
    Body,
}

const POSTGRES_APPEND_ONLY: &str = r#"
CREATE FUNCTION allot_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit entries are append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER audit_entries_no_update_delete BEFORE UPDATE OR DELETE ON audit_entries
    FOR EACH ROW EXECUTE FUNCTION allot_audit_append_only();
CREATE TRIGGER audit_entries_no_truncate BEFORE TRUNCATE ON audit_entries
    FOR EACH STATEMENT EXECUTE FUNCTION allot_audit_append_only();
"#;

const SQLITE_APPEND_ONLY: &str = r#"
CREATE TRIGGER audit_entries_no_update BEFORE UPDATE ON audit_entries
BEGIN SELECT RAISE(ABORT, 'audit entries are append-only (UPDATE refused)'); END;
CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries
BEGIN SELECT RAISE(ABORT, 'audit entries are append-only (DELETE refused)'); END;
"#;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(AuditLogs::Table)
                .col(
                    ColumnDef::new(AuditLogs::LogId)
                        .string_len(36)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(AuditLogs::Size).big_integer().not_null())
                // Hex of the frontier hashes, concatenated (64 characters each).
                .col(ColumnDef::new(AuditLogs::Frontier).text().not_null())
                .col(
                    ColumnDef::new(AuditLogs::UpdatedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(AuditEntries::Table)
                .col(
                    ColumnDef::new(AuditEntries::LogId)
                        .string_len(36)
                        .not_null(),
                )
                .col(ColumnDef::new(AuditEntries::Seq).big_integer().not_null())
                .col(
                    ColumnDef::new(AuditEntries::At)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(AuditEntries::LeafHash)
                        .string_len(64)
                        .not_null(),
                )
                // The canonical JSON bytes that were hashed, as UTF-8 text.
                .col(ColumnDef::new(AuditEntries::Body).text().not_null())
                .primary_key(
                    Index::create()
                        .col(AuditEntries::LogId)
                        .col(AuditEntries::Seq),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("idx_audit_entries_at")
                .table(AuditEntries::Table)
                .col(AuditEntries::At)
                .to_owned(),
        )
        .await?;
        let db = m.get_connection();
        match m.get_database_backend() {
            DbBackend::Postgres => db.execute_unprepared(POSTGRES_APPEND_ONLY).await?,
            _ => db.execute_unprepared(SQLITE_APPEND_ONLY).await?,
        };
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        if m.get_database_backend() == DbBackend::Postgres {
            m.get_connection()
                .execute_unprepared("DROP FUNCTION IF EXISTS allot_audit_append_only() CASCADE")
                .await?;
        }
        m.drop_table(Table::drop().table(AuditEntries::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(AuditLogs::Table).to_owned())
            .await
    }
}
