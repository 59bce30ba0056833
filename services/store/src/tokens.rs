//! API tokens. Only the SHA-256 of a secret is stored.

use allot_domain::{ApiToken, AuditContext, AuditEvent, Role, SYSTEM_LOG};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect,
};

use crate::audit::record;
use crate::convert::parse;
use crate::entities::api_tokens;
use crate::group_commit::GroupCommit;
use crate::{Store, StoreError, TenantScope, new_id};

#[derive(Debug, Clone)]
pub struct NewToken {
    pub name: String,
    pub tenant_id: Option<String>,
    pub role: Role,
    pub secret_hash: String,
    pub expires_at: Option<DateTime<Utc>>,
}

pub trait TokenRepo {
    fn create_token(
        &self,
        ctx: &AuditContext,
        t: NewToken,
    ) -> impl Future<Output = Result<ApiToken, StoreError>> + Send;
    /// The token with this secret hash, if any (usable or not), and marks it used; with
    /// the tenants' version, read in the same statement (see
    /// [`crate::TenantRepo::versioned_tenant_tree`]).
    fn use_token(
        &self,
        secret_hash: &str,
    ) -> impl Future<Output = Result<Option<(ApiToken, i64)>, StoreError>> + Send;
    /// The token, if it exists and is in `scope` (else `NotFound`).
    fn token(
        &self,
        scope: &TenantScope,
        id: &str,
    ) -> impl Future<Output = Result<ApiToken, StoreError>> + Send;
    fn list_tokens(
        &self,
        scope: &TenantScope,
    ) -> impl Future<Output = Result<Vec<ApiToken>, StoreError>> + Send;
    fn revoke_token(
        &self,
        ctx: &AuditContext,
        scope: &TenantScope,
        id: &str,
    ) -> impl Future<Output = Result<ApiToken, StoreError>> + Send;
    fn count_admin_tokens(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A token's row with the tenants' version beside it.
#[derive(sea_orm::FromQueryResult)]
struct TokenRow {
    id: String,
    name: String,
    tenant_id: Option<String>,
    role: String,
    secret_hash: String,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    last_used_at: Option<DateTime<Utc>>,
    tenants_version: i64,
}

/// The tokens with these secret hashes (each usable or not, `None` when unknown), in the
/// order asked, with the tenants' version, all read in one statement; each usable one is
/// marked used.
async fn use_tokens(
    store: &Store,
    secret_hashes: Vec<String>,
) -> Result<Vec<Option<(ApiToken, i64)>>, StoreError> {
    let mut unique = secret_hashes.clone();
    unique.sort_unstable();
    unique.dedup();
    let rows = api_tokens::Entity::find()
        .filter(api_tokens::Column::SecretHash.is_in(unique))
        .column_as(
            Expr::cust("(SELECT version FROM tenants_version WHERE id = 1)"),
            "tenants_version",
        )
        .into_model::<TokenRow>()
        .all(&store.db)
        .await?;
    let now = store.clock.now();
    let mut by_hash = std::collections::HashMap::with_capacity(rows.len());
    for row in rows {
        let version = row.tenants_version;
        let hash = row.secret_hash.clone();
        let token = to_domain(api_tokens::Model {
            id: row.id,
            name: row.name,
            tenant_id: row.tenant_id,
            role: row.role,
            secret_hash: row.secret_hash,
            created_at: row.created_at,
            expires_at: row.expires_at,
            revoked_at: row.revoked_at,
            last_used_at: row.last_used_at,
        })?;
        // Recorded to the minute: a token used by many clients at once is one row, and a
        // write of it on every request would queue them all behind its lock.
        let stale = token
            .last_used_at
            .is_none_or(|at| now - at >= chrono::Duration::seconds(LAST_USED_GRAIN_SECS));
        if token.is_usable(now) && stale {
            api_tokens::Entity::update(api_tokens::ActiveModel {
                id: Set(token.id.clone()),
                last_used_at: Set(Some(now)),
                ..Default::default()
            })
            .exec(&store.db)
            .await?;
        }
        by_hash.insert(hash, (token, version));
    }
    Ok(secret_hashes
        .iter()
        .map(|h| by_hash.get(h).cloned())
        .collect())
}

/// Token reads in groups: the requests that arrive while one read runs are authenticated
/// together by the next, one statement for all of them, so a burst of requests costs the
/// database a statement per group rather than per request. Each request's read starts
/// after the request arrived: a token revoked before it is refused, as by
/// [`TokenRepo::use_token`].
#[derive(Clone)]
pub struct TokenReader {
    queue: GroupCommit<String, Option<(ApiToken, i64)>>,
}

impl TokenReader {
    /// Starts the reading task; it ends when every clone of the reader is dropped.
    pub fn start(store: Store, max_batch: usize) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, task) = GroupCommit::start(
            max_batch,
            |_: &String| String::new(),
            move |_, hashes: Vec<String>| {
                let store = store.clone();
                async move {
                    match use_tokens(&store, hashes.clone()).await {
                        Ok(found) => found.into_iter().map(Ok).collect(),
                        // Each read again on its own, to answer each with its own error.
                        Err(_) => {
                            let mut answers = Vec::with_capacity(hashes.len());
                            for h in &hashes {
                                answers.push(store.use_token(h).await);
                            }
                            answers
                        }
                    }
                }
            },
        );
        (Self { queue }, task)
    }

