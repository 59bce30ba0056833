//! Which tenants' rows a read may return.
//!
//! Every read of tenant-owned data (jobs, tokens) takes a [`TenantScope`], and the type has
//! no default: a query that forgets to say whose data it reads does not compile. The API
//! derives the scope from the caller's authorization; the control plane's own loops
//! (scheduling, leases, agents) say [`TenantScope::All`] in so many words.

use sea_orm::sea_query::SimpleExpr;
use sea_orm::{ColumnTrait, Condition};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantScope {
    /// Rows of these tenants only; none at all when empty.
    Tenants(Vec<String>),
    /// Rows of every tenant, and rows that belong to none (platform-wide tokens).
    All,
}

impl TenantScope {
    pub fn tenant(id: impl Into<String>) -> Self {
        TenantScope::Tenants(vec![id.into()])
    }

    /// Whether a row of `tenant_id` (`None`: a row of no tenant) is in scope.
    pub fn includes(&self, tenant_id: Option<&str>) -> bool {
        match (self, tenant_id) {
            (TenantScope::All, _) => true,
            (TenantScope::Tenants(ids), Some(t)) => ids.iter().any(|i| i == t),
            (TenantScope::Tenants(_), None) => false,
        }
    }

    /// The condition on `column` (a tenant id column) that keeps rows in scope.
    pub(crate) fn condition<C: ColumnTrait>(&self, column: C) -> Condition {
        match self {
            TenantScope::All => Condition::all(),
            TenantScope::Tenants(ids) => {
                Condition::all().add::<SimpleExpr>(column.is_in(ids.iter().map(String::as_str)))
            }
        }
    }
}
