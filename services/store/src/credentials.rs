//! Tenants' pull credentials for private registries. The user name and password are sealed
//! together ([`crate::SecretKeys`]) and bound to their tenant and registry; what anyone is
//! shown (and what the audit log records) is only which registry has credentials, and when
//! they were set. Only [`CredentialRepo::pull_secret`] opens them, for a launch.

use allot_domain::{AuditContext, PullSecret, RegistryCredential};

use crate::entities::registry_credentials::Entity as Creds;
use crate::{Store, StoreError, TenantRepo, sealed};

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
        let shown = |updated_at| RegistryCredential {
            registry: registry.to_owned(),
            updated_at,
        };
        let at = sealed::put::<Creds>(self, ctx, &tenant.id, registry, &plain, |at| {
            serde_json::json!(shown(at))
        })
        .await?;
        Ok(shown(at))
    }

    async fn delete_registry_credential(
        &self,
        ctx: &AuditContext,
        tenant: &str,
        registry: &str,
    ) -> Result<(), StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        let txn = self.begin().await?;
        sealed::delete::<Creds>(self, &txn, ctx, &tenant.id, registry, || {
            format!(
                "credentials of tenant `{}` for registry `{registry}`",
                tenant.name
            )
        })
        .await?;
        self.commit(txn).await
    }

    async fn registry_credentials(
        &self,
        tenant: &str,
    ) -> Result<Vec<RegistryCredential>, StoreError> {
        let tenant = self.tenant_by_name(tenant).await?;
        Ok(sealed::list::<Creds>(&self.db, &tenant.id)
            .await?
            .into_iter()
            .map(|(registry, updated_at)| RegistryCredential {
                registry,
                updated_at,
            })
            .collect())
    }

    async fn pull_secret(
        &self,
        tenant_id: &str,
        registry: &str,
    ) -> Result<Option<PullSecret>, StoreError> {
        let Some(plain) = sealed::open::<Creds>(self, tenant_id, registry, || {
            format!("credentials of tenant {tenant_id} for registry `{registry}`")
        })
        .await?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("pull secret: {e}")))
    }
}
