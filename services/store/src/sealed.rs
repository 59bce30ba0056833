//! Values kept sealed per tenant and key ([`crate::SecretKeys`]): tenants' secrets and
//! their registry pull credentials are two tables of one shape, written, listed, opened
//! and removed here alone. A value is bound to its row (table, tenant, key), so a value
//! copied to another row does not open; what anyone is shown, and what the audit log
//! records, is only a key and when it was set.

use allot_domain::{AuditContext, AuditEvent};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
};

use crate::audit::record;
use crate::entities::{registry_credentials, tenant_secrets};
use crate::{Store, StoreError};

/// One table of sealed values: its columns, and what its rows are called.
pub(crate) trait SealedTable: EntityTrait {
    /// The table's name: part of what a value is bound to.
    const TABLE: &'static str;
    /// The audit actions' prefix (`.set`, `.delete` follow).
    const ACTION: &'static str;
    /// What the audit target calls a key (`tenant/ID/<TARGET>/KEY`).
    const TARGET: &'static str;
    fn tenant_column() -> Self::Column;
    fn key_column() -> Self::Column;
    fn sealed_column() -> Self::Column;
    fn updated_column() -> Self::Column;
    fn row(tenant_id: &str, key: &str, sealed: String, at: DateTime<Utc>) -> Self::ActiveModel;
    /// A row's key, sealed value and when it was set.
    fn read(m: Self::Model) -> (String, String, DateTime<Utc>);
}

impl SealedTable for tenant_secrets::Entity {
    const TABLE: &'static str = "tenant_secrets";
    const ACTION: &'static str = "tenant.secret";
    const TARGET: &'static str = "secret";
    fn tenant_column() -> Self::Column {
        tenant_secrets::Column::TenantId
    }
    fn key_column() -> Self::Column {
        tenant_secrets::Column::Name
    }
    fn sealed_column() -> Self::Column {
        tenant_secrets::Column::Sealed
    }
    fn updated_column() -> Self::Column {
        tenant_secrets::Column::UpdatedAt
    }
    fn row(tenant_id: &str, key: &str, sealed: String, at: DateTime<Utc>) -> Self::ActiveModel {
        use sea_orm::ActiveValue::Set;
        tenant_secrets::ActiveModel {
            tenant_id: Set(tenant_id.to_owned()),
            name: Set(key.to_owned()),
            sealed: Set(sealed),
            updated_at: Set(at),
        }
    }
    fn read(m: Self::Model) -> (String, String, DateTime<Utc>) {
        (m.name, m.sealed, m.updated_at)
    }
}

impl SealedTable for registry_credentials::Entity {
    const TABLE: &'static str = "registry_credentials";
    const ACTION: &'static str = "tenant.registry_credential";
    const TARGET: &'static str = "registry";
    fn tenant_column() -> Self::Column {
        registry_credentials::Column::TenantId
    }
    fn key_column() -> Self::Column {
        registry_credentials::Column::Registry
    }
    fn sealed_column() -> Self::Column {
        registry_credentials::Column::Sealed
    }
    fn updated_column() -> Self::Column {
        registry_credentials::Column::UpdatedAt
    }
    fn row(tenant_id: &str, key: &str, sealed: String, at: DateTime<Utc>) -> Self::ActiveModel {
        use sea_orm::ActiveValue::Set;
        registry_credentials::ActiveModel {
            tenant_id: Set(tenant_id.to_owned()),
            registry: Set(key.to_owned()),
            sealed: Set(sealed),
            updated_at: Set(at),
        }
    }
    fn read(m: Self::Model) -> (String, String, DateTime<Utc>) {
        (m.registry, m.sealed, m.updated_at)
    }
}

/// What a sealed value is bound to: its row.
fn binding<T: SealedTable>(tenant_id: &str, key: &str) -> Vec<u8> {
    format!("{}\0{tenant_id}\0{key}", T::TABLE).into_bytes()
}

fn target<T: SealedTable>(tenant_id: &str, key: &str) -> String {
    format!("tenant/{tenant_id}/{}/{key}", T::TARGET)
}

/// Seals `plain` for `tenant_id`'s `key` and sets (or replaces) it, audited with `shown`
/// (what may be shown of it) in the same transaction. Returns when it was set.
pub(crate) async fn put<T: SealedTable>(
    store: &Store,
    ctx: &AuditContext,
    tenant_id: &str,
    key: &str,
    plain: &[u8],
    shown: impl FnOnce(DateTime<Utc>) -> serde_json::Value,
) -> Result<DateTime<Utc>, StoreError>
where
    T::ActiveModel: Send,
{
    let sealed = store
        .secrets
        .seal(&binding::<T>(tenant_id, key), plain)
        .map_err(|e| StoreError::Refused(e.to_string()))?;
    let now = store.clock.now();
    let txn = store.begin().await?;
    T::insert(T::row(tenant_id, key, sealed, now))
        .on_conflict(
            OnConflict::columns([T::tenant_column(), T::key_column()])
                .update_columns([T::sealed_column(), T::updated_column()])
                .to_owned(),
        )
        .exec(&txn)
        .await?;
    let event = AuditEvent::success(
        tenant_id.to_owned(),
        &format!("{}.set", T::ACTION),
        target::<T>(tenant_id, key),
    )
    .after(shown(now));
    record(&txn, store, ctx, event).await?;
    store.commit(txn).await?;
    Ok(now)
}

/// Removes `tenant_id`'s `key` in `txn` (audited there); `NotFound` naming `what` when
/// there is none. The caller commits.
pub(crate) async fn delete<T: SealedTable>(
    store: &Store,
    txn: &DatabaseTransaction,
    ctx: &AuditContext,
    tenant_id: &str,
    key: &str,
    what: impl FnOnce() -> String,
) -> Result<(), StoreError> {
    let gone = T::delete_many()
        .filter(T::tenant_column().eq(tenant_id))
        .filter(T::key_column().eq(key))
        .exec(txn)
        .await?;
    if gone.rows_affected == 0 {
        return Err(StoreError::NotFound(what()));
    }
    let event = AuditEvent::success(
        tenant_id.to_owned(),
        &format!("{}.delete", T::ACTION),
        target::<T>(tenant_id, key),
    );
    record(txn, store, ctx, event).await.map(drop)
}

/// `tenant_id`'s keys and when each was set, by key; never their values.
pub(crate) async fn list<T: SealedTable>(
    db: &impl ConnectionTrait,
    tenant_id: &str,
) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
    Ok(T::find()
        .filter(T::tenant_column().eq(tenant_id))
        .order_by_asc(T::key_column())
        .all(db)
        .await?
        .into_iter()
        .map(|m| {
            let (key, _, at) = T::read(m);
            (key, at)
        })
        .collect())
}

/// The value of `tenant_id`'s `key`, opened (`None`: there is none). `Corrupt`, naming
/// `what`, when it does not open (altered, moved to another row, or sealed under a key
/// the key file no longer holds).
pub(crate) async fn open<T: SealedTable>(
    store: &Store,
    tenant_id: &str,
    key: &str,
    what: impl FnOnce() -> String,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(row) = T::find()
        .filter(T::tenant_column().eq(tenant_id))
        .filter(T::key_column().eq(key))
        .one(&store.db)
        .await?
    else {
        return Ok(None);
    };
    let (_, sealed, _) = T::read(row);
    store
        .secrets
        .open(&binding::<T>(tenant_id, key), &sealed)
        .map(Some)
        .map_err(|e| StoreError::Corrupt(format!("{}: {e}", what())))
}
