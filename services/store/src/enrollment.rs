//! How nodes join and stay trusted: one-time bootstrap tokens, and the node certificates the
//! internal CA issued. A certificate authenticates its node only while its row here is
//! current (known, unexpired, unrevoked), so revoking a node takes effect on its next call.

use allot_domain::{AuditContext, AuditEvent, SYSTEM_LOG};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
};
use serde::Serialize;

use crate::audit::record;
use crate::entities::{bootstrap_tokens, node_certificates, nodes};
use crate::{Store, StoreError, new_id};

/// A bootstrap token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootstrapToken {
    pub id: String,
    pub description: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub used_at: Option<DateTime<Utc>>,
    /// The node that used it.
    pub used_by: Option<String>,
    /// The node name it admits, or a pattern with `*`.
    pub node_name: String,
    /// It may take over the name of a node already registered.
    pub replace: bool,
}

#[derive(Debug, Clone)]
pub struct NewBootstrapToken {
    pub secret_hash: String,
    pub description: String,
    pub expires_at: DateTime<Utc>,
    /// The node name it admits, or a pattern with `*`.
    pub node_name: String,
    /// It may take over the name of a node already registered (revoking that node's
    /// certificates).
    pub replace: bool,
}

/// A node certificate the CA issued, by its serial (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeCertificate {
    pub serial: String,
    pub node_id: String,
    pub issued_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl NodeCertificate {
    /// Whether it authenticates its node at `now`.
    pub fn current(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && now < self.expires_at
    }
}

