//! Names for the ids an audit entry records: its log's tenant, its actor (a token, a
//! user, a node) and its target, as they are named now. The entry itself is what was
//! signed and never changes; the names are read beside it, for people.

use std::collections::HashMap;

use allot_authz::{Action, Resource};
use allot_store::{IdentityRepo, NodeRepo, TenantRepo, TenantScope, TokenRepo};

use super::AuditEntryView;
use crate::auth::Principal;
use crate::{ApiError, AppState};

/// Names by `kind:id` (`tenant:…`, `token:…`, `user:…`, `node:…`).
pub struct Names(HashMap<String, String>);

impl Names {
    /// The names `who` may be told: with every log readable (auditors, platform admins),
    /// every tenant's, token's, user's and node's; with only some tenants' logs, those
    /// tenants' and their tokens' names, and nodes' names where the inventory is theirs to
    /// read (never the names of platform tokens or people, which the user directory keeps
    /// to platform admins).
    pub async fn load(state: &AppState, who: &Principal) -> Result<Self, ApiError> {
        let logs = super::readable_logs(who)?;
        let shown = |tenant: Option<&str>| match (&logs, tenant) {
            (None, _) => true,
            (Some(logs), Some(t)) => logs.iter().any(|l| l == t),
            (Some(_), None) => false,
        };
        let mut names = HashMap::new();
        // Deleted tenants too: their logs stay, under their names.
        for (t, _) in state.store.tenant_tree().await? {
            if shown(Some(&t.id)) {
                names.insert(format!("tenant:{}", t.id), t.name.to_string());
            }
        }
        for t in state.store.list_tokens(&TenantScope::All).await? {
            if shown(t.tenant_id.as_deref()) {
                names.insert(format!("token:{}", t.id), t.name);
            }
        }
        if logs.is_none() {
            for u in state.store.list_users().await? {
                if let Some(name) = u.email.or(u.name) {
                    names.insert(format!("user:{}", u.id), name);
                }
            }
        }
        if who.allows(Action::NodeRead, Resource::Platform)? {
            for n in state.store.list_nodes().await? {
                names.insert(format!("node:{}", n.id), n.name);
            }
        }
        Ok(Self(names))
    }

    fn get(&self, kind: &str, id: &str) -> Option<String> {
        self.0.get(&format!("{kind}:{id}")).cloned()
    }

    /// The name of a target such as `node/<id>/gpu/<uuid>` or `audit-log/<tenant id>`.
    fn target(&self, target: &str) -> Option<String> {
        let mut parts = target.splitn(3, '/');
        let (kind, id) = (parts.next()?, parts.next()?);
        let kind = match kind {
            "audit-log" | "tenant" => "tenant",
            "node" | "token" | "user" => kind,
            _ => return None,
        };
        let name = self.get(kind, id)?;
        Some(match parts.next() {
            Some(rest) => format!("{name}/{rest}"),
            None => name,
        })
    }

    /// Fills in `e`'s names, where its ids name something that still exists.
    pub fn name(&self, e: &mut AuditEntryView) {
        e.log_name = self.get("tenant", &e.log);
        let body: serde_json::Value = e
            .body
            .as_deref()
            .and_then(|b| serde_json::from_str(b).ok())
            .unwrap_or_default();
        if let (Some(kind), Some(id)) =
            (body["actor"]["kind"].as_str(), body["actor"]["id"].as_str())
        {
            e.actor_name = self.get(kind, id);
        }
        e.target_name = body["target"].as_str().and_then(|t| self.target(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_named_by_what_they_start_with() {
        let names = Names(HashMap::from([
            ("tenant:t1".to_owned(), "ml".to_owned()),
            ("node:n1".to_owned(), "gpu-7".to_owned()),
        ]));
        assert_eq!(names.target("audit-log/t1").as_deref(), Some("ml"));
        assert_eq!(
            names.target("node/n1/gpu/GPU-1").as_deref(),
            Some("gpu-7/gpu/GPU-1")
        );
        assert_eq!(names.target("node/gone"), None);
        assert_eq!(names.target("job/t1"), None, "a job is named by its id");
        assert_eq!(names.target("audit-log"), None);
    }
}
