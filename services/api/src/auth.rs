//! Who is calling (an API token in `Authorization: Bearer …`), and whether the Cedar
//! policies let them do what they ask.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::http::{Method, header};
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};
use allot_authz::{Action, Policies, Resource, Session, Subject, TenantTree};
use allot_domain::{Actor, ActorKind, AuditContext, Role, RoleBinding};
use allot_store::{IdentityRepo, SessionRepo, TenantRepo, TenantScope};

use crate::AppState;
use crate::jwt::JwtError;
use crate::problem::ApiError;
use crate::secret;

/// The id of a presented token that exists but is revoked or expired.
#[derive(Debug, Clone)]
pub struct UnusableToken(pub String);

/// The tenants as one read of them: the tree authorization decides in (deleted tenants
/// too) and those that exist now.
#[derive(Clone)]
pub struct Tenants {
    tree: Arc<TenantTree>,
    live: Arc<Vec<allot_domain::Tenant>>,
    /// Decision sessions on these tenants, by caller and grants (all a session is built
    /// from besides the tenants): built on a caller's first decision and reused by its
    /// next requests until a tenant changes (which makes new `Tenants`; API tokens' requests
    /// reuse `Tenants` while the version holds). At most [`MAX_SESSIONS`], then started
    /// afresh.
    sessions: Arc<std::sync::Mutex<HashMap<String, SessionSlot>>>,
}

/// A decision session, built by the first decision that needs it.
type SessionSlot = Arc<std::sync::OnceLock<Session>>;

/// How many tokens' sessions one `Tenants` keeps.
const MAX_SESSIONS: usize = 4096;

impl Tenants {
    fn new(all: Vec<(allot_domain::Tenant, bool)>) -> Self {
        let tree = Arc::new(TenantTree::new(
            &all.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>(),
        ));
        let live = Arc::new(
            all.into_iter()
                .filter(|(_, deleted)| !deleted)
                .map(|(t, _)| t)
                .collect(),
        );
        Self {
            tree,
            live,
            sessions: Arc::default(),
        }
    }

    /// The session slot of caller `id` with `bindings` on these tenants.
    fn session(&self, id: &str, bindings: &[RoleBinding]) -> SessionSlot {
        let mut key = id.to_owned();
        for b in bindings {
            key.push('\n');
            key.push_str(b.role.as_str());
            key.push('@');
            key.push_str(b.tenant_id.as_deref().unwrap_or_default());
        }
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if sessions.len() >= MAX_SESSIONS && !sessions.contains_key(&key) {
            sessions.clear();
        }
        sessions.entry(key).or_default().clone()
    }
}

/// The tenants as this replica last read them, with the tenants' version they were read
/// at. A request authenticated by an API token reads the version with the token, in the
/// same statement, and takes the remembered tenants only when the versions are equal: a
/// change to any tenant (made through any replica) moves the version in its own
/// transaction, so a request never decides on tenants older than its own token read.
#[derive(Default)]
pub struct TenantTrees {
    current: tokio::sync::Mutex<Option<(i64, Tenants)>>,
}

impl TenantTrees {
    /// The tenants at `version` (or newer).
    pub async fn at(&self, store: &allot_store::Store, version: i64) -> Result<Tenants, ApiError> {
        let mut current = self.current.lock().await;
        if let Some((v, tenants)) = current.as_ref()
            && *v == version
        {
            return Ok(tenants.clone());
        }
        let (read_at, all) = store.versioned_tenant_tree().await?;
        let tenants = Tenants::new(all);
        *current = Some((read_at, tenants.clone()));
        Ok(tenants)
    }
}

/// An authenticated caller, with the tenant tree their requests are decided against.
#[derive(Clone)]
pub struct Principal {
    pub kind: ActorKind,
    /// The token's or user's id.
    pub id: String,
    /// Who it is to people: the token's name, or the user's email (else name, else subject).
    pub name: String,
    /// Every role the caller holds.
    pub bindings: Vec<RoleBinding>,
    /// `api-token`, …: how the caller proved who they are.
    pub auth_method: &'static str,
    /// The client's address.
    pub source: Option<String>,
    /// The caller's `X-Request-Id` when it is sensible, else one made up for this request.
    pub request_id: String,
    policies: Arc<Policies>,
    tree: Arc<TenantTree>,
    /// The tenants that exist, as read to authenticate this request: what the request
    /// decides on names and limits from, one snapshot.
    live: Arc<Vec<allot_domain::Tenant>>,
    session: SessionSlot,
}