/// A certificate just issued, to record.
#[derive(Debug, Clone)]
pub struct NewNodeCertificate {
    pub serial: String,
    pub issued_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// How a registering node proves it may.
#[derive(Debug, Clone)]
pub enum Admission {
    /// A one-time bootstrap token (its hash): consumed by the registration, which then
    /// revokes every earlier certificate of a node of that name. `key` is what the request
    /// is for (hex SHA-256 of its subject public key info): the same node sending the same
    /// request again, for the same key, shortly after, is a retry whose answer was lost
    /// ([`REGISTRATION_RETRY_WINDOW`]), not a second use.
    BootstrapToken { secret_hash: String, key: String },
    /// A current certificate of the node of that name.
    Certificate { serial: String },
}

pub trait EnrollmentRepo {
    fn create_bootstrap_token(
        &self,
        ctx: &AuditContext,
        t: NewBootstrapToken,
    ) -> impl Future<Output = Result<BootstrapToken, StoreError>> + Send;
    /// Newest first.
    fn list_bootstrap_tokens(
        &self,
    ) -> impl Future<Output = Result<Vec<BootstrapToken>, StoreError>> + Send;
    /// Deletes the token (it admits no one from then on) and returns what it was.
    fn delete_bootstrap_token(
        &self,
        ctx: &AuditContext,
        id: &str,
    ) -> impl Future<Output = Result<BootstrapToken, StoreError>> + Send;
    fn node_certificate(
        &self,
        serial: &str,
    ) -> impl Future<Output = Result<Option<NodeCertificate>, StoreError>> + Send;
    /// Records a renewed certificate of a node (the earlier ones stay valid until they
    /// expire: calls in flight on them finish).
    fn add_node_certificate(
        &self,
        ctx: &AuditContext,
        node_id: &str,
        cert: NewNodeCertificate,
    ) -> impl Future<Output = Result<NodeCertificate, StoreError>> + Send;
    /// Revokes every certificate of the node; returns how many were current.
    fn revoke_node(
        &self,
        ctx: &AuditContext,
        node_id: &str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// Of `node_ids`, those holding no current certificate (all revoked or expired): their
    /// agents cannot be heard from again under that identity, so an outage tolerance does
    /// not apply to them.
    fn nodes_without_current_certificate(
        &self,
        node_ids: &[String],
    ) -> impl Future<Output = Result<std::collections::HashSet<String>, StoreError>> + Send;
}

fn token_to_domain(m: bootstrap_tokens::Model) -> BootstrapToken {
    BootstrapToken {
        id: m.id,
        description: m.description,
        created_by: m.created_by,
        created_at: m.created_at,
        expires_at: m.expires_at,
        used_at: m.used_at,
        used_by: m.used_by,
        node_name: m.node_name,
        replace: m.replace_existing,
    }
}

fn cert_to_domain(m: node_certificates::Model) -> NodeCertificate {
    NodeCertificate {
        serial: m.serial,
        node_id: m.node_id,
        issued_at: m.issued_at,
        expires_at: m.expires_at,
        revoked_at: m.revoked_at,
    }
}

/// How long after a bootstrap token's use the registration it admitted may be sent again
/// (same node, same key) because its answer was lost: an agent's call timed out while the
/// control plane committed it, and the token, spent, would otherwise strand the node.
pub const REGISTRATION_RETRY_WINDOW: chrono::Duration = chrono::Duration::minutes(2);

/// What a bootstrap token's use was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenUse {
    /// Its one use.
    First,
    /// The registration it admitted, sent again by the node that holds the key it was for.
    Retry,
}

/// Consumes the bootstrap token with this hash for `node` and `key`, or refuses: a token
/// admits only the node name (or pattern) it was made for, and takes over the name of a
/// node already registered (`existing`) only when it was made to replace one. A token
/// already used admits only a retry of that registration: the same node name and key,
/// within [`REGISTRATION_RETRY_WINDOW`] of its use, while the certificate that use issued
/// (or a retry's) is still the node's and unrevoked.
pub(crate) async fn consume_bootstrap_token<C: ConnectionTrait>(
    db: &C,
    secret_hash: &str,
    node: &str,
    key: &str,
    existing: Option<&nodes::Model>,
    now: DateTime<Utc>,
) -> Result<TokenUse, StoreError> {
    use bootstrap_tokens::Column as C;
    let unusable =
        || StoreError::Refused("the bootstrap token is unknown, expired or already used".into());
    let token = bootstrap_tokens::Entity::find()
        .filter(C::SecretHash.eq(secret_hash))
        .filter(C::ExpiresAt.gt(now))
        .one(db)
        .await?
        .ok_or_else(unusable)?;
    if let Some(used_at) = token.used_at {
        let same_request = token.used_by.as_deref() == Some(node)
            && token.used_key.as_deref() == Some(key)
            && now < used_at + REGISTRATION_RETRY_WINDOW;
        let Some(m) = existing.filter(|_| same_request) else {
            return Err(unusable());
        };
        let current = node_certificates::Entity::find_by_id(m.latest_cert_serial.clone())
            .one(db)
            .await?
            .is_some_and(|c| c.node_id == m.id && c.revoked_at.is_none());
        return if current {
            Ok(TokenUse::Retry)
        } else {
            Err(unusable())
        };
    }
    if !allot_domain::node::node_pattern_matches(&token.node_name, node) {
        return Err(StoreError::Refused(format!(
            "this bootstrap token admits node `{}`, not `{node}`",
            token.node_name
        )));
    }
    if existing.is_some() && !token.replace_existing {
        return Err(StoreError::Refused(format!(
            "node `{node}` is already registered: taking over its name needs a token made to \
             replace it (allot node bootstrap-token create --node {node} --replace)"
        )));
    }
    let res = bootstrap_tokens::Entity::update_many()
        .col_expr(C::UsedAt, Expr::value(now))
        .col_expr(C::UsedBy, Expr::value(node))
        .col_expr(C::UsedKey, Expr::value(key))
        .filter(C::SecretHash.eq(secret_hash))
        .filter(C::UsedAt.is_null())
        .filter(C::ExpiresAt.gt(now))
        .exec(db)
        .await?;
    if res.rows_affected == 1 {
        Ok(TokenUse::First)
    } else {
        Err(unusable())
    }
}

/// Revokes the node's current certificates; returns how many there were.
pub(crate) async fn revoke_certificates<C: ConnectionTrait>(
    db: &C,
    node_id: &str,
    now: DateTime<Utc>,
) -> Result<u64, StoreError> {
    use node_certificates::Column as C;
    Ok(node_certificates::Entity::update_many()
        .col_expr(C::RevokedAt, Expr::value(now))
        .filter(C::NodeId.eq(node_id))
        .filter(C::RevokedAt.is_null())
        .exec(db)
        .await?
        .rows_affected)
}

pub(crate) async fn insert_certificate<C: ConnectionTrait>(
    db: &C,
    node_id: &str,
    cert: NewNodeCertificate,
) -> Result<NodeCertificate, StoreError> {
    let row = node_certificates::Entity::insert(node_certificates::ActiveModel {
        serial: Set(cert.serial),
        node_id: Set(node_id.to_owned()),
        issued_at: Set(cert.issued_at),
        expires_at: Set(cert.expires_at),
        revoked_at: Set(None),
    })
    .exec_with_returning(db)
    .await?;
    Ok(cert_to_domain(row))
}

impl EnrollmentRepo for Store {
    async fn create_bootstrap_token(
        &self,
        ctx: &AuditContext,
        t: NewBootstrapToken,
    ) -> Result<BootstrapToken, StoreError> {
        let txn = self.begin().await?;
        let row = bootstrap_tokens::Entity::insert(bootstrap_tokens::ActiveModel {
            id: Set(new_id(self.clock.as_ref())),
            secret_hash: Set(t.secret_hash),
            description: Set(t.description),
            created_by: Set(ctx.actor.id.clone()),
            created_at: Set(self.clock.now()),
            expires_at: Set(t.expires_at),
            used_at: Set(None),
            used_by: Set(None),
            used_key: Set(None),
            node_name: Set(t.node_name),
            replace_existing: Set(t.replace),
        })
        .exec_with_returning(&txn)
        .await?;
        let token = token_to_domain(row);
        let event = AuditEvent::success(
            SYSTEM_LOG,
            "node.bootstrap_token.create",
            format!("bootstrap_token/{}", token.id),
        )
        .after(&token);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(token)
    }

