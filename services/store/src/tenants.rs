//! Tenants and their quotas.

use allot_domain::{
    AuditContext, AuditEvent, JobLimits, NetworkPolicy, Quota, ResourceLimits, Resources,
    SYSTEM_LOG, Tenant, TenantName, TenantPolicy,
};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};

use crate::audit::record;
use crate::convert::{json, parse, to_i64, to_json, to_u32, to_u64};
use crate::entities::{tenants, tenants_version};
use crate::{Store, StoreError, new_id};

pub trait TenantRepo {
    fn create_tenant(
        &self,
        ctx: &AuditContext,
        name: &TenantName,
        parent_id: Option<&str>,
        quota: Quota,
    ) -> impl Future<Output = Result<Tenant, StoreError>> + Send;
    fn tenant_by_name(&self, name: &str)
    -> impl Future<Output = Result<Tenant, StoreError>> + Send;
    /// A tenant by id, a deleted one too: ids are how history (audit logs, jobs, tokens)
    /// names a tenant. Names, `tenant_by_name` and `list_tenants` reach only those that
    /// exist now.
    fn tenant_by_id(&self, id: &str) -> impl Future<Output = Result<Tenant, StoreError>> + Send;
    fn list_tenants(&self) -> impl Future<Output = Result<Vec<Tenant>, StoreError>> + Send;
    /// The tenants' version now: a counter every change to a tenant increments.
    fn tenants_version(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;
    /// The live tenants and the tenants' version they are at least as new as (read first):
    /// what a scheduling pass decides on, and checks its placements against
    /// ([`crate::JobUpdate::tenants_version`]).
    fn versioned_tenants(
        &self,
    ) -> impl Future<Output = Result<(i64, Vec<Tenant>), StoreError>> + Send;
    /// [`TenantRepo::tenant_tree`] with the tenants' version ([`TokenRepo::use_token`]'s
    /// answer carries the current one): read first, so the tree is at least that new.
    ///
    /// [`TokenRepo::use_token`]: crate::TokenRepo::use_token
    fn versioned_tenant_tree(
        &self,
    ) -> impl Future<Output = Result<(i64, Vec<(Tenant, bool)>), StoreError>> + Send;
    /// Every tenant ever made, deleted ones too, and whether each is deleted: the tree
    /// authorization places resources in, so that a deleted tenant's jobs and audit log
    /// stay where platform-wide roles (and its parent's) reach them.
    fn tenant_tree(&self) -> impl Future<Output = Result<Vec<(Tenant, bool)>, StoreError>> + Send;
    fn set_quota(
        &self,
        ctx: &AuditContext,
        name: &str,
        quota: Quota,
    ) -> impl Future<Output = Result<Tenant, StoreError>> + Send;
    /// Deletes tenant `name` (audited): refused (`Conflict`) while it has teams, unfinished
    /// jobs or a volume naming it. Its tokens and role bindings are revoked, its secrets and
    /// pull credentials removed, in the same transaction; its row stays, marked deleted, so
    /// that its audit log, its jobs' history and its host uid range keep naming it.
    fn delete_tenant(
        &self,
        ctx: &AuditContext,
        name: &str,
    ) -> impl Future<Output = Result<TenantDeletion, StoreError>> + Send;
    /// Replaces what the tenant's jobs may run and where (audited).
    fn set_policy(
        &self,
        ctx: &AuditContext,
        name: &str,
        policy: TenantPolicy,
    ) -> impl Future<Output = Result<Tenant, StoreError>> + Send;
    /// Replaces the tenant's own default and most CPU and memory per job (audited).
    fn set_job_limits(
        &self,
        ctx: &AuditContext,
        name: &str,
        limits: JobLimits,
    ) -> impl Future<Output = Result<Tenant, StoreError>> + Send;
}

/// What deleting a tenant did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantDeletion {
    /// The tenant as it was.
    pub tenant: Tenant,
    pub tokens_revoked: u64,
    pub bindings_revoked: u64,
    pub secrets_removed: u64,
    pub credentials_removed: u64,
}

