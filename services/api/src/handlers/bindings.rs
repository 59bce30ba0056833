use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_domain::{BindingSubject, StoredBinding, ValidationError};
use allot_store::{IdentityRepo, NewBinding, TenantScope};

use super::grant;
use crate::auth::Principal;
use crate::extract::Json;
use crate::problem::Problem;
use crate::views::{BindingView, CreateBinding};
use crate::{ApiError, AppState, json};

async fn view(state: &AppState, b: StoredBinding) -> Result<BindingView, ApiError> {
    let tenant = grant::tenant_name(state, b.tenant_id.as_deref()).await?;
    Ok(BindingView::new(b, tenant))
}

/// Grant a role to a user, or to everyone whose provider token carries a claim. Tenant
/// admins grant roles up to theirs in their tenants; platform roles need a platform admin.
#[utoipa::path(post, path = "/api/v1/role-bindings", tag = "access", request_body = CreateBinding,
    security(("bearer" = [])),
    responses((status = 201, body = BindingView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 422, body = Problem)))]
pub async fn create(
    state: web::Data<AppState>,
    who: Principal,
    Json(body): Json<CreateBinding>,
) -> Result<HttpResponse, ApiError> {
    let subject = match (body.user, body.claim, body.value) {
        (Some(user_id), None, None) => BindingSubject::User { user_id },
        (None, Some(claim), Some(value)) => BindingSubject::Claim { claim, value },
        (None, Some(_), None) => {
            return Err(ValidationError::single("value", "is required with `claim`").into());
        }
        (None, None, Some(_)) => {
            return Err(ValidationError::single("claim", "is required with `value`").into());
        }
        _ => {
            return Err(ValidationError::single(
                "user",
                "give either `user`, or `claim` and `value`",
            )
            .into());
        }
    };
    subject.validate()?;
    let tenant_id = grant::authorize(
        &state,
        &who,
        Action::BindingCreate,
        body.role,
        body.tenant.as_deref(),
    )
    .await?;
    if let BindingSubject::User { user_id } = &subject {
        // Only platform admins see the user directory: others may bind a user id they were
        // given, but learn nothing about who exists beyond "not a usable user".
        let usable = match state.store.user(user_id).await {
            Ok(u) => u.deleted_at.is_none(),
            Err(allot_store::StoreError::NotFound(_)) => false,
            Err(e) => return Err(e.into()),
        };
        if !usable {
            return Err(ValidationError::single("user", "is not a user who can sign in").into());
        }
    }
    let binding = state
        .store
        .create_binding(
            &who.audit(),
            NewBinding {
                subject,
                role: body.role,
                tenant_id,
            },
        )
        .await?;
    Ok(json(StatusCode::CREATED, &view(&state, binding).await?))
}

/// List role bindings: all for platform admins, their tenants' for tenant admins.
#[utoipa::path(get, path = "/api/v1/role-bindings", tag = "access", security(("bearer" = [])),
    responses((status = 200, body = Vec<BindingView>), (status = 403, body = Problem)))]
pub async fn list(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    let scope = grant::scope(&who, Action::BindingList, "role bindings")?;
    let mut out = Vec::new();
    for b in state.store.list_bindings(&scope).await? {
        out.push(view(&state, b).await?);
    }
    Ok(json(StatusCode::OK, &out))
}

/// The binding, if the caller may see it (else 404) and do `action` to it (else 403).
async fn manageable(
    state: &AppState,
    who: &Principal,
    id: &str,
    action: Action,
) -> Result<(StoredBinding, TenantScope), ApiError> {
    let what = format!("role binding {id}");
    let scope = grant::scope(who, Action::BindingList, "role bindings")
        .map_err(|_| ApiError::NotFound(format!("{what} does not exist")))?;
    let binding = state.store.binding(&scope, id).await?;
    who.authorize(
        action,
        Resource::Binding {
            id,
            tenant: binding.tenant_id.as_deref(),
        },
        &what,
    )?;
    Ok((binding, scope))
}

/// Get a role binding.
#[utoipa::path(get, path = "/api/v1/role-bindings/{id}", tag = "access",
    params(("id" = String, Path)), security(("bearer" = [])),
    responses((status = 200, body = BindingView), (status = 404, body = Problem)))]
pub async fn get(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (binding, _) = manageable(&state, &who, &id, Action::BindingRead).await?;
    Ok(json(StatusCode::OK, &view(&state, binding).await?))
}

/// Revoke a role binding; it stops granting its role on the next request.
#[utoipa::path(delete, path = "/api/v1/role-bindings/{id}", tag = "access",
    params(("id" = String, Path)), security(("bearer" = [])),
    responses((status = 200, body = BindingView), (status = 404, body = Problem)))]
pub async fn revoke(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (_, scope) = manageable(&state, &who, &id, Action::BindingRevoke).await?;
    let binding = state
        .store
        .revoke_binding(&who.audit(), &scope, &id)
        .await?;
    Ok(json(StatusCode::OK, &view(&state, binding).await?))
}