impl std::fmt::Debug for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Principal")
            .field("kind", &self.kind)
            .field("id", &self.id)
            .field("bindings", &self.bindings)
            .finish_non_exhaustive()
    }
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
                kind: self.kind,
                id: self.id.clone(),
                tenant_id: self.home_tenant().map(str::to_owned),
                auth_method: self.auth_method.to_owned(),
                source: self.source.clone(),
            },
            request_id: Some(self.request_id.clone()),
        }
    }

    /// The tenant requests act in when they name none: the caller's only tenant, if it has
    /// exactly one.
    /// The tenants that exist, as read to authenticate this request.
    pub fn live_tenants(&self) -> &[allot_domain::Tenant] {
        &self.live
    }

    /// A tenant's name as this request read the tenants (its id when it is gone).
    pub fn tenant_name(&self, id: &str) -> String {
        self.live
            .iter()
            .find(|t| t.id == id)
            .map_or_else(|| id.to_owned(), |t| t.name.to_string())
    }

    pub fn home_tenant(&self) -> Option<&str> {
        let mut tenants = self.bindings.iter().filter_map(|b| b.tenant_id.as_deref());
        let first = tenants.next()?;
        // Several roles in that one tenant still make it the only one.
        tenants.all(|t| t == first).then_some(first)
    }

    /// The roles held, for messages: `member@<tenant id>`, `platform-admin`.
    fn roles(&self) -> String {
        let roles: Vec<String> = self
            .bindings
            .iter()
            .map(|b| match &b.tenant_id {
                Some(t) => format!("{}@{}", b.role, self.tenant_name(t)),
                None => b.role.to_string(),
            })
            .collect();
        if roles.is_empty() {
            "no role".to_owned()
        } else {
            roles.join(", ")
        }
    }

    /// What every decision for this caller shares, built on the first decision of the
    /// request and kept for the rest.
    fn session(&self) -> Result<&Session, ApiError> {
        if let Some(session) = self.session.get() {
            return Ok(session);
        }
        let subject = Subject {
            id: self.id.clone(),
            bindings: self.bindings.clone(),
        };
        let built = self
            .policies
            .session(&subject, &self.tree)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok(self.session.get_or_init(|| built))
    }

    /// Whether the policies permit `action` on `resource`.
    pub fn allows(&self, action: Action, resource: Resource<'_>) -> Result<bool, ApiError> {
        self.session()?
            .allows(action, resource, None)
            .map_err(|e| ApiError::Internal(e.to_string()))
    }

    /// Whether the caller can see `tenant_id` at all.
    pub fn can_see(&self, tenant_id: &str) -> Result<bool, ApiError> {
        self.allows(Action::TenantRead, Resource::Tenant(tenant_id))
    }

    /// Requires the policies to permit `action` on `resource`. A resource of a tenant the
    /// caller cannot see is reported missing (404, via `what`), so its existence does not
    /// leak; otherwise the refusal is a 403.
    pub fn authorize(
        &self,
        action: Action,
        resource: Resource<'_>,
        what: &str,
    ) -> Result<(), ApiError> {
        self.authorize_granting(action, resource, None, what)
    }

    /// [`Self::authorize`] for `token.create`, which names the role being granted.
    pub fn authorize_granting(
        &self,
        action: Action,
        resource: Resource<'_>,
        granted: Option<Role>,
        what: &str,
    ) -> Result<(), ApiError> {
        let session = self.session()?;
        let decide = |action, resource| {
            session
                .allows(action, resource, granted)
                .map_err(|e| ApiError::Internal(e.to_string()))
        };
        if decide(action, resource)? {
            return Ok(());
        }
        // Whether the caller may know the resource exists: those who see its tenant do, and
        // so do those who read its audit log (auditors read every tenant's).
        if let Some(t) = resource.tenant() {
            let visible = decide(Action::TenantRead, Resource::Tenant(t))?
                || (matches!(resource, Resource::AuditLog { .. })
                    && decide(Action::AuditRead, resource)?);
            if !visible {
                return Err(ApiError::NotFound(format!("{what} does not exist")));
            }
        }
        let action = action.name();
        Err(ApiError::Forbidden(match granted {
            Some(role) => format!(
                "the policies do not permit `{action}` granting the {role} role to a caller with {}",
                self.roles()
            ),
            None => format!(
                "the policies do not permit `{action}` on {what} to a caller with {}",
                self.roles()
            ),
        }))
    }

    /// The tenants on which the policies permit `action` (an action on tenants).
    pub fn permitted_tenants(&self, action: Action) -> Result<Vec<String>, ApiError> {
        self.permitted_in_tenants(action, |t| Resource::Tenant(t))
    }

    /// The tenants `t` for which the policies permit `action` on `resource(t)`.
    pub fn permitted_in_tenants(
        &self,
        action: Action,
        resource: for<'t> fn(&'t str) -> Resource<'t>,
    ) -> Result<Vec<String>, ApiError> {
        let session = self.session()?;
        let mut out = Vec::new();
        for t in self.tree.ids() {
            if session
                .allows(action, resource(t), None)
                .map_err(|e| ApiError::Internal(e.to_string()))?
            {
                out.push(t.to_owned());
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// How many tenants there are.
    pub fn tenant_count(&self) -> usize {
        self.tree.ids().count()
    }

    /// The tenants where the caller may list with `action`; refused (403) when that is none.
    pub fn listable(&self, action: Action, what: &str) -> Result<Vec<String>, ApiError> {
        let tenants = self.permitted_tenants(action)?;
        // A tenant outside the tree is reached by platform-wide grants only: whoever is
        // permitted there may list, even while there is nothing to list.
        const NOWHERE: &str = "\u{0}no-such-tenant";
        if tenants.is_empty() && !self.allows(action, Resource::Tenant(NOWHERE))? {
            return Err(ApiError::Forbidden(format!(
                "the policies do not permit `{}` ({what}) in any tenant to a caller with {}",
                action.name(),
                self.roles()
            )));
        }
        Ok(tenants)
    }

    /// [`Self::listable`] as a store scope.
    pub fn scope(&self, action: Action, what: &str) -> Result<TenantScope, ApiError> {
        self.listable(action, what).map(TenantScope::Tenants)
    }
}

fn unauthenticated(message: &str) -> ApiError {
    ApiError::Unauthenticated(message.to_owned())
}

impl FromRequest for Principal {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let http_req = req.clone();
        let source = crate::client::address(req);
        let request_id = request_id(req);
        let header = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.to_str().map(str::to_owned));
        let session_cookie = req
            .cookie(crate::signin::SESSION_COOKIE)
            .map(|c| c.value().to_owned());
        Box::pin(async move {
            let state =
                state.ok_or_else(|| ApiError::Internal("application state missing".into()))?;
            let from = source.clone().unwrap_or_else(|| "unknown".to_owned());
            let caller = Caller {
                state: &state,
                req: &http_req,
                source,
                request_id,
            };
            let value = match (header, session_cookie) {
                (Some(v), _) => v,
                (None, Some(session)) => {
                    let result = caller.session(&session).await;
                    return finish(&state, &http_req, &from, result).await;
                }
                // Not an attempt at all: not counted.
                (None, None) => {
                    return Err(unauthenticated(
                        "sign in, or send an API token or an identity provider's JWT as `Authorization: Bearer <token>`",
                    ));
                }
            };
            let result = match value {
                Err(_) => Err(unauthenticated(
                    "the Authorization header is not valid text",
                )),
                Ok(value) => match value
                    .strip_prefix("Bearer ")
                    .or_else(|| value.strip_prefix("bearer "))
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                {
                    None => Err(unauthenticated(
                        "the Authorization header must be `Bearer <token>`",
                    )),
                    Some(token) if token.starts_with(crate::TOKEN_PREFIX) => {
                        caller.api_token(token).await
                    }
                    Some(token) => caller.jwt(token).await,
                },
            };
            finish(&state, &http_req, &from, result).await
        })
    }
}

