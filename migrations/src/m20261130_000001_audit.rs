//! The audit log: one head row per log (its size and the right edge of its Merkle tree),
//! append-only entries, legal holds, and triggers that refuse to change or remove an entry.
//!
//! The one change an entry may undergo is pruning: its payload (`body`, `actor`, `target`)
//! is cleared while its position, time, leaf hash, action and outcome stay, so the Merkle
//! tree and every proof remain valid. The triggers allow exactly that, and only for logs
//! that are not under legal hold.

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
    Actor,
    Action,
    Target,
    Outcome,
}

#[derive(DeriveIden)]
enum AuditHolds {
    Table,
    LogId,
    Reason,
    SetBy,
    SetAt,
}

const POSTGRES_APPEND_ONLY: &str = r#"
CREATE FUNCTION allot_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit entries are append-only (% refused)', TG_OP;
END $$;
CREATE FUNCTION allot_audit_entries_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.body IS NOT NULL AND NEW.body IS NULL
        AND NEW.actor IS NULL AND NEW.target IS NULL
        AND NEW.log_id = OLD.log_id AND NEW.seq = OLD.seq AND NEW.at = OLD.at
        AND NEW.leaf_hash = OLD.leaf_hash AND NEW.action = OLD.action
        AND NEW.outcome = OLD.outcome THEN
        IF EXISTS (SELECT 1 FROM audit_holds WHERE log_id = OLD.log_id) THEN
            RAISE EXCEPTION 'audit log % is under legal hold (pruning refused)', OLD.log_id;
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit entries are append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER audit_entries_no_update_delete BEFORE UPDATE OR DELETE ON audit_entries
    FOR EACH ROW EXECUTE FUNCTION allot_audit_entries_guard();
CREATE TRIGGER audit_entries_no_truncate BEFORE TRUNCATE ON audit_entries
    FOR EACH STATEMENT EXECUTE FUNCTION allot_audit_append_only();
"#;

const SQLITE_APPEND_ONLY: &str = r#"
CREATE TRIGGER audit_entries_no_update BEFORE UPDATE ON audit_entries
WHEN NOT (OLD.body IS NOT NULL AND NEW.body IS NULL AND NEW.actor IS NULL
    AND NEW.target IS NULL AND NEW.log_id = OLD.log_id AND NEW.seq = OLD.seq
    AND NEW.at = OLD.at AND NEW.leaf_hash = OLD.leaf_hash AND NEW.action = OLD.action
    AND NEW.outcome = OLD.outcome)
BEGIN SELECT RAISE(ABORT, 'audit entries are append-only (UPDATE refused)'); END;
CREATE TRIGGER audit_entries_held BEFORE UPDATE ON audit_entries
WHEN EXISTS (SELECT 1 FROM audit_holds WHERE log_id = OLD.log_id)
BEGIN SELECT RAISE(ABORT, 'audit log is under legal hold (pruning refused)'); END;
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
                // The canonical JSON bytes that were hashed, as UTF-8 text; NULL once pruned.
                .col(ColumnDef::new(AuditEntries::Body).text().null())
                // Search columns, copied from the body: `<kind>:<id>` of the actor, the
                // dotted action, the target resource and the outcome.
                .col(ColumnDef::new(AuditEntries::Actor).string_len(200).null())
                .col(
                    ColumnDef::new(AuditEntries::Action)
                        .string_len(100)
                        .not_null(),
                )
                .col(ColumnDef::new(AuditEntries::Target).text().null())
                .col(
                    ColumnDef::new(AuditEntries::Outcome)
                        .string_len(16)
                        .not_null(),
                )
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
        m.create_index(
            Index::create()
                .name("idx_audit_entries_log_at")
                .table(AuditEntries::Table)
                .col(AuditEntries::LogId)
                .col(AuditEntries::At)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(AuditHolds::Table)
                .col(
                    ColumnDef::new(AuditHolds::LogId)
                        .string_len(36)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(AuditHolds::Reason).text().not_null())
                .col(ColumnDef::new(AuditHolds::SetBy).string_len(200).not_null())
                .col(
                    ColumnDef::new(AuditHolds::SetAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
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
                .execute_unprepared(
                    "DROP FUNCTION IF EXISTS allot_audit_entries_guard() CASCADE; \
                     DROP FUNCTION IF EXISTS allot_audit_append_only() CASCADE",
                )
                .await?;
        }
        m.drop_table(Table::drop().table(AuditHolds::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(AuditEntries::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(AuditLogs::Table).to_owned())
            .await
    }
}
