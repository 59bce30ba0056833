//! Tenants' pull credentials for private registries. The user name and password are sealed
//! together ([`crate::SecretKeys`]) and bound to their tenant and registry; what anyone is
//! shown (and what the audit log records) is only which registry has credentials, and when
//! they were set. Only [`CredentialRepo::pull_secret`] opens them, for a launch.

use allot_domain::{AuditContext, AuditEvent, PullSecret, RegistryCredential};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder};

use crate::TenantRepo;
use crate::audit::record;
use crate::entities::registry_credentials as creds;
use crate::{Store, StoreError};

pub trait CredentialRepo {
    /// Sets (or replaces) `tenant`'s credentials for `registry` (audited, without them).
    fn set_registry_credential(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        registry: &str,
        secret: &PullSecret,
    ) -> impl Future<Output = Result<RegistryCredential, StoreError>> + Send;
    /// Removes them (audited); `NotFound` when there are none.
    fn delete_registry_credential(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        registry: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The registries `tenant` has credentials for.
    fn registry_credentials(
        &self,
        tenant: &str,
    ) -> impl Future<Output = Result<Vec<RegistryCredential>, StoreError>> + Send;
    /// The credentials themselves, opened: for launching a job of tenant `tenant_id` only.
    fn pull_secret(
        &self,
        tenant_id: &str,
        registry: &str,
    ) -> impl Future<Output = Result<Option<PullSecret>, StoreError>> + Send;
}

/// What a sealed value is bound to: its row.
fn context(tenant_id: &str, registry: &str) -> Vec<u8> {
    format!("registry_credentials\0{tenant_id}\0{registry}").into_bytes()
}

fn view(m: creds::Model) -> RegistryCredential {
    RegistryCredential {
        registry: m.registry,
        updated_at: m.updated_at,
    }
}

impl CredentialRepo for Store {
    async fn set_registry_credential(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        registry: &str,
        secret: &PullSecret,
    ) -> Result<RegistryCredential, StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        let plain = serde_json::to_vec(secret)
            .map_err(|e| StoreError::Corrupt(format!("pull secret: {e}")))?;
        let sealed = self
            .secrets
            .seal(&context(&tenant.id, registry), &plain)
            .map_err(|e| StoreError::Refused(e.to_string()))?;
        let now = self.clock.now();
        let row = creds::ActiveModel {
            tenant_id: Set(tenant.id.clone()),
            registry: Set(registry.to_owned()),
            sealed: Set(sealed),
            updated_at: Set(now),
        };
        let txn = self.begin().await?;
        creds::Entity::insert(row)
            .on_conflict(
                OnConflict::columns([creds::Column::TenantId, creds::Column::Registry])
                    .update_columns([creds::Column::Sealed, creds::Column::UpdatedAt])
                    .to_owned(),
            )
            .exec(&txn)
            .await?;
        let shown = RegistryCredential {
            registry: registry.to_owned(),
            updated_at: now,
        };
        let event = AuditEvent::success(
            tenant.id.clone(),
            "tenant.registry_credential.set",
            format!("tenant/{}/registry/{registry}", tenant.id),
        )
        .after(&shown);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(shown)
    }

    async fn delete_registry_credential(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        registry: &str,
    ) -> Result<(), StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        let txn = self.begin().await?;
        let gone = creds::Entity::delete_by_id((tenant.id.clone(), registry.to_owned()))
            .exec(&txn)
            .await?;
        if gone.rows_affected == 0 {
            return Err(StoreError::NotFound(format!(
                "credentials of tenant `{}` for registry `{registry}`",
                tenant.name
            )));
        }
        let event = AuditEvent::success(
            tenant.id.clone(),
            "tenant.registry_credential.delete",
            format!("tenant/{}/registry/{registry}", tenant.id),
        );
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(())
    }

    async fn registry_credentials(
        &self,
        tenant: &str,
    ) -> Result<Vec<RegistryCredential>, StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        Ok(creds::Entity::find()
            .filter(creds::Column::TenantId.eq(tenant.id))
            .order_by_asc(creds::Column::Registry)
            .all(&self.db)
            .await?
            .into_iter()
            .map(view)
            .collect())
    }

    async fn pull_secret(
        &self,
        tenant_id: &str,
        registry: &str,
    ) -> Result<Option<PullSecret>, StoreError> {
        let Some(row) = creds::Entity::find_by_id((tenant_id.to_owned(), registry.to_owned()))
            .one(&self.db)
            .await?
        else {
            return Ok(None);
        };
        let plain = self
            .secrets
            .open(&context(tenant_id, registry), &row.sealed)
            .map_err(|e| {
                StoreError::Corrupt(format!(
                    "credentials of tenant {tenant_id} for registry `{registry}`: {e}"
                ))
            })?;
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("pull secret: {e}")))
    }
}
