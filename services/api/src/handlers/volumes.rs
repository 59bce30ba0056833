//! Named volumes: shared storage platform admins declare, which jobs mount by name.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_domain::{TenantName, Volume};
use allot_store::{TenantRepo, VolumeRepo};

use crate::auth::Principal;
use crate::extract::Json;
use crate::problem::Problem;
use crate::views::{VolumeBody, VolumeView};
use crate::{ApiError, AppState, json};

/// The volumes the caller's tenants may mount (all of them, for platform admins).
#[utoipa::path(get, path = "/api/v1/volumes", tag = "volumes", security(("bearer" = [])),
    responses((status = 200, body = [VolumeView]), (status = 401, body = Problem)))]
pub async fn list(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    let all = state.store.list_volumes().await?;
    let shown: Vec<VolumeView> = if who.allows(Action::VolumeWrite, Resource::Platform)? {
        all.into_iter().map(Into::into).collect()
    } else {
        let mine = who.permitted_tenants(Action::JobSubmit)?;
        let tenants = state.store.list_tenants().await?;
        let names: Vec<&TenantName> = tenants
            .iter()
            .filter(|t| mine.contains(&t.id))
            .map(|t| &t.name)
            .collect();
        all.into_iter()
            .filter(|v| names.iter().any(|n| v.allows(n)))
            .map(|mut v| {
                // Other tenants' names are not theirs to know.
                v.tenants.retain(|t| names.contains(&t));
                v.into()
            })
            .collect()
    };
    Ok(json(StatusCode::OK, &shown))
}

/// Declare a volume, or replace its declaration (platform admins). Taking a tenant off it,
/// or making it read-only, is refused (409) while unfinished jobs mount it that way.
#[utoipa::path(put, path = "/api/v1/volumes/{name}", tag = "volumes",
    security(("bearer" = [])), params(("name" = String, Path)), request_body = VolumeBody,
    responses((status = 200, body = VolumeView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)))]
pub async fn put(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
    Json(body): Json<VolumeBody>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::VolumeWrite, Resource::Platform, "the platform")?;
    let known = state.store.list_tenants().await?;
    let mut tenants = Vec::new();
    for (i, t) in body.tenants.iter().enumerate() {
        let field = format!("tenants[{i}]");
        let parsed = TenantName::parse(&field, t)?;
        if !known.iter().any(|k| k.name == parsed) {
            return Err(allot_domain::ValidationError::single(
                field,
                format!("no tenant named `{t}`"),
            )
            .into());
        }
        if !tenants.contains(&parsed) {
            tenants.push(parsed);
        }
    }
    let volume = Volume {
        name: name.into_inner(),
        host_path: body.host_path,
        tenants,
        read_only: body.read_only,
        created_at: state.store.clock().now(),
    };
    volume.validate()?;
    let saved = state.store.put_volume(&who.audit(), volume).await?;
    Ok(json(StatusCode::OK, &VolumeView::from(saved)))
}

/// Remove a volume's declaration (platform admins); refused (409) while unfinished jobs
/// mount it. Nothing on the storage itself is touched.
#[utoipa::path(delete, path = "/api/v1/volumes/{name}", tag = "volumes",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)))]
pub async fn delete(
    state: web::Data<AppState>,
    who: Principal,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::VolumeWrite, Resource::Platform, "the platform")?;
    state.store.delete_volume(&who.audit(), &name).await?;
    Ok(HttpResponse::NoContent().finish())
}
