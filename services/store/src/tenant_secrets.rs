//! Tenant secrets, sealed ([`crate::SecretKeys`]) and bound to their tenant and name. What
//! anyone is shown, and what the audit log records, is only a secret's name and when it was
//! set; only [`SecretRepo::open_secret`] opens one, for a launch.

use allot_domain::{AuditContext, AuditEvent, JobState, SecretValue, TenantSecret};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::TenantRepo;
use crate::audit::record;
use crate::convert::json;
use crate::entities::{jobs, tenant_secrets as secrets};
use crate::{Store, StoreError};

pub trait SecretRepo {
    /// Sets (or replaces) `tenant`'s secret `name` (audited, without its value).
    fn set_secret(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        name: &str,
        value: &[u8],
    ) -> impl Future<Output = Result<TenantSecret, StoreError>> + Send;
    /// Removes it (audited); `NotFound` when there is none, `Conflict` while an unfinished
    /// job uses it.
    fn delete_secret(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// `tenant`'s secrets, by name.
    fn secrets(
        &self,
        tenant: &str,
    ) -> impl Future<Output = Result<Vec<TenantSecret>, StoreError>> + Send;
    /// The value itself, opened: for launching a job of tenant `tenant_id` only.
    fn open_secret(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<SecretValue>, StoreError>> + Send;
}

/// What a sealed value is bound to: its row.
fn context(tenant_id: &str, name: &str) -> Vec<u8> {
    format!("tenant_secrets\0{tenant_id}\0{name}").into_bytes()
}

impl SecretRepo for Store {
    async fn set_secret(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        name: &str,
        value: &[u8],
    ) -> Result<TenantSecret, StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        let sealed = self
            .secrets
            .seal(&context(&tenant.id, name), value)
            .map_err(|e| StoreError::Refused(e.to_string()))?;
        let now = self.clock.now();
        let txn = self.begin().await?;
        secrets::Entity::insert(secrets::ActiveModel {
            tenant_id: Set(tenant.id.clone()),
            name: Set(name.to_owned()),
            sealed: Set(sealed),
            updated_at: Set(now),
        })
        .on_conflict(
            OnConflict::columns([secrets::Column::TenantId, secrets::Column::Name])
                .update_columns([secrets::Column::Sealed, secrets::Column::UpdatedAt])
                .to_owned(),
        )
        .exec(&txn)
        .await?;
        let shown = TenantSecret {
            name: name.to_owned(),
            updated_at: now,
        };
        let event = AuditEvent::success(
            tenant.id.clone(),
            "tenant.secret.set",
            format!("tenant/{}/secret/{name}", tenant.id),
        )
        .after(&shown);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(shown)
    }

    async fn delete_secret(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        name: &str,
    ) -> Result<(), StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        let txn = self.begin().await?;
        // Names are `[a-z0-9-]`: nothing in them is special to LIKE.
        let users: Vec<(String, String)> = jobs::Entity::find()
            .select_only()
            .column(jobs::Column::Id)
            .column(jobs::Column::Secrets)
            .filter(jobs::Column::TenantId.eq(tenant.id.clone()))
            .filter(jobs::Column::State.is_in(
                [JobState::Pending, JobState::Scheduled, JobState::Running].map(JobState::as_str),
            ))
            .filter(jobs::Column::Secrets.like(format!("%\"secret\":\"{name}\"%")))
            .into_tuple()
            .all(&txn)
            .await?;
        for (job, uses) in users {
            let uses: Vec<allot_domain::SecretUse> = json("secrets", &uses)?;
            if uses.iter().any(|u| u.secret == name) {
                return Err(StoreError::Conflict(format!(
                    "unfinished job {job} uses secret `{name}`"
                )));
            }
        }
        let gone = secrets::Entity::delete_by_id((tenant.id.clone(), name.to_owned()))
            .exec(&txn)
            .await?;
        if gone.rows_affected == 0 {
            return Err(StoreError::NotFound(format!(
                "secret `{name}` of tenant `{}`",
                tenant.name
            )));
        }
        let event = AuditEvent::success(
            tenant.id.clone(),
            "tenant.secret.delete",
            format!("tenant/{}/secret/{name}", tenant.id),
        );
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(())
    }

    async fn secrets(&self, tenant: &str) -> Result<Vec<TenantSecret>, StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        Ok(secrets::Entity::find()
            .filter(secrets::Column::TenantId.eq(tenant.id))
            .order_by_asc(secrets::Column::Name)
            .all(&self.db)
            .await?
            .into_iter()
            .map(|m| TenantSecret {
                name: m.name,
                updated_at: m.updated_at,
            })
            .collect())
    }

    async fn open_secret(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> Result<Option<SecretValue>, StoreError> {
        let Some(row) = secrets::Entity::find_by_id((tenant_id.to_owned(), name.to_owned()))
            .one(&self.db)
            .await?
        else {
            return Ok(None);
        };
        self.secrets
            .open(&context(tenant_id, name), &row.sealed)
            .map(|v| Some(SecretValue(v)))
            .map_err(|e| StoreError::Corrupt(format!("secret `{name}` of tenant {tenant_id}: {e}")))
    }
}