fn opt_u64(field: &str, v: Option<i64>) -> Result<Option<u64>, StoreError> {
    v.map(|x| to_u64(field, x)).transpose()
}

fn opt_i64(field: &str, v: Option<u64>) -> Result<Option<i64>, StoreError> {
    v.map(|x| to_i64(field, x)).transpose()
}

fn to_domain(m: tenants::Model) -> Result<Tenant, StoreError> {
    Ok(Tenant {
        name: TenantName::parse("name", &m.name)
            .map_err(|e| StoreError::Corrupt(format!("tenant {}: {e}", m.id)))?,
        parent_id: m.parent_id,
        quota: Quota {
            guaranteed: Resources {
                gpu_milli: to_u64("guaranteed_gpu_milli", m.guaranteed_gpu_milli)?,
                cpu_milli: to_u64("guaranteed_cpu_milli", m.guaranteed_cpu_milli)?,
                memory_bytes: to_u64("guaranteed_memory_bytes", m.guaranteed_memory_bytes)?,
                gpu_memory_bytes: to_u64(
                    "guaranteed_gpu_memory_bytes",
                    m.guaranteed_gpu_memory_bytes,
                )?,
            },
            limit: ResourceLimits {
                gpu_milli: opt_u64("max_gpu_milli", m.max_gpu_milli)?,
                cpu_milli: opt_u64("max_cpu_milli", m.max_cpu_milli)?,
                memory_bytes: opt_u64("max_memory_bytes", m.max_memory_bytes)?,
                gpu_memory_bytes: opt_u64("max_gpu_memory_bytes", m.max_gpu_memory_bytes)?,
            },
            weight: to_u32("weight", m.weight.into())?,
            min_isolation: parse("min_isolation", &m.min_isolation)?,
            mig_limits: json("mig_limits", &m.mig_limits)?,
            gpu_hour_budget_milli: opt_u64("gpu_hour_budget_milli", m.gpu_hour_budget_milli)?,
        },
        policy: TenantPolicy {
            image_registries: json("image_registries", &m.image_registries)?,
            require_confinement: m.require_confinement,
            network: NetworkPolicy {
                egress: m.egress.as_deref().map(|e| json("egress", e)).transpose()?,
                allow_host_network: m.allow_host_network,
            },
        },
        job_limits: JobLimits {
            default_cpu_milli: opt_u64("job_default_cpu_milli", m.job_default_cpu_milli)?,
            default_memory_bytes: opt_u64("job_default_memory_bytes", m.job_default_memory_bytes)?,
            max_cpu_milli: opt_u64("job_max_cpu_milli", m.job_max_cpu_milli)?,
            max_memory_bytes: opt_u64("job_max_memory_bytes", m.job_max_memory_bytes)?,
            default_gpu_milli: opt_u64("job_default_gpu_milli", m.job_default_gpu_milli)?,
        },
        uid_slot: m
            .uid_slot
            .and_then(|s| u32::try_from(s).ok())
            .ok_or_else(|| StoreError::Corrupt(format!("tenant {}: no uid slot", m.id)))?,
        id: m.id,
        created_at: m.created_at,
    })
}