/// Remembers the principal for the denial audit (which runs after the handler), and counts
/// a failed authentication against its client (429 past the limit).
async fn finish(
    state: &AppState,
    req: &HttpRequest,
    from: &str,
    result: Result<Principal, ApiError>,
) -> Result<Principal, ApiError> {
    match result {
        Ok(principal) => {
            req.extensions_mut().insert(principal.clone());
            Ok(principal)
        }
        Err(e @ ApiError::Unauthenticated(_)) => match state.auth_failures.failed(from).await {
            Some(retry_after_secs) => Err(ApiError::TooManyAttempts { retry_after_secs }),
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// A user as people know them: the email the provider vouched for, else the name, else
/// the subject.
fn user_name(user: &allot_domain::User) -> String {
    user.email
        .clone()
        .or_else(|| user.name.clone())
        .unwrap_or_else(|| user.subject.clone())
}

/// One request's authentication.
struct Caller<'a> {
    state: &'a AppState,
    req: &'a HttpRequest,
    source: Option<String>,
    request_id: String,
}

impl Caller<'_> {
    #[allow(clippy::too_many_arguments)]
    fn principal(
        self,
        kind: ActorKind,
        id: String,
        name: String,
        bindings: Vec<RoleBinding>,
        auth_method: &'static str,
        tenants: &Tenants,
    ) -> Principal {
        let session = tenants.session(&id, &bindings);
        Principal {
            kind,
            id,
            name,
            bindings,
            auth_method,
            source: self.source,
            request_id: self.request_id,
            policies: self.state.policies.clone(),
            tree: tenants.tree.clone(),
            live: tenants.live.clone(),
            session,
        }
    }

    /// One of Allot's own API tokens.
    async fn api_token(self, token: &str) -> Result<Principal, ApiError> {
        let found = self.state.tokens.use_token(&secret::hash(token)).await?;
        let now = self.state.store.clock().now();
        match found {
            Some((t, version)) if t.is_usable(now) => {
                let tenants = self
                    .state
                    .tenant_trees
                    .at(&self.state.store, version)
                    .await?;
                let binding = RoleBinding {
                    role: t.role,
                    tenant_id: t.tenant_id,
                };
                Ok(self.principal(
                    ActorKind::Token,
                    t.id,
                    t.name,
                    vec![binding],
                    "api-token",
                    &tenants,
                ))
            }
            Some((t, _)) => {
                // Named in the denial audit: a known token that no longer works.
                self.req
                    .extensions_mut()
                    .insert(UnusableToken(t.id.clone()));
                Err(unauthenticated(if t.revoked_at.is_some() {
                    "the token has been revoked"
                } else {
                    "the token has expired"
                }))
            }
            None => Err(unauthenticated("the token is not valid")),
        }
    }

    /// The roles a user holds: the configured claim rules, and the bindings granted through
    /// the API to them or to their claims.
    /// The tenant tree authorization decides in (deleted tenants too, where their jobs
    /// and logs stay), and the tenants that exist now (which claims may grant roles in).
    async fn tenants(&self) -> Result<Tenants, ApiError> {
        Ok(Tenants::new(self.state.store.tenant_tree().await?))
    }

    async fn user_roles(
        &self,
        user_id: &str,
        claims: &crate::jwt::VerifiedToken,
        tenants: &[allot_domain::Tenant],
    ) -> Result<Vec<RoleBinding>, ApiError> {
        let ids: HashMap<String, String> = tenants
            .iter()
            .map(|t| (t.name.to_string(), t.id.clone()))
            .collect();
        let rules = self
            .state
            .jwt
            .as_ref()
            .map(|j| j.config().claim_roles.clone())
            .unwrap_or_default();
        let mut bindings = claims.bindings(&rules, &ids);
        for b in self
            .state
            .store
            .roles_of(user_id, &claims.claim_pairs())
            .await?
        {
            if !bindings.contains(&b) {
                bindings.push(b);
            }
        }
        Ok(bindings)
    }

    /// A browser session from web sign-in. Changes need its CSRF token.
    async fn session(self, session_id: &str) -> Result<Principal, ApiError> {
        let id_hash = secret::hash(session_id);
        let Some(session) = self.state.store.session(&id_hash).await? else {
            return Err(unauthenticated("the session is not valid; sign in again"));
        };
        let now = self.state.store.clock().now();
        let idle = chrono::Duration::from_std(self.state.sessions.idle)
            .unwrap_or(chrono::Duration::hours(1));
        if session.ended_at.is_some() {
            return Err(unauthenticated("the session has ended; sign in again"));
        }
        if now >= session.expires_at || now - session.last_seen_at >= idle {
            return Err(unauthenticated("the session has expired; sign in again"));
        }
        let user = self.state.store.user(&session.user_id).await?;
        if user.deleted_at.is_some() {
            return Err(unauthenticated("the user has been removed from Allot"));
        }
        let safe = matches!(
            *self.req.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        );
        if !safe {
            crate::signin::same_origin(self.req)?;
            let sent = self
                .req
                .headers()
                .get(crate::signin::CSRF_HEADER)
                .and_then(|v| v.to_str().ok());
            // Compared as hashes, so the time taken says nothing about the token.
            let matches =
                sent.is_some_and(|s| secret::hash(s) == secret::hash(&session.csrf_token));
            if !matches {
                return Err(ApiError::Forbidden(format!(
                    "a change made with a session cookie needs the session's CSRF token in `{}`",
                    crate::signin::CSRF_HEADER
                )));
            }
        }
        self.state.store.touch_session(&id_hash, now).await?;
        self.req
            .extensions_mut()
            .insert(crate::signin::SessionAuth {
                id_hash,
                csrf_token: session.csrf_token.clone(),
            });
        let claims = crate::jwt::VerifiedToken {
            subject: user.subject.clone(),
            claims: session.claims,
            method: "session",
        };
        let tenants = self.tenants().await?;
        let bindings = self.user_roles(&user.id, &claims, &tenants.live).await?;
        let name = user_name(&user);
        Ok(self.principal(
            ActorKind::User,
            user.id,
            name,
            bindings,
            "session",
            &tenants,
        ))
    }

    /// A JWT from the configured OpenID Connect provider.
    async fn jwt(self, token: &str) -> Result<Principal, ApiError> {
        let Some(verifier) = self.state.jwt.clone() else {
            return Err(unauthenticated("the token is not valid"));
        };
        let verified = match verifier.verify(token).await {
            Ok(v) => v,
            Err(JwtError::Provider(detail)) => {
                tracing::warn!(%detail, "cannot fetch the identity provider's keys");
                return Err(ApiError::Unavailable(
                    "the identity provider's keys cannot be fetched; try again shortly".into(),
                ));
            }
            Err(e) => return Err(unauthenticated(&e.to_string())),
        };
        let user = self
            .state
            .store
            .sign_in(crate::jwt::sign_in(
                &verifier.config().issuer,
                verified.subject.clone(),
                &verified.claims,
            ))
            .await?;
        if user.deleted_at.is_some() {
            return Err(unauthenticated("the user has been removed from Allot"));
        }
        let tenants = self.tenants().await?;
        let bindings = self.user_roles(&user.id, &verified, &tenants.live).await?;
        let name = user_name(&user);
        Ok(self.principal(
            ActorKind::User,
            user.id,
            name,
            bindings,
            verified.method,
            &tenants,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(bindings: Vec<RoleBinding>) -> Principal {
        Principal {
            kind: ActorKind::User,
            id: "u1".into(),
            name: "u1@example.com".into(),
            bindings,
            auth_method: "session",
            source: None,
            request_id: "r1".into(),
            policies: Arc::new(Policies::builtin().expect("policies")),
            tree: Arc::new(TenantTree::from_pairs([("t1", None), ("t2", None)])),
            live: Arc::new(Vec::new()),
            session: Arc::default(),
        }
    }

    #[test]
    fn the_home_tenant_is_the_one_tenant_bound() {
        let one = principal(vec![
            RoleBinding::tenant(Role::Member, "t1"),
            RoleBinding::tenant(Role::Viewer, "t1"),
            RoleBinding::platform(Role::Auditor),
        ]);
        assert_eq!(one.home_tenant(), Some("t1"), "several roles in one tenant");
        let two = principal(vec![
            RoleBinding::tenant(Role::Member, "t1"),
            RoleBinding::tenant(Role::Member, "t2"),
        ]);
        assert_eq!(two.home_tenant(), None);
        assert_eq!(principal(vec![]).home_tenant(), None);
    }

    #[test]
    fn a_refusal_names_the_action_and_the_callers_roles() {
        let viewer = principal(vec![RoleBinding::tenant(Role::Viewer, "t1")]);
        let e = viewer
            .authorize(Action::JobSubmit, Resource::Tenant("t1"), "tenant t1")
            .expect_err("viewers do not submit");
        assert!(matches!(e, ApiError::Forbidden(_)), "{e}");
        assert!(e.to_string().contains("job.submit") && e.to_string().contains("viewer@t1"));
        let e = viewer
            .authorize(Action::JobSubmit, Resource::Tenant("t2"), "tenant t2")
            .expect_err("another tenant");
        assert!(
            matches!(e, ApiError::NotFound(_)),
            "unseen tenants do not exist: {e}"
        );
    }
}
