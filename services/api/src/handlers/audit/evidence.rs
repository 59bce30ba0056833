//! The auditor's evidence bundle: the control matrices Allot claims (each control naming
//! the test that evidences it), the authorization policies in force with their SHA-256,
//! the verifier keys, and every log's latest signed checkpoint — what an auditor needs to
//! tie a claim to its test and a log to its signature, offline.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_domain::{AuditEntry, AuditEvent, SYSTEM_LOG};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::problem::Problem;
use crate::{ApiError, AppState, json};

/// The control matrices of this build.
const CONTROL_MATRICES: [(&str, &str); 2] = [
    (
        "soc2-controls.md",
        include_str!("../../../../../policies/soc2-controls.md"),
    ),
    (
        "iso27001-controls.md",
        include_str!("../../../../../policies/iso27001-controls.md"),
    ),
];

/// A file of the bundle, with the hex SHA-256 of its text.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EvidenceFile {
    pub name: String,
    pub sha256: String,
    pub text: String,
}

impl EvidenceFile {
    fn new(name: &str, text: &str) -> Self {
        Self {
            name: name.to_owned(),
            sha256: hex::encode(Sha256::digest(text.as_bytes())),
            text: text.to_owned(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Evidence {
    pub generated_at: DateTime<Utc>,
    /// The control plane's version.
    pub version: String,
    pub control_matrices: Vec<EvidenceFile>,
    /// The Cedar schema and policies every request is authorized by, as loaded.
    pub policies: Vec<EvidenceFile>,
    /// The checkpoint verifier keys with their validity periods (`allot audit verify
    /// --trusted-key` reads this).
    pub verifier_keys: String,
    /// Every log's head and latest signed checkpoint.
    pub checkpoints: Vec<super::AuditLogView>,
}

/// The evidence bundle (auditors and platform admins); the request is audited.
#[utoipa::path(get, path = "/api/v1/audit/evidence", tag = "audit", security(("bearer" = [])),
    responses((status = 200, body = Evidence), (status = 403, body = Problem)))]
pub async fn evidence(
    state: web::Data<AppState>,
    who: Principal,
) -> Result<HttpResponse, ApiError> {
    who.authorize(
        Action::AuditEvidence,
        Resource::Platform,
        "the evidence bundle",
    )?;
    let now = state.store.clock().now();
    let checkpoints = super::log_views(&state, None).await?;
    let bundle = Evidence {
        generated_at: now,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        control_matrices: CONTROL_MATRICES
            .iter()
            .map(|(n, t)| EvidenceFile::new(n, t))
            .collect(),
        policies: state
            .policies
            .sources()
            .iter()
            .map(|(n, t)| EvidenceFile::new(n, t))
            .collect(),
        verifier_keys: state.audit_keys.public().to_text(),
        checkpoints,
    };
    let event = AuditEvent::success(SYSTEM_LOG, "audit.evidence", "audit/evidence").after(
        serde_json::json!({
            "at": AuditEntry::format_time(now),
            "policies": bundle.policies.iter().map(|p| (p.name.clone(), p.sha256.clone())).collect::<std::collections::BTreeMap<_, _>>(),
            "logs": bundle.checkpoints.len(),
        }),
    );
    state.audit_batcher.record(who.audit(), event).await?;
    Ok(json(StatusCode::OK, &bundle))
}
