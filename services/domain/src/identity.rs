//! People who sign in through the organisation's identity provider, and the role bindings
//! granted through the API: to one user, or to everyone whose token carries a claim.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::{Role, ValidationError};

/// A person known by their provider's `iss` and `sub`; created at first sign-in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct User {
    pub id: String,
    pub issuer: String,
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// A deleted user's tokens are refused, however valid the provider says they are.
    pub deleted_at: Option<DateTime<Utc>>,
}

/// Whom a binding grants its role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum BindingSubject {
    User {
        user_id: String,
    },
    /// Everyone whose token's `claim` is `value` (or a list containing it).
    Claim {
        claim: String,
        value: String,
    },
}

impl BindingSubject {
    /// Checks the claim name and value are usable (1–128 and 1–512 characters).
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let BindingSubject::Claim { claim, value } = self {
            if claim.is_empty() || claim.len() > 128 {
                return Err(ValidationError::single(
                    "claim",
                    "must be 1 to 128 characters",
                ));
            }
            if value.is_empty() || value.len() > 512 {
                return Err(ValidationError::single(
                    "value",
                    "must be 1 to 512 characters",
                ));
            }
        }
        Ok(())
    }
}

/// A role granted through the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredBinding {
    pub id: String,
    pub subject: BindingSubject,
    pub role: Role,
    /// `None` for the platform roles.
    pub tenant_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl StoredBinding {
    pub fn is_active(&self) -> bool {
        self.revoked_at.is_none()
    }
}

/// A browser session of a signed-in user. Its id is a bearer secret kept only as a hash.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Session {
    pub user_id: String,
    /// Sent back with every state-changing request made with the session cookie.
    #[serde(skip)]
    pub csrf_token: String,
    /// What the provider vouched for at sign-in (claim roles and bindings match on them).
    pub claims: serde_json::Map<String, serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// The absolute end, however active the session is.
    pub expires_at: DateTime<Utc>,
    /// Signed out (or ended by an admin).
    pub ended_at: Option<DateTime<Utc>>,
}
