//! Granting a role, by token or by binding: where it applies, and whether the caller may
//! grant it there.

use allot_authz::{Action, Resource};
use allot_domain::{Role, ValidationError};
use allot_store::{TenantRepo, TenantScope};

use crate::auth::Principal;
use crate::{ApiError, AppState};

/// Resolves the tenant a grant of `role` names (none for the platform roles, exactly one
/// for the others) and requires the policies to let the caller `action` it there. A tenant
/// the caller cannot see is the same field error as one that does not exist.
pub(super) async fn authorize(
    state: &AppState,
    who: &Principal,
    action: Action,
    role: Role,
    tenant: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let tenant_id = match (role, tenant) {
        (role, None) if role.is_platform() => None,
        (role, Some(_)) if role.is_platform() => {
            return Err(ValidationError::single(
                "tenant",
                format!("must be absent for the {role} role, which spans all tenants"),
            )
            .into());
        }
        (_, None) => {
            return Err(ValidationError::single(
                "tenant",
                "is required for tenant-scoped roles (viewer, member, tenant-admin)",
            )
            .into());
        }
        (_, Some(name)) => {
            let unknown = || ValidationError::single("tenant", format!("no tenant named `{name}`"));
            let t = state
                .store
                .tenant_by_name(name)
                .await
                .map_err(|e| ApiError::unless_not_found(e, || unknown().into()))?;
            if !who.can_see(&t.id)? {
                return Err(unknown().into());
            }
            Some(t.id)
        }
    };
    let (resource, what) = match &tenant_id {
        Some(t) => (Resource::Tenant(t), "the tenant"),
        None => (Resource::Platform, "the platform"),
    };
    who.authorize_granting(action, resource, Some(role), what)?;
    Ok(tenant_id)
}

/// What `list` reaches of tenant-owned grants: everything when the policies permit it
/// platform-wide, else the tenants where they permit it.
pub(super) fn scope(who: &Principal, list: Action, what: &str) -> Result<TenantScope, ApiError> {
    if who.allows(list, Resource::Platform)? {
        return Ok(TenantScope::All);
    }
    who.scope(list, what)
}

/// A tenant's name for views.
pub(super) async fn tenant_name(
    state: &AppState,
    tenant_id: Option<&str>,
) -> Result<Option<String>, ApiError> {
    Ok(match tenant_id {
        Some(id) => Some(state.store.tenant_by_id(id).await?.name.to_string()),
        None => None,
    })
}