/// Sets the quota's columns on `row`.
fn set_quota_columns(row: &mut tenants::ActiveModel, q: &Quota) -> Result<(), StoreError> {
    let g = &q.guaranteed;
    let l = &q.limit;
    row.guaranteed_gpu_milli = Set(to_i64("guaranteed.gpu_milli", g.gpu_milli)?);
    row.guaranteed_cpu_milli = Set(to_i64("guaranteed.cpu_milli", g.cpu_milli)?);
    row.guaranteed_memory_bytes = Set(to_i64("guaranteed.memory_bytes", g.memory_bytes)?);
    row.guaranteed_gpu_memory_bytes =
        Set(to_i64("guaranteed.gpu_memory_bytes", g.gpu_memory_bytes)?);
    row.max_gpu_milli = Set(opt_i64("limit.gpu_milli", l.gpu_milli)?);
    row.max_cpu_milli = Set(opt_i64("limit.cpu_milli", l.cpu_milli)?);
    row.max_memory_bytes = Set(opt_i64("limit.memory_bytes", l.memory_bytes)?);
    row.max_gpu_memory_bytes = Set(opt_i64("limit.gpu_memory_bytes", l.gpu_memory_bytes)?);
    row.weight =
        Set(i32::try_from(q.weight)
            .map_err(|_| StoreError::Corrupt("weight exceeds i32".into()))?);
    row.min_isolation = Set(q.min_isolation.as_str().to_owned());
    row.gpu_hour_budget_milli = Set(opt_i64("gpu_hour_budget", q.gpu_hour_budget_milli)?);
    row.mig_limits = Set(serde_json::to_string(&q.mig_limits)
        .map_err(|e| StoreError::Corrupt(format!("mig_limits: {e}")))?);
    Ok(())
}

impl TenantRepo for Store {
    async fn create_tenant(
        &self,
        ctx: &AuditContext,
        name: &TenantName,
        parent_id: Option<&str>,
        quota: Quota,
    ) -> Result<Tenant, StoreError> {
        // Two tenants made at once may pick the same uid slot; the unique index refuses the
        // second, which then takes the next.
        for _ in 0..8 {
            match self.try_create_tenant(ctx, name, parent_id, &quota).await {
                Err(StoreError::Conflict(_)) => {
                    if self.tenant_by_name(name.as_str()).await.is_ok() {
                        return Err(StoreError::Conflict(format!(
                            "tenant `{name}` already exists"
                        )));
                    }
                    let deleted = tenants::Entity::find()
                        .filter(tenants::Column::Name.eq(name.as_str()))
                        .filter(tenants::Column::DeletedAt.is_not_null())
                        .one(&self.db)
                        .await?;
                    if deleted.is_some() {
                        return Err(StoreError::Conflict(format!(
                            "tenant `{name}` was deleted; its name stays with its audit log and \
                             its jobs' history: choose another"
                        )));
                    }
                }
                other => return other,
            }
        }
        Err(StoreError::Conflict(format!(
            "tenant `{name}`: too many tenants created at once; try again"
        )))
    }

    async fn tenant_by_name(&self, name: &str) -> Result<Tenant, StoreError> {
        tenants::Entity::find()
            .filter(tenants::Column::Name.eq(name))
            .filter(tenants::Column::DeletedAt.is_null())
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
            .filter(tenants::Column::DeletedAt.is_null())
            .order_by_asc(tenants::Column::Name)
            .all(&self.db)
            .await?
            .into_iter()
            .map(to_domain)
            .collect()
    }

    async fn tenants_version(&self) -> Result<i64, StoreError> {
        tenants_version(&self.db).await
    }

    async fn versioned_tenants(&self) -> Result<(i64, Vec<Tenant>), StoreError> {
        let version = tenants_version(&self.db).await?;
        Ok((version, self.list_tenants().await?))
    }

    async fn versioned_tenant_tree(&self) -> Result<(i64, Vec<(Tenant, bool)>), StoreError> {
        let version = tenants_version(&self.db).await?;
        Ok((version, self.tenant_tree().await?))
    }

    async fn tenant_tree(&self) -> Result<Vec<(Tenant, bool)>, StoreError> {
        tenants::Entity::find()
            .order_by_asc(tenants::Column::Name)
            .all(&self.db)
            .await?
            .into_iter()
            .map(|m| {
                let deleted = m.deleted_at.is_some();
                to_domain(m).map(|t| (t, deleted))
            })
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
        let mut row = tenants::ActiveModel {
            id: Set(tenant.id),
            ..Default::default()
        };
        set_quota_columns(&mut row, &quota)?;
        self.update_tenant(ctx, row, "tenant.quota.set", before, |t| &t.quota)
            .await
    }