    /// [`TokenRepo::use_token`], read with whatever other requests queued meanwhile.
    pub async fn use_token(
        &self,
        secret_hash: &str,
    ) -> Result<Option<(ApiToken, i64)>, StoreError> {
        self.queue.submit(secret_hash.to_owned()).await
    }
}

/// How fresh a token's `last_used_at` is kept.
const LAST_USED_GRAIN_SECS: i64 = 60;

/// The log a token's changes go to: its tenant's, or the system log for admin tokens.
fn log_of(t: &ApiToken) -> String {
    t.tenant_id.clone().unwrap_or_else(|| SYSTEM_LOG.to_owned())
}

fn to_domain(m: api_tokens::Model) -> Result<ApiToken, StoreError> {
    Ok(ApiToken {
        role: parse("role", &m.role)?,
        id: m.id,
        name: m.name,
        tenant_id: m.tenant_id,
        created_at: m.created_at,
        expires_at: m.expires_at,
        revoked_at: m.revoked_at,
        last_used_at: m.last_used_at,
    })
}

impl TokenRepo for Store {
    async fn create_token(&self, ctx: &AuditContext, t: NewToken) -> Result<ApiToken, StoreError> {
        let row = api_tokens::ActiveModel {
            id: Set(new_id(self.clock.as_ref())),
            name: Set(t.name),
            tenant_id: Set(t.tenant_id),
            role: Set(t.role.as_str().to_owned()),
            secret_hash: Set(t.secret_hash),
            created_at: Set(self.clock.now()),
            expires_at: Set(t.expires_at),
            revoked_at: Set(None),
            last_used_at: Set(None),
        };
        let txn = self.begin().await?;
        let token = to_domain(
            api_tokens::Entity::insert(row)
                .exec_with_returning(&txn)
                .await?,
        )?;
        let event = AuditEvent::success(
            log_of(&token),
            "token.create",
            format!("token/{}", token.id),
        )
        .after(&token);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(token)
    }

    async fn use_token(&self, secret_hash: &str) -> Result<Option<(ApiToken, i64)>, StoreError> {
        let mut found = use_tokens(self, vec![secret_hash.to_owned()]).await?;
        Ok(found.pop().flatten())
    }

    async fn token(&self, scope: &TenantScope, id: &str) -> Result<ApiToken, StoreError> {
        let missing = || StoreError::NotFound(format!("token {id}"));
        let token = api_tokens::Entity::find_by_id(id.to_owned())
            .one(&self.db)
            .await?
            .ok_or_else(missing)
            .and_then(to_domain)?;
        if !scope.includes(token.tenant_id.as_deref()) {
            return Err(missing());
        }
        Ok(token)
    }

    async fn list_tokens(&self, scope: &TenantScope) -> Result<Vec<ApiToken>, StoreError> {
        api_tokens::Entity::find()
            .filter(scope.condition(api_tokens::Column::TenantId))
            .order_by_asc(api_tokens::Column::Id)
            .all(&self.db)
            .await?
            .into_iter()
            .map(to_domain)
            .collect()
    }

    async fn revoke_token(
        &self,
        ctx: &AuditContext,
        scope: &TenantScope,
        id: &str,
    ) -> Result<ApiToken, StoreError> {
        let token = self.token(scope, id).await?;
        if token.revoked_at.is_some() {
            return Ok(token);
        }
        let txn = self.begin().await?;
        let revoked = to_domain(
            api_tokens::Entity::update(api_tokens::ActiveModel {
                id: Set(token.id.clone()),
                revoked_at: Set(Some(self.clock.now())),
                ..Default::default()
            })
            .exec(&txn)
            .await?,
        )?;
        let event = AuditEvent::success(
            log_of(&revoked),
            "token.revoke",
            format!("token/{}", revoked.id),
        )
        .before(&token)
        .after(&revoked);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(revoked)
    }

    async fn count_admin_tokens(&self) -> Result<u64, StoreError> {
        Ok(api_tokens::Entity::find()
            .filter(api_tokens::Column::Role.eq(Role::Admin.as_str()))
            .count(&self.db)
            .await?)
    }
}
