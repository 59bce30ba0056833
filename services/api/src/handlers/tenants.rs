use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_domain::{Quota, Role, TenantName};
use allot_store::TenantRepo;

use crate::auth::Principal;
use crate::extract::Json;
use crate::problem::Problem;
use crate::views::{CreateTenant, QuotaBody, TenantView};
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
    who.require_admin()?;
    let name = TenantName::parse("name", &body.name)?;
    let quota = Quota::from(body.quota);
    quota.validate("quota.")?;
    let tenant = state
        .store
        .create_tenant(&who.audit(), &name, quota)
        .await?;
    Ok(json(StatusCode::CREATED, &TenantView::from(tenant)))
}

/// List tenants: all of them for admins, the caller's own otherwise.
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenants", security(("bearer" = [])),
    responses((status = 200, body = Vec<TenantView>), (status = 401, body = Problem)))]
pub async fn list(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    let tenants: Vec<TenantView> = state
        .store
        .list_tenants()
        .await?
        .into_iter()
        .filter(|t| who.can_see(&t.id))
        .map(Into::into)
        .collect();
    Ok(json(StatusCode::OK, &tenants))
}

async fn visible(
    state: &AppState,
    who: &Principal,
    name: &str,
) -> Result<allot_domain::Tenant, ApiError> {
    let what = format!("tenant `{name}`");
    let tenant = state
        .store
        .tenant_by_name(name)
        .await
        .map_err(|_| ApiError::NotFound(format!("{what} does not exist")))?;
    who.require(&tenant.id, Role::Viewer, &what)?;
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
    let tenant = visible(&state, &who, &name).await?;
    Ok(json(StatusCode::OK, &TenantView::from(tenant)))
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
    let tenant = visible(&state, &who, &name).await?;
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
    who.require_admin()?;
    let quota = Quota::from(body);
    quota.validate("")?;
    let tenant = state.store.set_quota(&who.audit(), &name, quota).await?;
    state.events.job_submitted();
    Ok(json(StatusCode::OK, &TenantView::from(tenant)))
}
