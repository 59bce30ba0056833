//! Tenants and their quotas.

use allot_domain::{AuditContext, AuditEvent, Quota, SYSTEM_LOG, Tenant, TenantName};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, TransactionTrait,
};

use crate::audit::record;
use crate::convert::{to_i64, to_u32, to_u64};
use crate::entities::tenants;
use crate::{Store, StoreError, new_id};

pub trait TenantRepo {
    fn create_tenant(
        &self,
        ctx: &AuditContext,
        name: &TenantName,
        quota: Quota,
    ) -> impl Future<Output = Result<Tenant, StoreError>> + Send;
    fn tenant_by_name(&self, name: &str)
    -> impl Future<Output = Result<Tenant, StoreError>> + Send;
    fn tenant_by_id(&self, id: &str) -> impl Future<Output = Result<Tenant, StoreError>> + Send;
    fn list_tenants(&self) -> impl Future<Output = Result<Vec<Tenant>, StoreError>> + Send;
    fn set_quota(
        &self,
        ctx: &AuditContext,
        name: &str,
        quota: Quota,
    ) -> impl Future<Output = Result<Tenant, StoreError>> + Send;
}

fn to_domain(m: tenants::Model) -> Result<Tenant, StoreError> {
    Ok(Tenant {
        name: TenantName::parse("name", &m.name)
            .map_err(|e| StoreError::Corrupt(format!("tenant {}: {e}", m.id)))?,
        quota: Quota {
            max_gpus: m
                .max_gpus
                .map(|g| to_u32("max_gpus", g.into()))
                .transpose()?,
            max_gpu_memory_bytes: m
                .max_gpu_memory_bytes
                .map(|b| to_u64("max_gpu_memory_bytes", b))
                .transpose()?,
        },
        id: m.id,
        created_at: m.created_at,
    })
}

fn quota_columns(quota: Quota) -> Result<(Option<i32>, Option<i64>), StoreError> {
    let gpus = quota
        .max_gpus
        .map(|g| i32::try_from(g).map_err(|_| StoreError::Corrupt("max_gpus exceeds i32".into())))
        .transpose()?;
    let mem = quota
        .max_gpu_memory_bytes
        .map(|b| to_i64("max_gpu_memory_bytes", b))
        .transpose()?;
    Ok((gpus, mem))
}

impl TenantRepo for Store {
    async fn create_tenant(
        &self,
        ctx: &AuditContext,
        name: &TenantName,
        quota: Quota,
    ) -> Result<Tenant, StoreError> {
        let (max_gpus, max_mem) = quota_columns(quota)?;
        let row = tenants::ActiveModel {
            id: Set(new_id(self.clock.as_ref())),
            name: Set(name.as_str().to_owned()),
            max_gpus: Set(max_gpus),
            max_gpu_memory_bytes: Set(max_mem),
            created_at: Set(self.clock.now()),
        };
        let txn = self.db.begin().await?;
        let tenant = match tenants::Entity::insert(row)
            .exec_with_returning(&txn)
            .await
            .map_err(StoreError::from)
        {
            Ok(m) => to_domain(m)?,
            Err(StoreError::Conflict(_)) => {
                return Err(StoreError::Conflict(format!(
                    "tenant `{name}` already exists"
                )));
            }
            Err(e) => return Err(e),
        };
        let event =
            AuditEvent::success(SYSTEM_LOG, "tenant.create", format!("tenant/{}", tenant.id))
                .after(&tenant);
        record(&txn, self, ctx, event).await?;
        txn.commit().await?;
        Ok(tenant)
    }

    async fn tenant_by_name(&self, name: &str) -> Result<Tenant, StoreError> {
        tenants::Entity::find()
            .filter(tenants::Column::Name.eq(name))
            .one(&self.db)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("tenant `{name}`")))
            .and_then(to_domain)
    }

    async fn tenant_by_id(&self, id: &str) -> Result<Tenant, StoreError> {
        tenants::Entity::find_by_id(id.to_owned())
            .one(&self.db)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("tenant {id}")))
            .and_then(to_domain)
    }

    async fn list_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        tenants::Entity::find()
            .order_by_asc(tenants::Column::Name)
            .all(&self.db)
            .await?
            .into_iter()
            .map(to_domain)
            .collect()
    }

    async fn set_quota(
        &self,
        ctx: &AuditContext,
        name: &str,
        quota: Quota,
    ) -> Result<Tenant, StoreError> {
        let tenant = self.tenant_by_name(name).await?;
        let before = tenant.quota;
        let (max_gpus, max_mem) = quota_columns(quota)?;
        let row = tenants::ActiveModel {
            id: Set(tenant.id),
            max_gpus: Set(max_gpus),
            max_gpu_memory_bytes: Set(max_mem),
            ..Default::default()
        };
        let txn = self.db.begin().await?;
        let updated = to_domain(tenants::Entity::update(row).exec(&txn).await?)?;
        let event = AuditEvent::success(
            updated.id.clone(),
            "tenant.quota.set",
            format!("tenant/{}", updated.id),
        )
        .before(before)
        .after(updated.quota);
        record(&txn, self, ctx, event).await?;
        txn.commit().await?;
        Ok(updated)
    }
}
