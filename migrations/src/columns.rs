//! Column shapes every table uses: ids and timestamps.

use sea_orm_migration::prelude::*;

/// A UUID primary key, as text.
pub fn id(col: impl IntoIden) -> ColumnDef {
    ColumnDef::new(col)
        .string_len(36)
        .not_null()
        .primary_key()
        .take()
}

pub fn ts(col: impl IntoIden) -> ColumnDef {
    ColumnDef::new(col)
        .timestamp_with_time_zone()
        .not_null()
        .take()
}

pub fn ts_null(col: impl IntoIden) -> ColumnDef {
    ColumnDef::new(col).timestamp_with_time_zone().null().take()
}
