use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_domain::{ApiToken, ValidationError};
use allot_store::{NewToken, TenantScope, TokenRepo};
use chrono::Duration;

use super::grant;
use crate::auth::Principal;
use crate::extract::Json;
use crate::problem::Problem;
use crate::views::{CreateToken, CreatedToken, TokenView};
use crate::{ApiError, AppState, json, secret};

/// Prefix of every API token secret, so leaked tokens are easy to scan for.
pub const TOKEN_PREFIX: &str = "allot_";
const MAX_LIFETIME_SECS: u64 = 10 * 365 * 24 * 3600;

async fn view(state: &AppState, t: ApiToken) -> Result<TokenView, ApiError> {
    let tenant = grant::tenant_name(state, t.tenant_id.as_deref()).await?;
    Ok(TokenView::new(t, tenant))
}

/// Create an API token. Admins create any; tenant admins create tokens of their own tenant
/// with a role no higher than theirs. The secret is returned once.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens", request_body = CreateToken,
    security(("bearer" = [])),
    responses((status = 201, body = CreatedToken), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 422, body = Problem)))]
pub async fn create(
    state: web::Data<AppState>,
    who: Principal,
    Json(body): Json<CreateToken>,
) -> Result<HttpResponse, ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.len() > 128 {
        return Err(ValidationError::single("name", "must be 1 to 128 characters").into());
    }
    // A token's name is who submitted its jobs, shown in lists, exports and the audit log.
    if allot_domain::job::has_unsafe_chars(name) {
        return Err(ValidationError::single(
            "name",
            "must not contain control or text-direction characters",
        )
        .into());
    }
    if let Some(secs) = body.expires_in_seconds
        && !(1..=MAX_LIFETIME_SECS).contains(&secs)
    {
        return Err(ValidationError::single(
            "expires_in_seconds",
            format!("must be between 1 and {MAX_LIFETIME_SECS} (ten years)"),
        )
        .into());
    }
    let tenant_id = grant::authorize(
        &state,
        &who,
        Action::TokenCreate,
        body.role,
        body.tenant.as_deref(),
    )
    .await?;
    let now = state.store.clock().now();
    let expires_at = body
        .expires_in_seconds
        .map(|s| now + Duration::seconds(i64::try_from(s).unwrap_or(i64::MAX)));
    let secret = secret::generate(TOKEN_PREFIX);
    let token = state
        .store
        .create_token(
            &who.audit(),
            NewToken {
                name: name.to_owned(),
                tenant_id,
                role: body.role,
                secret_hash: secret::hash(&secret),
                expires_at,
            },
        )
        .await?;
    Ok(json(
        StatusCode::CREATED,
        &CreatedToken {
            token: view(&state, token).await?,
            secret,
        },
    ))
}

/// List API tokens: all for admins, the tenant's for tenant admins.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", security(("bearer" = [])),
    responses((status = 200, body = Vec<TokenView>), (status = 403, body = Problem)))]
pub async fn list(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    let mut out = Vec::new();
    for t in state.store.list_tokens(&scope(&who)?).await? {
        out.push(view(&state, t).await?);
    }
    Ok(json(StatusCode::OK, &out))
}

fn scope(who: &Principal) -> Result<TenantScope, ApiError> {
    grant::scope(who, Action::TokenList, "API tokens")
}

/// The token, if the caller may see it (else 404) and do `action` to it (else 403).
async fn manageable(
    state: &AppState,
    who: &Principal,
    id: &str,
    action: Action,
) -> Result<(ApiToken, TenantScope), ApiError> {
    let what = format!("token {id}");
    let scope = scope(who).map_err(|_| ApiError::NotFound(format!("{what} does not exist")))?;
    let token = state.store.token(&scope, id).await?;
    who.authorize(
        action,
        Resource::Token {
            id,
            tenant: token.tenant_id.as_deref(),
        },
        &what,
    )?;
    Ok((token, scope))
}

/// Get an API token's metadata (never its secret).
#[utoipa::path(get, path = "/api/v1/tokens/{id}", tag = "tokens", params(("id" = String, Path)),
    security(("bearer" = [])),
    responses((status = 200, body = TokenView), (status = 404, body = Problem)))]
pub async fn get(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (token, _) = manageable(&state, &who, &id, Action::TokenRead).await?;
    Ok(json(StatusCode::OK, &view(&state, token).await?))
}

/// Revoke an API token; it stops working at once. Revoking twice is harmless.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tokens",
    params(("id" = String, Path)), security(("bearer" = [])),
    responses((status = 200, body = TokenView), (status = 404, body = Problem)))]
pub async fn revoke(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (_, scope) = manageable(&state, &who, &id, Action::TokenRevoke).await?;
    let token = state.store.revoke_token(&who.audit(), &scope, &id).await?;
    Ok(json(StatusCode::OK, &view(&state, token).await?))
}