    async fn delete_tenant(
        &self,
        ctx: &AuditContext,
        name: &str,
    ) -> Result<TenantDeletion, StoreError> {
        use crate::entities::{
            api_tokens, jobs, registry_credentials, role_bindings, tenant_secrets, volumes,
        };
        use allot_domain::JobState;
        use sea_orm::PaginatorTrait;
        let txn = self.begin().await?;
        // The row locked first: a job inserted for it meanwhile (its foreign key shares the
        // lock) is counted below, or waits for the deletion to be decided.
        let row = tenants::Entity::find()
            .filter(tenants::Column::Name.eq(name))
            .filter(tenants::Column::DeletedAt.is_null())
            .lock_exclusive()
            .one(&txn)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("tenant `{name}`")))?;
        let tenant = to_domain(row)?;
        let teams: Vec<String> = tenants::Entity::find()
            .filter(tenants::Column::ParentId.eq(tenant.id.as_str()))
            .filter(tenants::Column::DeletedAt.is_null())
            .order_by_asc(tenants::Column::Name)
            .all(&txn)
            .await?
            .into_iter()
            .map(|t| t.name)
            .collect();
        if !teams.is_empty() {
            return Err(StoreError::Conflict(format!(
                "tenant `{name}` has teams ({}): delete them first",
                teams.join(", ")
            )));
        }
        let unfinished = jobs::Entity::find()
            .filter(jobs::Column::TenantId.eq(tenant.id.as_str()))
            .filter(jobs::Column::State.is_in([
                JobState::Pending.as_str(),
                JobState::Scheduled.as_str(),
                JobState::Running.as_str(),
            ]))
            .count(&txn)
            .await?;
        if unfinished > 0 {
            return Err(StoreError::Conflict(format!(
                "tenant `{name}` has {unfinished} unfinished job{}: cancel {} or let {} end first",
                if unfinished == 1 { "" } else { "s" },
                if unfinished == 1 { "it" } else { "them" },
                if unfinished == 1 { "it" } else { "them" },
            )));
        }
        let mut mounting = Vec::new();
        for v in volumes::Entity::find().all(&txn).await? {
            let names: Vec<String> = json("volumes.tenants", &v.tenants)?;
            if names.iter().any(|n| n == name) {
                mounting.push(v.name);
            }
        }
        if !mounting.is_empty() {
            return Err(StoreError::Conflict(format!(
                "volume{} {} name{} tenant `{name}`: take it off {} first",
                if mounting.len() == 1 { "" } else { "s" },
                mounting.join(", "),
                if mounting.len() == 1 { "s" } else { "" },
                if mounting.len() == 1 { "it" } else { "them" },
            )));
        }
        let now = self.clock.now();
        tenants::Entity::update_many()
            .col_expr(
                tenants::Column::DeletedAt,
                sea_orm::sea_query::Expr::value(now),
            )
            .filter(tenants::Column::Id.eq(tenant.id.as_str()))
            .exec(&txn)
            .await?;
        tenants_changed(&txn).await?;
        let tokens_revoked = api_tokens::Entity::update_many()
            .col_expr(
                api_tokens::Column::RevokedAt,
                sea_orm::sea_query::Expr::value(now),
            )
            .filter(api_tokens::Column::TenantId.eq(tenant.id.as_str()))
            .filter(api_tokens::Column::RevokedAt.is_null())
            .exec(&txn)
            .await?
            .rows_affected;
        let bindings_revoked = role_bindings::Entity::update_many()
            .col_expr(
                role_bindings::Column::RevokedAt,
                sea_orm::sea_query::Expr::value(now),
            )
            .filter(role_bindings::Column::TenantId.eq(tenant.id.as_str()))
            .filter(role_bindings::Column::RevokedAt.is_null())
            .exec(&txn)
            .await?
            .rows_affected;
        let secrets_removed = tenant_secrets::Entity::delete_many()
            .filter(tenant_secrets::Column::TenantId.eq(tenant.id.as_str()))
            .exec(&txn)
            .await?
            .rows_affected;
        let credentials_removed = registry_credentials::Entity::delete_many()
            .filter(registry_credentials::Column::TenantId.eq(tenant.id.as_str()))
            .exec(&txn)
            .await?
            .rows_affected;
        let event =
            AuditEvent::success(SYSTEM_LOG, "tenant.delete", format!("tenant/{}", tenant.id))
                .before(serde_json::json!({ "name": tenant.name.as_str(), "quota": &tenant.quota }))
                .after(serde_json::json!({
                    "tokens_revoked": tokens_revoked,
                    "bindings_revoked": bindings_revoked,
                    "secrets_removed": secrets_removed,
                    "credentials_removed": credentials_removed,
                }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(TenantDeletion {
            tenant,
            tokens_revoked,
            bindings_revoked,
            secrets_removed,
            credentials_removed,
        })
    }

    async fn set_policy(
        &self,
        ctx: &AuditContext,
        name: &str,
        policy: TenantPolicy,
    ) -> Result<Tenant, StoreError> {
        let tenant = self.tenant_by_name(name).await?;
        let before = tenant.policy;
        let row = tenants::ActiveModel {
            id: Set(tenant.id),
            image_registries: Set(to_json("image_registries", &policy.image_registries)?),
            require_confinement: Set(policy.require_confinement),
            egress: Set(policy
                .network
                .egress
                .as_ref()
                .map(|e| to_json("egress", e))
                .transpose()?),
            allow_host_network: Set(policy.network.allow_host_network),
            ..Default::default()
        };
        self.update_tenant(ctx, row, "tenant.policy.set", before, |t| &t.policy)
            .await
    }

    async fn set_job_limits(
        &self,
        ctx: &AuditContext,
        name: &str,
        limits: JobLimits,
    ) -> Result<Tenant, StoreError> {
        let tenant = self.tenant_by_name(name).await?;
        let before = tenant.job_limits;
        let row = tenants::ActiveModel {
            id: Set(tenant.id),
            job_default_cpu_milli: Set(opt_i64("default_cpu_milli", limits.default_cpu_milli)?),
            job_default_memory_bytes: Set(opt_i64(
                "default_memory_bytes",
                limits.default_memory_bytes,
            )?),
            job_max_cpu_milli: Set(opt_i64("max_cpu_milli", limits.max_cpu_milli)?),
            job_max_memory_bytes: Set(opt_i64("max_memory_bytes", limits.max_memory_bytes)?),
            job_default_gpu_milli: Set(opt_i64("default_gpu_milli", limits.default_gpu_milli)?),
            ..Default::default()
        };
        self.update_tenant(ctx, row, "tenant.job_limits.set", before, |t| &t.job_limits)
            .await
    }
}

