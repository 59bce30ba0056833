use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_domain::{PullSecret, Quota, Tenant, TenantName, TenantPolicy, ValidationError};
use allot_store::{CredentialRepo, NodeRepo, SecretRepo, TenantRepo, TenantScope};

use crate::auth::Principal;
use crate::extract::Json;
use crate::problem::Problem;
use crate::views::{
    CreateTenant, DeletedTenant, JobLimitsBody, JobLimitsView, PolicyBody, QuotaBody, QuotaPatch,
    RegistryCredentialBody, RegistryCredentialView, SetSecretBody, TenantSecretView, TenantView,
};
use crate::{ApiError, AppState, json};

/// Create a tenant (platform admins).
#[utoipa::path(post, path = "/api/v1/tenants", tag = "tenants", request_body = CreateTenant,
    security(("bearer" = [])),
    responses((status = 201, body = TenantView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)))]
pub async fn create(
    state: web::Data<AppState>,
    who: Principal,
    Json(body): Json<CreateTenant>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::TenantCreate, Resource::Platform, "the platform")?;
    let name = TenantName::parse("name", &body.name)?;
    if name.as_str() == allot_domain::SYSTEM_LOG {
        // The platform's own audit log is named so; a tenant's log is its id, but its name
        // in searches and exports must not be mistaken for the platform's.
        return Err(ValidationError::single(
            "name",
            format!(
                "`{}` is reserved for the platform's own log",
                allot_domain::SYSTEM_LOG
            ),
        )
        .into());
    }
    let quota = Quota::from(body.quota);
    quota.validate("quota.")?;
    let mut all = state.store.list_tenants().await?;
    let parent_id = match &body.parent {
        None => None,
        Some(p) => Some(
            all.iter()
                .find(|t| t.name.as_str() == p)
                .map(|t| t.id.clone())
                .ok_or_else(|| {
                    ValidationError::single("parent", format!("no tenant named `{p}`"))
                })?,
        ),
    };
    let mut trial = all.clone();
    trial.push(Tenant {
        id: "(new)".to_owned(),
        name: name.clone(),
        parent_id: parent_id.clone(),
        quota: quota.clone(),
        policy: Default::default(),
        job_limits: Default::default(),
        uid_slot: 0,
        created_at: state.store.clock().now(),
    });
    check_tree(&trial)?;
    let tenant = state
        .store
        .create_tenant(&who.audit(), &name, parent_id.as_deref(), quota)
        .await?;
    state.events.job_submitted();
    all.push(tenant.clone());
    Ok(json(
        StatusCode::CREATED,
        &view(&state, tenant, &all).await?,
    ))
}

/// `tenant` as the API shows it, with what its jobs hold and how many wait.
async fn view(state: &AppState, tenant: Tenant, all: &[Tenant]) -> Result<TenantView, ApiError> {
    let totals = totals(state, all).await?;
    Ok(TenantView::new(tenant, all, &totals))
}

/// Every tenant's figures, its teams' included, from the jobs not yet ended.
pub async fn totals(
    state: &AppState,
    all: &[Tenant],
) -> Result<std::collections::HashMap<String, allot_domain::TenantTotals>, ApiError> {
    let (mut jobs, pending) = super::jobs::unfinished(state, TenantScope::All).await?;
    jobs.extend(pending);
    let nodes = state.store.list_nodes().await?;
    Ok(allot_domain::holding::tenant_totals(all, &jobs, &nodes))
}

/// Refuses quotas that do not nest: children guaranteed more than their parent, or a
/// guarantee above a limit. The scheduler decides with this same tree.
fn check_tree(tenants: &[Tenant]) -> Result<(), ValidationError> {
    allot_scheduler::live::quota_tree(tenants)
        .map(|_| ())
        .map_err(|e| ValidationError::single("quota", e.to_string()))
}

/// List tenants: all of them for admins, the caller's own otherwise.
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenants", security(("bearer" = [])),
    responses((status = 200, body = Vec<TenantView>), (status = 401, body = Problem)))]
pub async fn list(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    let visible = who.listable(Action::TenantRead, "tenants")?;
    let all = state.store.list_tenants().await?;
    let totals = totals(&state, &all).await?;
    let tenants: Vec<TenantView> = all
        .iter()
        .filter(|t| visible.contains(&t.id))
        .map(|t| TenantView::new(t.clone(), &all, &totals))
        .collect();
    Ok(json(StatusCode::OK, &tenants))
}

