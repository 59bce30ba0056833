//! Enrolling nodes: one-time bootstrap tokens an agent registers with, and revoking a
//! node's certificates. Platform admins only (`node.operate`).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_domain::{AuditContext, ValidationError};
use allot_store::{BootstrapToken, EnrollmentRepo, NewBootstrapToken, NodeRepo, Store, StoreError};

use crate::auth::Principal;
use crate::extract::Json;
use crate::problem::Problem;
use crate::views::{BootstrapTokenView, CreateBootstrapToken, CreatedBootstrapToken, RevokedNode};
use crate::{ApiError, AppState, json, secret};

/// Prefix of every bootstrap token.
pub const BOOTSTRAP_TOKEN_PREFIX: &str = "allot_boot_";
/// How long a bootstrap token lasts unless told otherwise.
pub const DEFAULT_BOOTSTRAP_TTL: std::time::Duration = std::time::Duration::from_secs(3600);
const MAX_BOOTSTRAP_TTL_SECS: u64 = 7 * 24 * 3600;

/// What a bootstrap token admits: a node name or pattern, and whether it may take over a
/// registered node's name.
pub struct TokenFor<'a> {
    pub node_name: &'a str,
    pub replace: bool,
}

/// Creates a bootstrap token for `admits`, valid for `ttl`; returns its secret (shown
/// once) and record.
pub async fn issue_bootstrap_token(
    store: &Store,
    ctx: &AuditContext,
    description: &str,
    admits: TokenFor<'_>,
    ttl: std::time::Duration,
) -> Result<(String, BootstrapToken), StoreError> {
    let secret = secret::generate(BOOTSTRAP_TOKEN_PREFIX);
    let expires_at =
        store.clock().now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::hours(1));
    let token = store
        .create_bootstrap_token(
            ctx,
            NewBootstrapToken {
                secret_hash: secret::hash(&secret),
                description: description.to_owned(),
                expires_at,
                node_name: admits.node_name.to_owned(),
                replace: admits.replace,
            },
        )
        .await?;
    Ok((secret, token))
}

/// Create a bootstrap token (platform admins): one agent registers with it, once, before it
/// expires. The secret is returned once.
#[utoipa::path(post, path = "/api/v1/bootstrap-tokens", tag = "nodes",
    request_body = CreateBootstrapToken, security(("bearer" = [])),
    responses((status = 201, body = CreatedBootstrapToken), (status = 403, body = Problem),
        (status = 422, body = Problem)))]
pub async fn create(
    state: web::Data<AppState>,
    who: Principal,
    Json(body): Json<CreateBootstrapToken>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::NodeOperate, Resource::Platform, "bootstrap tokens")?;
    allot_domain::node::check_node_pattern("node_name", &body.node_name)?;
    let description = body.description.trim();
    if description.chars().count() > 200 {
        return Err(
            ValidationError::single("description", "must be at most 200 characters").into(),
        );
    }
    let ttl = match body.expires_in_seconds {
        None => DEFAULT_BOOTSTRAP_TTL,
        Some(s) if (1..=MAX_BOOTSTRAP_TTL_SECS).contains(&s) => std::time::Duration::from_secs(s),
        Some(_) => {
            return Err(ValidationError::single(
                "expires_in_seconds",
                format!("must be between 1 and {MAX_BOOTSTRAP_TTL_SECS} (seven days)"),
            )
            .into());
        }
    };
    let (secret, token) = issue_bootstrap_token(
        &state.store,
        &who.audit(),
        description,
        TokenFor {
            node_name: &body.node_name,
            replace: body.replace,
        },
        ttl,
    )
    .await?;
    Ok(json(
        StatusCode::CREATED,
        &CreatedBootstrapToken {
            token: token.into(),
            secret,
        },
    ))
}

/// List bootstrap tokens (platform admins), newest first; never their secrets.
#[utoipa::path(get, path = "/api/v1/bootstrap-tokens", tag = "nodes", security(("bearer" = [])),
    responses((status = 200, body = Vec<BootstrapTokenView>), (status = 403, body = Problem)))]
pub async fn list(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::NodeOperate, Resource::Platform, "bootstrap tokens")?;
    let tokens: Vec<BootstrapTokenView> = state
        .store
        .list_bootstrap_tokens()
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(json(StatusCode::OK, &tokens))
}

/// Delete a bootstrap token (platform admins): it admits no one from now on.
#[utoipa::path(delete, path = "/api/v1/bootstrap-tokens/{id}", tag = "nodes",
    security(("bearer" = [])), params(("id" = String, Path)),
    responses((status = 200, body = BootstrapTokenView), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn delete(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::NodeOperate, Resource::Platform, "bootstrap tokens")?;
    let token = state
        .store
        .delete_bootstrap_token(&who.audit(), &id)
        .await?;
    Ok(json(StatusCode::OK, &BootstrapTokenView::from(token)))
}

/// Revoke a node (platform admins): every certificate it holds stops authenticating at
/// once, and its open assignment stream is closed. Its jobs are requeued when its lease
/// lapses (its agent stops them before then). It comes back only by registering with a new
/// bootstrap token.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/revoke", tag = "nodes",
    security(("bearer" = [])), params(("id" = String, Path, description = "node id or name")),
    responses((status = 200, body = RevokedNode), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn revoke_node(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(
        Action::NodeOperate,
        Resource::Node(&id),
        &format!("node `{id}`"),
    )?;
    let node = super::nodes::find(&state, &id).await?;
    let revoked = state.store.revoke_node(&who.audit(), &node.id).await?;
    state.events.node_revoked(&node.id);
    let node = state.store.node(&node.id).await?;
    Ok(json(
        StatusCode::OK,
        &RevokedNode {
            node: super::nodes::view(&state, &who, node).await?,
            certificates_revoked: revoked,
        },
    ))
}
