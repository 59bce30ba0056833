//! Tenant secrets, sealed ([`crate::SecretKeys`]) and bound to their tenant and name. What
//! anyone is shown, and what the audit log records, is only a secret's name and when it was
//! set; only [`SecretRepo::open_secret`] opens one, for a launch.

use allot_domain::{AuditContext, JobState, SecretValue, TenantSecret};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

use crate::convert::json;
use crate::entities::jobs;
use crate::entities::tenant_secrets::Entity as Secrets;
use crate::{Store, StoreError, TenantRepo, sealed};

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

impl SecretRepo for Store {
    async fn set_secret(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        name: &str,
        value: &[u8],
    ) -> Result<TenantSecret, StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        let shown = |updated_at| TenantSecret {
            name: name.to_owned(),
            updated_at,
        };
        let at = sealed::put::<Secrets>(self, ctx, &tenant.id, name, value, |at| {
            serde_json::json!(shown(at))
        })
        .await?;
        Ok(shown(at))
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
        sealed::delete::<Secrets>(self, &txn, ctx, &tenant.id, name, || {
            format!("secret `{name}` of tenant `{}`", tenant.name)
        })
        .await?;
        self.commit(txn).await
    }

    async fn secrets(&self, tenant: &str) -> Result<Vec<TenantSecret>, StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        Ok(sealed::list::<Secrets>(&self.db, &tenant.id)
            .await?
            .into_iter()
            .map(|(name, updated_at)| TenantSecret { name, updated_at })
            .collect())
    }

    async fn open_secret(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> Result<Option<SecretValue>, StoreError> {
        sealed::open::<Secrets>(self, tenant_id, name, || {
            format!("secret `{name}` of tenant {tenant_id}")
        })
        .await
        .map(|v| v.map(SecretValue))
    }
}