async fn visible(
    state: &AppState,
    who: &Principal,
    name: &str,
    action: Action,
) -> Result<allot_domain::Tenant, ApiError> {
    let what = format!("tenant `{name}`");
    let tenant = state.store.tenant_by_name(name).await.map_err(|e| {
        ApiError::unless_not_found(e, || ApiError::NotFound(format!("{what} does not exist")))
    })?;
    who.authorize(action, Resource::Tenant(&tenant.id), &what)?;
    Ok(tenant)
}

/// Get a tenant.
#[utoipa::path(get, path = "/api/v1/tenants/{name}", tag = "tenants", security(("bearer" = [])),
    params(("name" = String, Path)),
    responses((status = 200, body = TenantView), (status = 404, body = Problem)))]
pub async fn get(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = visible(&state, &who, &name, Action::TenantRead).await?;
    let all = state.store.list_tenants().await?;
    Ok(json(StatusCode::OK, &view(&state, tenant, &all).await?))
}

/// Delete a tenant (platform admins): refused (409) while it has teams, unfinished jobs
/// or a volume naming it. Its tokens and role bindings are revoked and its secrets and pull
/// credentials removed at once; its audit log and jobs' history stay, under its name.
#[utoipa::path(delete, path = "/api/v1/tenants/{name}", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = DeletedTenant), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn delete(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = visible(&state, &who, &name, Action::TenantDelete).await?;
    let done = state
        .store
        .delete_tenant(&who.audit(), tenant.name.as_str())
        .await?;
    // The quota tree changed: decide again.
    state.events.job_submitted();
    Ok(json(
        StatusCode::OK,
        &DeletedTenant {
            id: done.tenant.id,
            name: done.tenant.name.to_string(),
            tokens_revoked: done.tokens_revoked,
            bindings_revoked: done.bindings_revoked,
            secrets_removed: done.secrets_removed,
            credentials_removed: done.credentials_removed,
        },
    ))
}

/// Get a tenant's quota.
#[utoipa::path(get, path = "/api/v1/tenants/{name}/quota", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = QuotaBody), (status = 404, body = Problem)))]
pub async fn get_quota(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = visible(&state, &who, &name, Action::QuotaRead).await?;
    Ok(json(StatusCode::OK, &QuotaBody::from(tenant.quota)))
}

