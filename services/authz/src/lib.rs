//! Authorization: every API and portal action is decided by the Cedar policies in
//! `policies/` (`allot.cedarschema`, `allot.cedar`), validated against their schema when
//! loaded. Nothing here knows HTTP or the database: callers describe who acts, on what, in
//! which tenant tree, and get a yes or no. Deny is the default: an action no policy permits
//! is refused.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use allot_domain::{Role, RoleBinding, Tenant};
use cedar_policy::{
    Context, Decision, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicySet, Request,
    RestrictedExpression, Schema, ValidationMode, Validator,
};

/// The schema shipped with Allot.
pub const BUILTIN_SCHEMA: &str = include_str!("../../../policies/allot.cedarschema");
/// The policies shipped with Allot.
pub const BUILTIN_POLICIES: &str = include_str!("../../../policies/allot.cedar");

#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    #[error("the Cedar schema does not parse: {0}")]
    Schema(String),
    #[error("the Cedar policies do not parse: {0}")]
    Policies(String),
    #[error("the Cedar policies do not validate against the schema: {0}")]
    Invalid(String),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("building the authorization request: {0}")]
    Request(String),
}

/// Everything the API and portal can be asked to do. Each is an action of the same name in
/// the Cedar schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    TenantRead,
    QuotaRead,
    JobList,
    JobRead,
    JobLog,
    JobSubmit,
    JobCancel,
    JobResize,
    TokenCreate,
    TokenList,
    TokenRead,
    TokenRevoke,
    AuditRead,
    AuditHolds,
    AuditKey,
    NodeRead,
    TenantCreate,
    TenantDelete,
    NodeOperate,
    AuditHold,
    AuditPrune,
    QuotaWrite,
    BindingCreate,
    BindingList,
    BindingRead,
    BindingRevoke,
    UserList,
    UserRead,
    UserDelete,
    CredentialRead,
    CredentialWrite,
    VolumeWrite,
    TelemetryRead,
    AuditEvidence,
}

impl Action {
    pub const ALL: [Action; 34] = [
        Action::TenantRead,
        Action::QuotaRead,
        Action::JobList,
        Action::JobRead,
        Action::JobLog,
        Action::JobSubmit,
        Action::JobCancel,
        Action::JobResize,
        Action::TokenCreate,
        Action::TokenList,
        Action::TokenRead,
        Action::TokenRevoke,
        Action::AuditRead,
        Action::AuditHolds,
        Action::AuditKey,
        Action::NodeRead,
        Action::TenantCreate,
        Action::TenantDelete,
        Action::NodeOperate,
        Action::AuditHold,
        Action::AuditPrune,
        Action::QuotaWrite,
        Action::BindingCreate,
        Action::BindingList,
        Action::BindingRead,
        Action::BindingRevoke,
        Action::UserList,
        Action::UserRead,
        Action::UserDelete,
        Action::CredentialRead,
        Action::CredentialWrite,
        Action::VolumeWrite,
        Action::TelemetryRead,
        Action::AuditEvidence,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::TenantRead => "tenant.read",
            Action::QuotaRead => "quota.read",
            Action::JobList => "job.list",
            Action::JobRead => "job.read",
            Action::JobLog => "job.log",
            Action::JobSubmit => "job.submit",
            Action::JobCancel => "job.cancel",
            Action::JobResize => "job.resize",
            Action::TokenCreate => "token.create",
            Action::TokenList => "token.list",
            Action::TokenRead => "token.read",
            Action::TokenRevoke => "token.revoke",
            Action::AuditRead => "audit.read",
            Action::AuditHolds => "audit.holds",
            Action::AuditKey => "audit.key",
            Action::NodeRead => "node.read",
            Action::TenantCreate => "tenant.create",
            Action::TenantDelete => "tenant.delete",
            Action::NodeOperate => "node.operate",
            Action::AuditHold => "audit.hold",
            Action::AuditPrune => "audit.prune",
            Action::QuotaWrite => "quota.write",
            Action::BindingCreate => "binding.create",
            Action::BindingList => "binding.list",
            Action::BindingRead => "binding.read",
            Action::BindingRevoke => "binding.revoke",
            Action::UserList => "user.list",
            Action::UserRead => "user.read",
            Action::UserDelete => "user.delete",
            Action::CredentialRead => "credential.read",
            Action::CredentialWrite => "credential.write",
            Action::VolumeWrite => "volume.write",
            Action::TelemetryRead => "telemetry.read",
            Action::AuditEvidence => "audit.evidence",
        }
    }
}

