//! Client and server errors as RFC 9457 problem details (`application/problem+json`).
//!
//! Every error the API returns goes through [`ApiError`], so every 4xx names what was wrong
//! and, for input errors, which field; 5xx responses say nothing about internals.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use allot_domain::{FieldError, ValidationError};
use allot_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document, with Allot's `errors` extension listing invalid fields.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem (not meant to be dereferenced).
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldErrorView>,
}

/// One invalid field.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FieldErrorView {
    /// Path of the field, e.g. `gpus`, `command[0]`, `quota.limit.gpu_milli`.
    pub field: String,
    pub reason: String,
}

impl From<FieldError> for FieldErrorView {
    fn from(e: FieldError) -> Self {
        Self {
            field: e.field,
            reason: e.reason,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body or query could not be read as the expected shape (syntax, types, unknown or
    /// missing fields).
    #[error("{detail}")]
    Malformed {
        detail: String,
        errors: Vec<FieldError>,
    },
    /// Well-formed input that breaks a rule.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("the request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    Unavailable(String),
    /// Too many failed sign-ins or token checks from one source.
    #[error(
        "too many failed authentication attempts from this address; retry in {retry_after_secs} s"
    )]
    TooManyAttempts { retry_after_secs: u64 },
    /// Details go to the log, never to the client.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// A well-formed request that is not valid here (422): what it names does not exist
    /// at that size, or its fields contradict each other.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ApiError::Invalid(ValidationError::single(field, reason))
    }

    /// `e` as itself, unless the store found nothing: then `instead` (an unknown name in a
    /// request is a field error, or a not-found worded for the caller). A database that
    /// could not be asked is never told as "it does not exist".
    pub fn unless_not_found(e: StoreError, instead: impl FnOnce() -> ApiError) -> ApiError {
        match e {
            StoreError::NotFound(_) => instead(),
            e => e.into(),
        }
    }

    pub fn malformed(field: impl Into<String>, reason: impl Into<String>) -> Self {
        let reason = reason.into();
        let field = field.into();
        ApiError::Malformed {
            detail: format!("{field}: {reason}"),
            errors: vec![FieldError::new(field, reason)],
        }
    }

    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::Malformed { .. } => ("malformed-request", "Malformed request"),
            ApiError::Invalid(_) => ("validation-error", "Invalid request"),
            ApiError::Unauthenticated(_) => ("unauthenticated", "Authentication required"),
            ApiError::Forbidden(_) => ("forbidden", "Permission denied"),
            ApiError::NotFound(_) => ("not-found", "Not found"),
            ApiError::MethodNotAllowed(_) => ("method-not-allowed", "Method not allowed"),
            ApiError::Conflict(_) => ("conflict", "Conflict"),
            ApiError::PayloadTooLarge { .. } => ("payload-too-large", "Request body too large"),
            ApiError::UnsupportedMediaType(_) => {
                ("unsupported-media-type", "Unsupported media type")
            }
            ApiError::Unavailable(_) => ("unavailable", "Service unavailable"),
            ApiError::TooManyAttempts { .. } => ("too-many-attempts", "Too many attempts"),
            ApiError::Internal(_) => ("internal-error", "Internal error"),
        }
    }

    pub fn problem(&self) -> Problem {
        let (kind, title) = self.kind();
        let errors = match self {
            ApiError::Malformed { errors, .. } => errors.clone(),
            ApiError::Invalid(v) => v.0.clone(),
            _ => Vec::new(),
        };
        Problem {
            kind: format!("tag:allot.dev,2026:problem:{kind}"),
            title: title.to_owned(),
            status: self.status_code().as_u16(),
            detail: self.to_string(),
            errors: errors.into_iter().map(FieldErrorView::from).collect(),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Malformed { .. } => StatusCode::BAD_REQUEST,
            ApiError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::TooManyAttempts { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ApiError::Internal(detail) = self {
            tracing::error!(%detail, "internal error");
        }
        let mut res = HttpResponse::build(self.status_code());
        res.content_type(PROBLEM_JSON);
        if matches!(self, ApiError::Unauthenticated(_)) {
            res.insert_header(("WWW-Authenticate", "Bearer realm=\"allot\""));
        }
        if let ApiError::TooManyAttempts { retry_after_secs } = self {
            res.insert_header(("Retry-After", retry_after_secs.to_string()));
        }
        if matches!(self, ApiError::Unavailable(_)) {
            res.insert_header(("Retry-After", "1"));
        }
        res.json(self.problem())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => ApiError::NotFound(format!("{what} does not exist")),
            StoreError::Conflict(msg) | StoreError::Stale(msg) => ApiError::Conflict(msg),
            StoreError::Refused(msg) => ApiError::Forbidden(msg),
            // Details (addresses, server messages) go to the log only.
            StoreError::Unavailable(detail) => {
                tracing::warn!(%detail, "database unavailable");
                ApiError::Unavailable(
                    "the database is unavailable (failing over?); retry the request".into(),
                )
            }
            e @ (StoreError::Corrupt(_)
            | StoreError::Db(_)
            | StoreError::Batch(_)
            | StoreError::Migrate(_)
            | StoreError::Fenced(_)) => ApiError::Internal(e.to_string()),
        }
    }
}
