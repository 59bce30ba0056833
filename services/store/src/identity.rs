//! Users (created at first sign-in, deleted by admins) and the role bindings granted through
//! the API. Every change is audited in the same transaction.

use allot_domain::{
    AuditContext, AuditEvent, BindingSubject, Role, RoleBinding, SYSTEM_LOG, StoredBinding, User,
};
use chrono::Duration;
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, Condition, EntityTrait, QueryFilter, QueryOrder};

use crate::audit::record;
use crate::convert::parse;
use crate::entities::{role_bindings, users};
use crate::{Store, StoreError, TenantScope, new_id};

/// How stale `last_seen_at` may get before a sign-in writes it again.
const SEEN_GRANULARITY: Duration = Duration::minutes(1);

/// What the provider says about a signed-in user.
#[derive(Debug, Clone)]
pub struct SignIn {
    pub issuer: String,
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Clone)]
pub struct NewBinding {
    pub subject: BindingSubject,
    pub role: Role,
    pub tenant_id: Option<String>,
}

pub trait IdentityRepo {
    /// The user the provider vouches for, created on first sight (audited as `user.create`)
    /// and its email, name and last-seen time kept current. A deleted user is returned as
    /// such, never revived.
    fn sign_in(&self, s: SignIn) -> impl Future<Output = Result<User, StoreError>> + Send;
    fn user(&self, id: &str) -> impl Future<Output = Result<User, StoreError>> + Send;
    fn list_users(&self) -> impl Future<Output = Result<Vec<User>, StoreError>> + Send;
    /// Marks the user deleted and revokes every binding granted to them.
    fn delete_user(
        &self,
        ctx: &AuditContext,
        id: &str,
    ) -> impl Future<Output = Result<User, StoreError>> + Send;
    fn create_binding(
        &self,
        ctx: &AuditContext,
        b: NewBinding,
    ) -> impl Future<Output = Result<StoredBinding, StoreError>> + Send;
    /// The bindings in `scope` (a platform binding is in `All` only), revoked ones included.
    fn list_bindings(
        &self,
        scope: &TenantScope,
    ) -> impl Future<Output = Result<Vec<StoredBinding>, StoreError>> + Send;
    fn binding(
        &self,
        scope: &TenantScope,
        id: &str,
    ) -> impl Future<Output = Result<StoredBinding, StoreError>> + Send;
    fn revoke_binding(
        &self,
        ctx: &AuditContext,
        scope: &TenantScope,
        id: &str,
    ) -> impl Future<Output = Result<StoredBinding, StoreError>> + Send;
    /// The roles active bindings grant `user_id`, or any of `claims` (claim, value).
    fn roles_of(
        &self,
        user_id: &str,
        claims: &[(String, String)],
    ) -> impl Future<Output = Result<Vec<RoleBinding>, StoreError>> + Send;
}

fn user_of(m: users::Model) -> User {
    User {
        id: m.id,
        issuer: m.issuer,
        subject: m.subject,
        email: m.email,
        name: m.name,
        created_at: m.created_at,
        last_seen_at: m.last_seen_at,
        deleted_at: m.deleted_at,
    }
}

fn binding_of(m: role_bindings::Model) -> Result<StoredBinding, StoreError> {
    let subject = match (m.user_id, m.claim, m.claim_value) {
        (Some(user_id), None, _) => BindingSubject::User { user_id },
        (None, Some(claim), Some(value)) => BindingSubject::Claim { claim, value },
        _ => {
            return Err(StoreError::Corrupt(format!(
                "role binding {} has no single subject",
                m.id
            )));
        }
    };
    Ok(StoredBinding {
        role: parse("role", &m.role)?,
        id: m.id,
        subject,
        tenant_id: m.tenant_id,
        created_at: m.created_at,
        revoked_at: m.revoked_at,
    })
}

/// The log a binding's changes go to: its tenant's, or the system log.
fn log_of(b: &StoredBinding) -> String {
    b.tenant_id.clone().unwrap_or_else(|| SYSTEM_LOG.to_owned())
}