/// What an action is done to. Tenant-owned resources name their tenant, which places them
/// in the tenant tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource<'a> {
    /// The platform as a whole (creating tenants, listing every node, legal holds).
    Platform,
    Tenant(&'a str),
    Job {
        id: &'a str,
        tenant: &'a str,
    },
    /// An API token; platform-wide tokens have no tenant.
    Token {
        id: &'a str,
        tenant: Option<&'a str>,
    },
    /// A role binding; a platform role's has no tenant.
    Binding {
        id: &'a str,
        tenant: Option<&'a str>,
    },
    /// An audit log; the system log has no tenant.
    AuditLog {
        log: &'a str,
        tenant: Option<&'a str>,
    },
    Node(&'a str),
}

impl Resource<'_> {
    /// The tenant the resource belongs to, if any.
    pub fn tenant(&self) -> Option<&str> {
        match *self {
            Resource::Platform | Resource::Node(_) => None,
            Resource::Tenant(t) | Resource::Job { tenant: t, .. } => Some(t),
            Resource::Token { tenant, .. }
            | Resource::Binding { tenant, .. }
            | Resource::AuditLog { tenant, .. } => tenant,
        }
    }
}

/// Whoever asks: an API token or a user, with every role they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub id: String,
    pub bindings: Vec<RoleBinding>,
}

/// The tenants and who nests under whom.
#[derive(Debug, Clone, Default)]
pub struct TenantTree {
    parents: HashMap<String, Option<String>>,
}

impl TenantTree {
    pub fn new(tenants: &[Tenant]) -> Self {
        Self {
            parents: tenants
                .iter()
                .map(|t| (t.id.clone(), t.parent_id.clone()))
                .collect(),
        }
    }

    /// Tenant ids and their parents.
    pub fn from_pairs<I, S>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (S, Option<S>)>,
        S: Into<String>,
    {
        Self {
            parents: pairs
                .into_iter()
                .map(|(t, p)| (t.into(), p.map(Into::into)))
                .collect(),
        }
    }

    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.parents.keys().map(String::as_str)
    }

    pub fn contains(&self, id: &str) -> bool {
        self.parents.contains_key(id)
    }
}

/// The loaded, validated policies.
pub struct Policies {
    schema: Schema,
    set: PolicySet,
    authorizer: cedar_policy::Authorizer,
    /// The files they were read from, by name, as read: what is in force.
    sources: Vec<(String, String)>,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies")
            .field("policies", &self.set.policies().count())
            .finish()
    }
}

impl Policies {
    /// The schema and policies compiled into Allot.
    pub fn builtin() -> Result<Self, AuthzError> {
        Self::parse(BUILTIN_SCHEMA, BUILTIN_POLICIES)
    }

    /// `allot.cedarschema` and every `*.cedar` file in `dir`, for operators who replace the
    /// shipped policies.
    pub fn from_dir(dir: &Path) -> Result<Self, AuthzError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| AuthzError::Read {
                path: p.display().to_string(),
                source,
            })
        };
        let schema = read(&dir.join("allot.cedarschema"))?;
        let entries = std::fs::read_dir(dir).map_err(|source| AuthzError::Read {
            path: dir.display().to_string(),
            source,
        })?;
        let mut files: Vec<_> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "cedar"))
            .collect();
        files.sort();
        let mut sources = vec![("allot.cedarschema".to_owned(), schema)];
        for f in files {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            sources.push((name, read(&f)?));
        }
        Self::from_sources(sources)
    }

    /// Parses and validates (strictly) policies against their schema.
    pub fn parse(schema: &str, policies: &str) -> Result<Self, AuthzError> {
        Self::from_sources(vec![
            ("allot.cedarschema".to_owned(), schema.to_owned()),
            ("allot.cedar".to_owned(), policies.to_owned()),
        ])
    }

    /// The schema (first) and the policy files, by name.
    fn from_sources(sources: Vec<(String, String)>) -> Result<Self, AuthzError> {
        let schema = sources.first().map_or("", |(_, s)| s.as_str());
        let policies: String = sources
            .iter()
            .skip(1)
            .map(|(_, p)| format!("{p}\n"))
            .collect();
        let (schema, _warnings) = Schema::from_cedarschema_str(schema)
            .map_err(|e| AuthzError::Schema(format!("{e:?}")))?;
        let set =
            PolicySet::from_str(&policies).map_err(|e| AuthzError::Policies(e.to_string()))?;
        let result = Validator::new(schema.clone()).validate(&set, ValidationMode::Strict);
        if !result.validation_passed() {
            let errors: Vec<String> = result.validation_errors().map(|e| e.to_string()).collect();
            return Err(AuthzError::Invalid(errors.join("; ")));
        }
        for action in Action::ALL {
            if !schema
                .actions()
                .any(|a| a.id().unescaped() == action.name())
            {
                return Err(AuthzError::Invalid(format!(
                    "the schema lacks the action `{}`",
                    action.name()
                )));
            }
        }
        Ok(Self {
            schema,
            set,
            authorizer: cedar_policy::Authorizer::new(),
            sources,
        })
    }

    /// The files in force, by name (`allot.cedarschema`, then each `*.cedar`), as read.
    pub fn sources(&self) -> &[(String, String)] {
        &self.sources
    }

    /// Builds what every decision for `subject` within `tree` shares.
    pub fn session(
        self: &Arc<Self>,
        subject: &Subject,
        tree: &TenantTree,
    ) -> Result<Session, AuthzError> {
        let err = |e: &dyn std::fmt::Display| AuthzError::Request(e.to_string());
        let mut entities = Vec::with_capacity(tree.parents.len() + 1);
        for (id, parent) in &tree.parents {
            let parents: HashSet<EntityUid> = parent.iter().map(|p| uid(TENANT, p)).collect();
            entities.push(Entity::new_no_attrs(uid(TENANT, id), parents));
        }
        let tenants_with = |roles: &[Role]| {
            RestrictedExpression::new_set(
                subject
                    .bindings
                    .iter()
                    .filter(|b| roles.contains(&b.role))
                    .filter_map(|b| b.tenant_id.as_deref())
                    .filter(|t| tree.contains(t))
                    .map(|t| RestrictedExpression::new_entity_uid(uid(TENANT, t))),
            )
        };
        let platform_roles: HashSet<EntityUid> = subject
            .bindings
            .iter()
            .filter(|b| b.tenant_id.is_none() && b.role.is_platform())
            .map(|b| uid(ROLE, role_entity(b.role)))
            .collect();
        let attrs = HashMap::from([
            ("viewer_of".to_owned(), tenants_with(&[Role::Viewer])),
            ("member_of".to_owned(), tenants_with(&[Role::Member])),
            ("admin_of".to_owned(), tenants_with(&[Role::TenantAdmin])),
        ]);
        let principal = uid(PRINCIPAL, &subject.id);
        entities.push(Entity::new(principal.clone(), attrs, platform_roles).map_err(|e| err(&e))?);
        let entities =
            Entities::from_entities(entities, Some(&self.schema)).map_err(|e| err(&e))?;
        Ok(Session {
            policies: self.clone(),
            principal,
            entities,
        })
    }
}