/// Replace a tenant's quota (platform admins).
#[utoipa::path(put, path = "/api/v1/tenants/{name}/quota", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)), request_body = QuotaBody,
    responses((status = 200, body = TenantView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn set_quota(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
    Json(body): Json<QuotaBody>,
) -> Result<HttpResponse, ApiError> {
    visible(&state, &who, &name, Action::QuotaWrite).await?;
    apply_quota(&state, &who, &name, body).await
}

/// Change parts of a tenant's quota (platform admins, as for setting it): the body is a
/// JSON merge patch (RFC 7396) of the quota as `GET …/quota` shows it. Only what it names
/// changes: `{"limit": {"gpu_milli": 4000}}` sets the GPU limit and keeps the guarantee,
/// weight, isolation, MIG limits and budget; `null` clears (`{"limit": {"gpu_milli": null}}`
/// removes the limit, `{"mig_limits": {"1g.18gb": null}}` one profile's limit,
/// `{"gpu_hour_budget": null}` the budget).
#[utoipa::path(patch, path = "/api/v1/tenants/{name}/quota", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)), request_body = QuotaPatch,
    responses((status = 200, body = TenantView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn patch_quota(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
    Json(patch): Json<serde_json::Value>,
) -> Result<HttpResponse, ApiError> {
    let tenant = visible(&state, &who, &name, Action::QuotaWrite).await?;
    let body = merge_patched::<_, QuotaPatch>(QuotaBody::from(tenant.quota), patch, "quota")?;
    apply_quota(&state, &who, &name, body).await
}

/// `current` with the JSON merge patch (RFC 7396) `patch` applied: the patch is checked
/// as `P` (what the document says a patch of `what` is, field by field) before it is
/// applied, and the result as a whole body after.
fn merge_patched<T, P>(current: T, patch: serde_json::Value, what: &str) -> Result<T, ApiError>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    P: serde::de::DeserializeOwned,
{
    if !patch.is_object() {
        return Err(ApiError::malformed(
            "body",
            format!("a merge patch of the {what} is a JSON object"),
        ));
    }
    let _: P = crate::extract::from_value(patch.clone())?;
    let mut whole = serde_json::to_value(current)
        .map_err(|e| ApiError::Internal(format!("the {what} as JSON: {e}")))?;
    crate::extract::merge_patch(&mut whole, &patch);
    crate::extract::from_value(whole)
}

/// Validates `body` as `name`'s whole quota, in its tree, and stores it.
async fn apply_quota(
    state: &AppState,
    who: &Principal,
    name: &str,
    body: QuotaBody,
) -> Result<HttpResponse, ApiError> {
    let quota = Quota::from(body);
    quota.validate("")?;
    let mut all = state.store.list_tenants().await?;
    if let Some(t) = all.iter_mut().find(|t| t.name.as_str() == name) {
        t.quota = quota.clone();
        check_tree(&all)?;
    }
    let tenant = state.store.set_quota(&who.audit(), name, quota).await?;
    state.events.job_submitted();
    Ok(json(StatusCode::OK, &view(state, tenant, &all).await?))
}

/// Get a tenant's policy: the image registries its jobs may use, whether they must run
/// confined, where their connections may go and whether they may share the node's network.
#[utoipa::path(get, path = "/api/v1/tenants/{name}/policy", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = PolicyBody), (status = 404, body = Problem)))]
pub async fn get_policy(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = visible(&state, &who, &name, Action::QuotaRead).await?;
    Ok(json(StatusCode::OK, &PolicyBody::from(tenant.policy)))
}

/// Replace a tenant's policy (platform admins, as for its quota). Jobs submitted from then
/// on are held to it: an image outside `image_registries` is refused (422 naming `image`),
/// with `require_confinement` the tenant's jobs are placed only on nodes that run jobs in
/// containers, and `network: host` without `allow_host_network` is refused (422 naming
/// `network`). Each launch carries the policy in force then: a job's egress follows its
/// tenant's `egress` as it is when the job starts.
#[utoipa::path(put, path = "/api/v1/tenants/{name}/policy", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)), request_body = PolicyBody,
    responses((status = 200, body = PolicyBody), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn set_policy(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
    Json(body): Json<PolicyBody>,
) -> Result<HttpResponse, ApiError> {
    visible(&state, &who, &name, Action::QuotaWrite).await?;
    let policy = TenantPolicy::try_from(body)?;
    policy.validate()?;
    let tenant = state.store.set_policy(&who.audit(), &name, policy).await?;
    state.events.job_submitted();
    Ok(json(StatusCode::OK, &PolicyBody::from(tenant.policy)))
}

/// Get a tenant's job limits: the CPU and memory its jobs get when they ask for none and
/// the most one may ask for, as set on it and as they apply (inherited from its parents,
/// else the platform's).
#[utoipa::path(get, path = "/api/v1/tenants/{name}/job-limits", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = JobLimitsView), (status = 404, body = Problem)))]
pub async fn get_job_limits(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = visible(&state, &who, &name, Action::QuotaRead).await?;
    let all = state.store.list_tenants().await?;
    Ok(json(StatusCode::OK, &JobLimitsView::new(&tenant, &all)))
}

/// Replace a tenant's own job limits (platform admins, as for its quota); an absent field
/// takes the parent's. Jobs submitted from then on get its defaults when they ask for no
/// CPU or memory, and asking for more than its maximum is refused (422 naming `cpu_milli`
/// or `memory_bytes`). Jobs already submitted keep what they got.
#[utoipa::path(put, path = "/api/v1/tenants/{name}/job-limits", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)), request_body = JobLimitsBody,
    responses((status = 200, body = JobLimitsView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn set_job_limits(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
    Json(body): Json<JobLimitsBody>,
) -> Result<HttpResponse, ApiError> {
    visible(&state, &who, &name, Action::QuotaWrite).await?;
    apply_job_limits(&state, &who, &name, body).await
}

/// Change parts of a tenant's own job limits (platform admins): a JSON merge patch (RFC
/// 7396) of `own` as `GET …/job-limits` shows it; `null` clears a setting (the parent's
/// then applies).
#[utoipa::path(patch, path = "/api/v1/tenants/{name}/job-limits", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)), request_body = JobLimitsBody,
    responses((status = 200, body = JobLimitsView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn patch_job_limits(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
    Json(patch): Json<serde_json::Value>,
) -> Result<HttpResponse, ApiError> {
    let tenant = visible(&state, &who, &name, Action::QuotaWrite).await?;
    let body = merge_patched::<_, JobLimitsBody>(
        JobLimitsBody::from(tenant.job_limits),
        patch,
        "job limits",
    )?;
    apply_job_limits(&state, &who, &name, body).await
}

/// Validates `body` as `name`'s own job limits and stores them.
async fn apply_job_limits(
    state: &AppState,
    who: &Principal,
    name: &str,
    body: JobLimitsBody,
) -> Result<HttpResponse, ApiError> {
    let limits = allot_domain::JobLimits::from(body);
    limits.validate("")?;
    let tenant = state
        .store
        .set_job_limits(&who.audit(), name, limits)
        .await?;
    let all = state.store.list_tenants().await?;
    Ok(json(StatusCode::OK, &JobLimitsView::new(&tenant, &all)))
}

/// The registries a tenant has pull credentials for (its admins). The credentials
/// themselves are never returned.
#[utoipa::path(get, path = "/api/v1/tenants/{name}/registry-credentials", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = [RegistryCredentialView]), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn list_credentials(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    visible(&state, &who, &name, Action::CredentialRead).await?;
    let list: Vec<RegistryCredentialView> = state
        .store
        .registry_credentials(&name)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(json(StatusCode::OK, &list))
}

/// Set a tenant's pull credentials for one registry (its admins): nodes pull its jobs'
/// images from that registry with them. They are stored sealed, and no response, audit
/// entry or log shows them.
#[utoipa::path(put, path = "/api/v1/tenants/{name}/registry-credentials/{registry}",
    tag = "tenants", security(("bearer" = [])),
    params(("name" = String, Path), ("registry" = String, Path, description = "HOST[:PORT]")),
    request_body = RegistryCredentialBody,
    responses((status = 200, body = RegistryCredentialView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn set_credential(
    state: web::Data<AppState>,
    who: Principal,
    path: web::Path<(String, String)>,
    Json(body): Json<RegistryCredentialBody>,
) -> Result<HttpResponse, ApiError> {
    let (name, registry) = path.into_inner();
    visible(&state, &who, &name, Action::CredentialWrite).await?;
    allot_domain::image::check_registry("registry", &registry)?;
    let secret = PullSecret {
        username: body.username,
        password: body.password,
    };
    secret.validate()?;
    let shown = state
        .store
        .set_registry_credential(&who.audit(), &name, &registry, &secret)
        .await?;
    Ok(json(StatusCode::OK, &RegistryCredentialView::from(shown)))
}

/// Remove a tenant's pull credentials for a registry (its admins).
#[utoipa::path(delete, path = "/api/v1/tenants/{name}/registry-credentials/{registry}",
    tag = "tenants", security(("bearer" = [])),
    params(("name" = String, Path), ("registry" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn delete_credential(
    state: web::Data<AppState>,
    who: Principal,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (name, registry) = path.into_inner();
    visible(&state, &who, &name, Action::CredentialWrite).await?;
    state
        .store
        .delete_registry_credential(&who.audit(), &name, &registry)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// A tenant's secrets (its admins): names and when each was set. Values are never
/// returned.
#[utoipa::path(get, path = "/api/v1/tenants/{name}/secrets", tag = "tenants",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = [TenantSecretView]), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn list_secrets(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    visible(&state, &who, &name, Action::CredentialRead).await?;
    let list: Vec<TenantSecretView> = state
        .store
        .secrets(&name)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(json(StatusCode::OK, &list))
}

/// Set (or replace) a tenant's secret (its admins). Jobs of the tenant name it in
/// `secrets` to get it as a variable or a file. It is stored sealed, and no response, audit
/// entry or log shows it.
#[utoipa::path(put, path = "/api/v1/tenants/{name}/secrets/{secret}", tag = "tenants",
    security(("bearer" = [])),
    params(("name" = String, Path), ("secret" = String, Path)),
    request_body = SetSecretBody,
    responses((status = 200, body = TenantSecretView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn set_secret(
    state: web::Data<AppState>,
    who: Principal,
    path: web::Path<(String, String)>,
    Json(body): Json<SetSecretBody>,
) -> Result<HttpResponse, ApiError> {
    let (name, secret) = path.into_inner();
    visible(&state, &who, &name, Action::CredentialWrite).await?;
    allot_domain::secret::check_name("secret", &secret)?;
    allot_domain::secret::check_value(body.value.as_bytes())?;
    let shown = state
        .store
        .set_secret(&who.audit(), &name, &secret, body.value.as_bytes())
        .await?;
    Ok(json(StatusCode::OK, &TenantSecretView::from(shown)))
}

/// Remove a tenant's secret (its admins); refused (409) while an unfinished job uses it.
#[utoipa::path(delete, path = "/api/v1/tenants/{name}/secrets/{secret}", tag = "tenants",
    security(("bearer" = [])),
    params(("name" = String, Path), ("secret" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)))]
pub async fn delete_secret(
    state: web::Data<AppState>,
    who: Principal,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (name, secret) = path.into_inner();
    visible(&state, &who, &name, Action::CredentialWrite).await?;
    state
        .store
        .delete_secret(&who.audit(), &name, &secret)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}