    async fn list_bootstrap_tokens(&self) -> Result<Vec<BootstrapToken>, StoreError> {
        Ok(bootstrap_tokens::Entity::find()
            .order_by_desc(bootstrap_tokens::Column::CreatedAt)
            .all(&self.db)
            .await?
            .into_iter()
            .map(token_to_domain)
            .collect())
    }

    async fn delete_bootstrap_token(
        &self,
        ctx: &AuditContext,
        id: &str,
    ) -> Result<BootstrapToken, StoreError> {
        let txn = self.begin().await?;
        let row = bootstrap_tokens::Entity::find_by_id(id.to_owned())
            .one(&txn)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("bootstrap token {id}")))?;
        bootstrap_tokens::Entity::delete_by_id(id.to_owned())
            .exec(&txn)
            .await?;
        let event = AuditEvent::success(
            SYSTEM_LOG,
            "node.bootstrap_token.delete",
            format!("bootstrap_token/{id}"),
        )
        .before(token_to_domain(row.clone()));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(token_to_domain(row))
    }

    async fn node_certificate(&self, serial: &str) -> Result<Option<NodeCertificate>, StoreError> {
        Ok(node_certificates::Entity::find_by_id(serial.to_owned())
            .one(&self.db)
            .await?
            .map(cert_to_domain))
    }

    async fn add_node_certificate(
        &self,
        ctx: &AuditContext,
        node_id: &str,
        cert: NewNodeCertificate,
    ) -> Result<NodeCertificate, StoreError> {
        let txn = self.begin().await?;
        let cert = insert_certificate(&txn, node_id, cert).await?;
        crate::nodes::set_latest_serial(&txn, node_id, &cert.serial).await?;
        let event = AuditEvent::success(
            SYSTEM_LOG,
            "node.certificate.renew",
            format!("node/{node_id}"),
        )
        .after(&cert);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(cert)
    }

    async fn revoke_node(&self, ctx: &AuditContext, node_id: &str) -> Result<u64, StoreError> {
        let txn = self.begin().await?;
        if crate::entities::nodes::Entity::find_by_id(node_id.to_owned())
            .one(&txn)
            .await?
            .is_none()
        {
            return Err(StoreError::NotFound(format!("node {node_id}")));
        }
        let revoked = revoke_certificates(&txn, node_id, self.clock.now()).await?;
        let event = AuditEvent::success(SYSTEM_LOG, "node.revoke", format!("node/{node_id}"))
            .after(serde_json::json!({ "certificates_revoked": revoked }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(revoked)
    }

    async fn nodes_without_current_certificate(
        &self,
        node_ids: &[String],
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        if node_ids.is_empty() {
            return Ok(Default::default());
        }
        let now = self.clock.now();
        let current: std::collections::HashSet<String> = node_certificates::Entity::find()
            .filter(node_certificates::Column::NodeId.is_in(node_ids.iter().cloned()))
            .filter(node_certificates::Column::RevokedAt.is_null())
            .filter(node_certificates::Column::ExpiresAt.gt(now))
            .all(&self.db)
            .await?
            .into_iter()
            .map(|c| c.node_id)
            .collect();
        Ok(node_ids
            .iter()
            .filter(|id| !current.contains(*id))
            .cloned()
            .collect())
    }
}