const TENANT: &str = "Allot::Tenant";
const PRINCIPAL: &str = "Allot::Principal";
const ROLE: &str = "Allot::Role";

fn role_entity(role: Role) -> &'static str {
    match role {
        Role::Admin => "platform-admin",
        other => other.as_str(),
    }
}

fn uid(kind: &str, id: &str) -> EntityUid {
    // The type names are constants of this file, checked by the tests.
    #[allow(clippy::expect_used)]
    let kind = EntityTypeName::from_str(kind).expect("a valid entity type name");
    EntityUid::from_type_name_and_id(kind, EntityId::new(id))
}

/// One subject's decisions against one tenant tree.
pub struct Session {
    policies: Arc<Policies>,
    principal: EntityUid,
    entities: Entities,
}

impl Session {
    /// Whether `action` on `resource` is permitted. `granted` is the role a token or
    /// binding being created would carry (for `token.create` and `binding.create`).
    pub fn allows(
        &self,
        action: Action,
        resource: Resource<'_>,
        granted: Option<Role>,
    ) -> Result<bool, AuthzError> {
        let err = |e: &dyn std::fmt::Display| AuthzError::Request(e.to_string());
        let (resource_uid, extra) = self.resource_entity(resource);
        let entities = match extra {
            Some(e) => self
                .entities
                .clone()
                .add_entities([e], Some(&self.policies.schema))
                .map_err(|e| err(&e))?,
            None => self.entities.clone(),
        };
        let context = if matches!(action, Action::TokenCreate | Action::BindingCreate) {
            let role = granted.map_or("", Role::as_str);
            Context::from_pairs([(
                "role".to_owned(),
                RestrictedExpression::new_string(role.to_owned()),
            )])
            .map_err(|e| err(&e))?
        } else {
            Context::empty()
        };
        let action_uid = uid("Allot::Action", action.name());
        let request = Request::new(
            self.principal.clone(),
            action_uid,
            resource_uid,
            context,
            Some(&self.policies.schema),
        )
        .map_err(|e| err(&e))?;
        let response =
            self.policies
                .authorizer
                .is_authorized(&request, &self.policies.set, &entities);
        Ok(response.decision() == Decision::Allow)
    }

    fn resource_entity(&self, resource: Resource<'_>) -> (EntityUid, Option<Entity>) {
        let child = |kind: &str, id: &str, tenant: Option<&str>| {
            let me = uid(kind, id);
            let parents = tenant.iter().map(|t| uid(TENANT, t)).collect();
            (me.clone(), Some(Entity::new_no_attrs(me, parents)))
        };
        match resource {
            Resource::Platform => (uid("Allot::Platform", "platform"), None),
            Resource::Tenant(t) => (uid(TENANT, t), None),
            Resource::Node(n) => (uid("Allot::Node", n), None),
            Resource::Job { id, tenant } => child("Allot::Job", id, Some(tenant)),
            Resource::Token { id, tenant } => child("Allot::Token", id, tenant),
            Resource::Binding { id, tenant } => child("Allot::Binding", id, tenant),
            Resource::AuditLog { log, tenant } => child("Allot::AuditLog", log, tenant),
        }
    }
}

#[cfg(test)]
mod tests;
