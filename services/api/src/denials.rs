//! Records every refused request (401, 403 and 429) in the system audit log, with who asked,
//! from where, for what, and why it was refused; and every 404 an authenticated caller gets,
//! as `api.not_found`: a request for another tenant's job, log or quota is answered exactly
//! as one for nothing at all (so the caller learns nothing), but probing leaves a trace.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{HttpMessage, web};
use allot_domain::{Actor, ActorKind, AuditContext, AuditEvent, Outcome, SYSTEM_LOG};

use crate::auth::{Principal, UnusableToken};
use crate::{ApiError, AppState};

/// actix middleware: pass the request on, and audit it if it was refused.
pub async fn record_denials(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let target = format!("{} {}", req.method(), req.path());
    let source = crate::client::address(req.request());
    let res = next.call(req).await?;
    let status = res.status();
    let principal = res.request().extensions().get::<Principal>().cloned();
    let refused = matches!(
        status,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    ) || (status == StatusCode::NOT_FOUND && principal.is_some());
    if !refused {
        return Ok(res);
    }
    let Some(state) = state else {
        return Ok(res);
    };
    let reason = res
        .response()
        .error()
        .and_then(|e| e.as_error::<ApiError>())
        .map(ToString::to_string);
    let presented = res
        .request()
        .extensions()
        .get::<UnusableToken>()
        .map(|t| t.0.clone());
    let ctx = principal.map_or_else(
        || AuditContext {
            actor: Actor {
                kind: ActorKind::Token,
                id: presented.unwrap_or_else(|| "unauthenticated".to_owned()),
                tenant_id: None,
                auth_method: "api-token".to_owned(),
                source,
            },
            request_id: None,
        },
        |p| p.audit(),
    );
    let action = match status {
        StatusCode::UNAUTHORIZED => "api.unauthenticated",
        StatusCode::TOO_MANY_REQUESTS => "api.rate_limited",
        StatusCode::NOT_FOUND => "api.not_found",
        _ => "api.denied",
    };
    let event = AuditEvent {
        log: SYSTEM_LOG.to_owned(),
        action: action.to_owned(),
        target,
        outcome: Outcome::Denied,
        reason,
        before: None,
        after: None,
    };
    if let Err(e) = state.audit_batcher.record(ctx, event).await {
        tracing::error!(error = %e, "could not audit a refused request");
    }
    Ok(res)
}
