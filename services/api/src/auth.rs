//! Who is calling: the API token in `Authorization: Bearer …`, and what it may do.

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};
use allot_domain::{Actor, ActorKind, AuditContext, Role};
use allot_store::TokenRepo;

use crate::AppState;
use crate::problem::ApiError;
use crate::secret;

/// Where the audit API lives: the only routes an auditor token opens.
const AUDIT_PATH: &str = "/api/v1/audit/";

/// The id of a presented token that exists but is revoked or expired.
#[derive(Debug, Clone)]
pub struct UnusableToken(pub String);

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Principal {
    pub token_id: String,
    pub role: Role,
    /// The tenant a scoped token belongs to; `None` for platform admins.
    pub tenant_id: Option<String>,
    /// The client's address.
    pub source: Option<String>,
    /// The caller's `X-Request-Id` when it is sensible, else one made up for this request.
    pub request_id: String,
}

/// A request id from the client's header if it is 1–128 characters of `[A-Za-z0-9._-]`.
fn request_id(req: &HttpRequest) -> String {
    req.headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            (1..=128).contains(&v.len())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        })
        .map_or_else(|| secret::generate("req_")[..36].to_owned(), str::to_owned)
}

impl Principal {
    /// Who to record in the audit log for this request's changes.
    pub fn audit(&self) -> AuditContext {
        AuditContext {
            actor: Actor {
                kind: ActorKind::Token,
                id: self.token_id.clone(),
                tenant_id: self.tenant_id.clone(),
                auth_method: "api-token".to_owned(),
                source: self.source.clone(),
            },
            request_id: Some(self.request_id.clone()),
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether the caller reads every audit log (admins and auditors).
    pub fn reads_all_audit_logs(&self) -> bool {
        matches!(self.role, Role::Admin | Role::Auditor)
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "this action needs a platform admin token".into(),
            ))
        }
    }

    /// Whether the caller can see `tenant_id` at all.
    pub fn can_see(&self, tenant_id: &str) -> bool {
        self.is_admin() || self.tenant_id.as_deref() == Some(tenant_id)
    }

    /// Requires at least `role` within `tenant_id`. Other tenants' resources are reported as
    /// missing (404, via `what`), so their existence does not leak.
    pub fn require(&self, tenant_id: &str, role: Role, what: &str) -> Result<(), ApiError> {
        if !self.can_see(tenant_id) {
            return Err(ApiError::NotFound(format!("{what} does not exist")));
        }
        if !self.role.includes(role) {
            return Err(ApiError::Forbidden(format!(
                "this action needs the {role} role; the token has {}",
                self.role
            )));
        }
        Ok(())
    }
}

impl FromRequest for Principal {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let http_req = req.clone();
        let source = req.peer_addr().map(|a| a.ip().to_string());
        let request_id = request_id(req);
        let header = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.to_str().map(str::to_owned));
        Box::pin(async move {
            let state =
                state.ok_or_else(|| ApiError::Internal("application state missing".into()))?;
            let value = match header {
                None => {
                    return Err(ApiError::Unauthenticated(
                        "send an API token as `Authorization: Bearer <token>`".into(),
                    ));
                }
                Some(Err(_)) => {
                    return Err(ApiError::Unauthenticated(
                        "the Authorization header is not valid text".into(),
                    ));
                }
                Some(Ok(v)) => v,
            };
            let Some(token) = value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
                .map(str::trim)
                .filter(|t| !t.is_empty())
            else {
                return Err(ApiError::Unauthenticated(
                    "the Authorization header must be `Bearer <token>`".into(),
                ));
            };
            let found = state.store.use_token(&secret::hash(token)).await?;
            let now = state.store.clock().now();
            match found {
                Some(t)
                    if t.is_usable(now)
                        && t.role == Role::Auditor
                        // The route that matched, not the raw path a client chose.
                        && !http_req
                            .match_pattern()
                            .is_some_and(|p| p.starts_with(AUDIT_PATH)) =>
                {
                    http_req.extensions_mut().insert(Principal {
                        token_id: t.id,
                        role: t.role,
                        tenant_id: t.tenant_id,
                        source,
                        request_id,
                    });
                    Err(ApiError::Forbidden(
                        "the auditor role reads the audit logs and nothing else".into(),
                    ))
                }
                Some(t) if t.is_usable(now) => {
                    let principal = Principal {
                        token_id: t.id,
                        role: t.role,
                        tenant_id: t.tenant_id,
                        source,
                        request_id,
                    };
                    // For the denial audit, which runs after the handler.
                    http_req.extensions_mut().insert(principal.clone());
                    Ok(principal)
                }
                Some(t) => {
                    // Named in the denial audit: a known token that no longer works.
                    http_req
                        .extensions_mut()
                        .insert(UnusableToken(t.id.clone()));
                    Err(ApiError::Unauthenticated(if t.revoked_at.is_some() {
                        "the token has been revoked".into()
                    } else {
                        "the token has expired".into()
                    }))
                }
                None => Err(ApiError::Unauthenticated("the token is not valid".into())),
            }
        })
    }
}