async fn find_user<C: sea_orm::ConnectionTrait>(
    db: &C,
    issuer: &str,
    subject: &str,
) -> Result<Option<users::Model>, StoreError> {
    Ok(users::Entity::find()
        .filter(users::Column::Issuer.eq(issuer))
        .filter(users::Column::Subject.eq(subject))
        .one(db)
        .await?)
}

impl IdentityRepo for Store {
    async fn sign_in(&self, s: SignIn) -> Result<User, StoreError> {
        let now = self.clock.now();
        if let Some(m) = find_user(&self.db, &s.issuer, &s.subject).await? {
            let changed = m.email != s.email || m.name != s.name;
            if m.deleted_at.is_none() && (changed || now - m.last_seen_at >= SEEN_GRANULARITY) {
                users::Entity::update(users::ActiveModel {
                    id: Set(m.id.clone()),
                    email: Set(s.email.clone()),
                    name: Set(s.name.clone()),
                    last_seen_at: Set(now),
                    ..Default::default()
                })
                .exec(&self.db)
                .await?;
                return Ok(User {
                    email: s.email,
                    name: s.name,
                    last_seen_at: now,
                    ..user_of(m)
                });
            }
            return Ok(user_of(m));
        }
        let row = users::ActiveModel {
            id: Set(new_id(self.clock.as_ref())),
            issuer: Set(s.issuer.clone()),
            subject: Set(s.subject.clone()),
            email: Set(s.email.clone()),
            name: Set(s.name.clone()),
            created_at: Set(now),
            last_seen_at: Set(now),
            deleted_at: Set(None),
        };
        let txn = self.begin().await?;
        let user = match users::Entity::insert(row).exec_with_returning(&txn).await {
            Ok(m) => user_of(m),
            Err(e) => {
                // Two first requests at once: the other one created the user.
                drop(txn);
                return match StoreError::from(e) {
                    StoreError::Conflict(_) => find_user(&self.db, &s.issuer, &s.subject)
                        .await?
                        .map(user_of)
                        .ok_or_else(|| StoreError::NotFound("user".into())),
                    other => Err(other),
                };
            }
        };
        let ctx = AuditContext {
            actor: allot_domain::Actor {
                kind: allot_domain::ActorKind::User,
                id: user.id.clone(),
                tenant_id: None,
                auth_method: "oidc".to_owned(),
                source: None,
            },
            request_id: None,
        };
        let event = AuditEvent::success(SYSTEM_LOG, "user.create", format!("user/{}", user.id))
            .after(&user);
        record(&txn, self, &ctx, event).await?;
        self.commit(txn).await?;
        Ok(user)
    }

    async fn user(&self, id: &str) -> Result<User, StoreError> {
        users::Entity::find_by_id(id.to_owned())
            .one(&self.db)
            .await?
            .map(user_of)
            .ok_or_else(|| StoreError::NotFound(format!("user {id}")))
    }

    async fn list_users(&self) -> Result<Vec<User>, StoreError> {
        Ok(users::Entity::find()
            .order_by_asc(users::Column::Id)
            .all(&self.db)
            .await?
            .into_iter()
            .map(user_of)
            .collect())
    }

