//! Signed checkpoints of the audit logs, append-only like the entries they cover.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum AuditCheckpoints {
    Table,
    LogId,
    Size,
    Root,
    Note,
    CreatedAt,
}

const POSTGRES_APPEND_ONLY: &str = r#"
CREATE TRIGGER audit_checkpoints_no_update_delete BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION allot_audit_append_only();
CREATE TRIGGER audit_checkpoints_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION allot_audit_append_only();
"#;

const SQLITE_APPEND_ONLY: &str = r#"
CREATE TRIGGER audit_checkpoints_no_update BEFORE UPDATE ON audit_checkpoints
BEGIN SELECT RAISE(ABORT, 'audit checkpoints are append-only (UPDATE refused)'); END;
CREATE TRIGGER audit_checkpoints_no_delete BEFORE DELETE ON audit_checkpoints
BEGIN SELECT RAISE(ABORT, 'audit checkpoints are append-only (DELETE refused)'); END;
"#;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(AuditCheckpoints::Table)
                .col(
                    ColumnDef::new(AuditCheckpoints::LogId)
                        .string_len(36)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(AuditCheckpoints::Size)
                        .big_integer()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(AuditCheckpoints::Root)
                        .string_len(64)
                        .not_null(),
                )
                // The whole signed note, as served and exported.
                .col(ColumnDef::new(AuditCheckpoints::Note).text().not_null())
                .col(
                    ColumnDef::new(AuditCheckpoints::CreatedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .primary_key(
                    Index::create()
                        .col(AuditCheckpoints::LogId)
                        .col(AuditCheckpoints::Size),
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
        m.drop_table(Table::drop().table(AuditCheckpoints::Table).to_owned())
            .await
    }
}