/// The tenants' version now.
pub(crate) async fn tenants_version<C: ConnectionTrait>(db: &C) -> Result<i64, StoreError> {
    tenants_version::Entity::find_by_id(1)
        .one(db)
        .await?
        .map(|v| v.version)
        .ok_or_else(|| StoreError::Corrupt("the tenants' version row is missing".into()))
}

/// Fails with [`StoreError::Stale`] unless the tenants' version is still `read`, holding
/// the version row share-locked for the rest of the caller's transaction on PostgreSQL (a
/// change to any tenant waits until it ends). SQLite has one writer: nothing changes
/// between this read and the commit.
pub(crate) async fn check_tenants_version<C: ConnectionTrait>(
    db: &C,
    read: i64,
) -> Result<(), StoreError> {
    use sea_orm::QuerySelect;
    let mut q = tenants_version::Entity::find_by_id(1);
    if db.get_database_backend() == sea_orm::DatabaseBackend::Postgres {
        q = q.lock_shared();
    }
    let now = q
        .one(db)
        .await?
        .map(|v| v.version)
        .ok_or_else(|| StoreError::Corrupt("the tenants' version row is missing".into()))?;
    if now == read {
        Ok(())
    } else {
        Err(StoreError::Stale(format!(
            "the tenants changed since the decision read them (version {read}, now {now})"
        )))
    }
}

