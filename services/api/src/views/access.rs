//! Who may call: API tokens, users and role bindings; health.

use allot_domain::{ApiToken, Role};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What the token is for, e.g. `ci-pipeline`.
    pub name: String,
    /// The tenant the token acts in; required for every role except `platform-admin` and `auditor`.
    pub tenant: Option<String>,
    #[schema(value_type = String, example = "member", pattern = "^(viewer|member|tenant-admin|platform-admin|admin|auditor)$")]
    pub role: Role,
    /// Lifetime in seconds (at most ten years); no expiry when absent.
    #[schema(minimum = 1, maximum = 315_360_000)]
    pub expires_in_seconds: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub tenant: Option<String>,
    /// viewer, member, tenant-admin, platform-admin or auditor.
    pub role: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// When the token was last used, to the minute.
    pub last_used_at: Option<DateTime<Utc>>,
}

impl TokenView {
    pub fn new(t: ApiToken, tenant: Option<String>) -> Self {
        Self {
            id: t.id,
            name: t.name,
            tenant,
            role: t.role.to_string(),
            created_at: t.created_at,
            expires_at: t.expires_at,
            revoked_at: t.revoked_at,
            last_used_at: t.last_used_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    pub token: TokenView,
    /// The bearer secret. Shown once; only its hash is stored.
    pub secret: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

/// A person who signed in through the identity provider.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UserView {
    pub id: String,
    pub issuer: String,
    /// The provider's `sub` for this person.
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
}

impl From<allot_domain::User> for UserView {
    fn from(u: allot_domain::User) -> Self {
        Self {
            id: u.id,
            issuer: u.issuer,
            subject: u.subject,
            email: u.email,
            name: u.name,
            created_at: u.created_at,
            last_seen_at: u.last_seen_at,
            deleted_at: u.deleted_at,
        }
    }
}

/// Grant a role to one user, or to everyone whose token carries a claim.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBinding {
    /// The user's id (from `GET /api/v1/users`); or give `claim` and `value`.
    pub user: Option<String>,
    /// A token claim, e.g. `groups`.
    pub claim: Option<String>,
    /// The claim's value (or one of its values), e.g. `ml-team`.
    pub value: Option<String>,
    #[schema(value_type = String, example = "member", pattern = "^(viewer|member|tenant-admin|platform-admin|admin|auditor)$")]
    pub role: Role,
    /// The tenant the role applies in (and below); absent for platform-admin and auditor.
    pub tenant: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BindingView {
    pub id: String,
    /// The user granted the role, for user bindings.
    pub user: Option<String>,
    pub claim: Option<String>,
    pub value: Option<String>,
    pub role: String,
    pub tenant: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl BindingView {
    pub fn new(b: allot_domain::StoredBinding, tenant: Option<String>) -> Self {
        let (user, claim, value) = match b.subject {
            allot_domain::BindingSubject::User { user_id } => (Some(user_id), None, None),
            allot_domain::BindingSubject::Claim { claim, value } => {
                (None, Some(claim), Some(value))
            }
        };
        Self {
            id: b.id,
            user,
            claim,
            value,
            role: b.role.to_string(),
            tenant,
            created_at: b.created_at,
            revoked_at: b.revoked_at,
        }
    }
}