    async fn delete_user(&self, ctx: &AuditContext, id: &str) -> Result<User, StoreError> {
        let before = self.user(id).await?;
        if before.deleted_at.is_some() {
            return Ok(before);
        }
        let now = self.clock.now();
        let txn = self.begin().await?;
        users::Entity::update(users::ActiveModel {
            id: Set(id.to_owned()),
            deleted_at: Set(Some(now)),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
        role_bindings::Entity::update_many()
            .col_expr(role_bindings::Column::RevokedAt, Expr::value(now))
            .filter(role_bindings::Column::UserId.eq(id))
            .filter(role_bindings::Column::RevokedAt.is_null())
            .exec(&txn)
            .await?;
        let after = User {
            deleted_at: Some(now),
            ..before.clone()
        };
        let event = AuditEvent::success(SYSTEM_LOG, "user.delete", format!("user/{id}"))
            .before(&before)
            .after(&after);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(after)
    }

    async fn create_binding(
        &self,
        ctx: &AuditContext,
        b: NewBinding,
    ) -> Result<StoredBinding, StoreError> {
        let (user_id, claim, claim_value) = match b.subject {
            BindingSubject::User { user_id } => (Some(user_id), None, None),
            BindingSubject::Claim { claim, value } => (None, Some(claim), Some(value)),
        };
        let row = role_bindings::ActiveModel {
            id: Set(new_id(self.clock.as_ref())),
            user_id: Set(user_id),
            claim: Set(claim),
            claim_value: Set(claim_value),
            role: Set(b.role.as_str().to_owned()),
            tenant_id: Set(b.tenant_id),
            created_at: Set(self.clock.now()),
            revoked_at: Set(None),
        };
        let txn = self.begin().await?;
        let binding = binding_of(
            role_bindings::Entity::insert(row)
                .exec_with_returning(&txn)
                .await?,
        )?;
        let event = AuditEvent::success(
            log_of(&binding),
            "binding.create",
            format!("role-binding/{}", binding.id),
        )
        .after(&binding);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(binding)
    }

    async fn list_bindings(&self, scope: &TenantScope) -> Result<Vec<StoredBinding>, StoreError> {
        role_bindings::Entity::find()
            .filter(scope.condition(role_bindings::Column::TenantId))
            .order_by_asc(role_bindings::Column::Id)
            .all(&self.db)
            .await?
            .into_iter()
            .map(binding_of)
            .collect()
    }

    async fn binding(&self, scope: &TenantScope, id: &str) -> Result<StoredBinding, StoreError> {
        let missing = || StoreError::NotFound(format!("role binding {id}"));
        let binding = role_bindings::Entity::find_by_id(id.to_owned())
            .one(&self.db)
            .await?
            .ok_or_else(missing)
            .and_then(binding_of)?;
        if !scope.includes(binding.tenant_id.as_deref()) {
            return Err(missing());
        }
        Ok(binding)
    }

    async fn revoke_binding(
        &self,
        ctx: &AuditContext,
        scope: &TenantScope,
        id: &str,
    ) -> Result<StoredBinding, StoreError> {
        let before = self.binding(scope, id).await?;
        if before.revoked_at.is_some() {
            return Ok(before);
        }
        let now = self.clock.now();
        let txn = self.begin().await?;
        role_bindings::Entity::update(role_bindings::ActiveModel {
            id: Set(id.to_owned()),
            revoked_at: Set(Some(now)),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
        let after = StoredBinding {
            revoked_at: Some(now),
            ..before.clone()
        };
        let event = AuditEvent::success(
            log_of(&after),
            "binding.revoke",
            format!("role-binding/{id}"),
        )
        .before(&before)
        .after(&after);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(after)
    }

    async fn roles_of(
        &self,
        user_id: &str,
        claims: &[(String, String)],
    ) -> Result<Vec<RoleBinding>, StoreError> {
        let rows = role_bindings::Entity::find()
            .filter(role_bindings::Column::RevokedAt.is_null())
            .filter(
                Condition::any()
                    .add(role_bindings::Column::UserId.eq(user_id))
                    .add(role_bindings::Column::Claim.is_not_null()),
            )
            .all(&self.db)
            .await?;
        let mut out = Vec::new();
        for b in rows.into_iter().map(binding_of) {
            let b = b?;
            let applies = match &b.subject {
                BindingSubject::User { user_id: u } => u == user_id,
                BindingSubject::Claim { claim, value } => {
                    claims.iter().any(|(c, v)| c == claim && v == value)
                }
            };
            let role = RoleBinding {
                role: b.role,
                tenant_id: b.tenant_id,
            };
            if applies && !out.contains(&role) {
                out.push(role);
            }
        }
        Ok(out)
    }
}