/// Counts a change to `tenants`, in the change's transaction (every write to the table
/// calls this): what a replica's remembered tenant tree is checked against.
async fn tenants_changed<C: ConnectionTrait>(db: &C) -> Result<(), StoreError> {
    tenants_version::Entity::update_many()
        .col_expr(
            tenants_version::Column::Version,
            Expr::col(tenants_version::Column::Version).add(1),
        )
        .filter(tenants_version::Column::Id.eq(1))
        .exec(db)
        .await?;
    Ok(())
}

impl Store {
    /// Writes `row` (a change of one tenant's columns) and its audit entry `action` in its
    /// tenant's log, in one transaction: the entry records `before` and what `after` reads
    /// of the tenant as written.
    async fn update_tenant<B, A>(
        &self,
        ctx: &AuditContext,
        row: tenants::ActiveModel,
        action: &str,
        before: B,
        after: impl FnOnce(&Tenant) -> &A,
    ) -> Result<Tenant, StoreError>
    where
        B: serde::Serialize,
        A: serde::Serialize + ?Sized,
    {
        let txn = self.begin().await?;
        let updated = to_domain(tenants::Entity::update(row).exec(&txn).await?)?;
        tenants_changed(&txn).await?;
        let event =
            AuditEvent::success(updated.id.clone(), action, format!("tenant/{}", updated.id))
                .before(before)
                .after(after(&updated));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(updated)
    }

    async fn try_create_tenant(
        &self,
        ctx: &AuditContext,
        name: &TenantName,
        parent_id: Option<&str>,
        quota: &Quota,
    ) -> Result<Tenant, StoreError> {
        let mut row = tenants::ActiveModel {
            id: Set(new_id(self.clock.as_ref())),
            name: Set(name.as_str().to_owned()),
            parent_id: Set(parent_id.map(str::to_owned)),
            created_at: Set(self.clock.now()),
            image_registries: Set("[]".to_owned()),
            require_confinement: Set(false),
            egress: Set(None),
            allow_host_network: Set(false),
            ..Default::default()
        };
        set_quota_columns(&mut row, quota)?;
        let txn = self.begin().await?;
        let highest: Option<Option<i32>> = tenants::Entity::find()
            .select_only()
            .column_as(tenants::Column::UidSlot.max(), "highest")
            .into_tuple()
            .one(&txn)
            .await?;
        let slot = highest.flatten().map_or(0, |h| h + 1);
        if u32::try_from(slot).map_or(true, |s| s >= Tenant::UID_SLOTS) {
            return Err(StoreError::Refused(
                "no host uid range is left for another tenant".to_owned(),
            ));
        }
        row.uid_slot = Set(Some(slot));
        if let Some(parent) = parent_id
            && tenants::Entity::find_by_id(parent.to_owned())
                .one(&txn)
                .await?
                .is_none()
        {
            return Err(StoreError::NotFound(format!("parent tenant {parent}")));
        }
        let tenant = match tenants::Entity::insert(row)
            .exec_with_returning(&txn)
            .await
            .map_err(StoreError::from)
        {
            Ok(m) => to_domain(m)?,
            Err(e) => return Err(e),
        };
        tenants_changed(&txn).await?;
        let event =
            AuditEvent::success(SYSTEM_LOG, "tenant.create", format!("tenant/{}", tenant.id))
                .after(&tenant);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(tenant)
    }
}
