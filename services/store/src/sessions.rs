//! Browser sessions: started at sign-in, ended at sign-out. Only the SHA-256 of a session
//! id is stored; starting and ending are audited.

use allot_domain::{AuditContext, AuditEvent, SYSTEM_LOG, Session};
use chrono::{DateTime, Duration, Utc};
use sea_orm::{ActiveValue::Set, EntityTrait};

use crate::audit::record;
use crate::entities::sessions;
use crate::{Store, StoreError};

/// How stale `last_seen_at` may get before a request writes it again.
const SEEN_GRANULARITY: Duration = Duration::seconds(30);

#[derive(Debug, Clone)]
pub struct NewSession {
    pub id_hash: String,
    pub user_id: String,
    pub csrf_token: String,
    pub claims: serde_json::Map<String, serde_json::Value>,
    pub expires_at: DateTime<Utc>,
}

pub trait SessionRepo {
    fn start_session(
        &self,
        ctx: &AuditContext,
        s: NewSession,
    ) -> impl Future<Output = Result<Session, StoreError>> + Send;
    /// The session with this id hash, ended or not.
    fn session(
        &self,
        id_hash: &str,
    ) -> impl Future<Output = Result<Option<Session>, StoreError>> + Send;
    /// Records activity (at most every half minute).
    fn touch_session(
        &self,
        id_hash: &str,
        last_seen_at: DateTime<Utc>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Ends the session; ending an ended one changes nothing.
    fn end_session(
        &self,
        ctx: &AuditContext,
        id_hash: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

fn session_of(m: sessions::Model) -> Result<Session, StoreError> {
    let claims = match serde_json::from_str::<serde_json::Value>(&m.claims) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => {
            return Err(StoreError::Corrupt(
                "a session's claims are not a JSON object".into(),
            ));
        }
    };
    Ok(Session {
        user_id: m.user_id,
        csrf_token: m.csrf_token,
        claims,
        created_at: m.created_at,
        last_seen_at: m.last_seen_at,
        expires_at: m.expires_at,
        ended_at: m.ended_at,
    })
}

/// The audit target naming a session without its secret: a prefix of the hash.
fn target(id_hash: &str) -> String {
    format!("session/{}", &id_hash[..id_hash.len().min(16)])
}

impl SessionRepo for Store {
    async fn start_session(
        &self,
        ctx: &AuditContext,
        s: NewSession,
    ) -> Result<Session, StoreError> {
        let now = self.clock.now();
        let row = sessions::ActiveModel {
            id_hash: Set(s.id_hash.clone()),
            user_id: Set(s.user_id),
            csrf_token: Set(s.csrf_token),
            claims: Set(serde_json::Value::Object(s.claims).to_string()),
            created_at: Set(now),
            last_seen_at: Set(now),
            expires_at: Set(s.expires_at),
            ended_at: Set(None),
        };
        let txn = self.begin().await?;
        let session = session_of(
            sessions::Entity::insert(row)
                .exec_with_returning(&txn)
                .await?,
        )?;
        let event = AuditEvent::success(SYSTEM_LOG, "session.start", target(&s.id_hash)).after(
            serde_json::json!({
                "user": session.user_id, "expires_at": session.expires_at,
            }),
        );
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(session)
    }

    async fn session(&self, id_hash: &str) -> Result<Option<Session>, StoreError> {
        sessions::Entity::find_by_id(id_hash.to_owned())
            .one(&self.db)
            .await?
            .map(session_of)
            .transpose()
    }

    async fn touch_session(
        &self,
        id_hash: &str,
        last_seen_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let Some(s) = self.session(id_hash).await? else {
            return Ok(());
        };
        if last_seen_at - s.last_seen_at < SEEN_GRANULARITY {
            return Ok(());
        }
        sessions::Entity::update(sessions::ActiveModel {
            id_hash: Set(id_hash.to_owned()),
            last_seen_at: Set(last_seen_at),
            ..Default::default()
        })
        .exec(&self.db)
        .await?;
        Ok(())
    }

    async fn end_session(&self, ctx: &AuditContext, id_hash: &str) -> Result<(), StoreError> {
        let Some(s) = self.session(id_hash).await? else {
            return Ok(());
        };
        if s.ended_at.is_some() {
            return Ok(());
        }
        let txn = self.begin().await?;
        sessions::Entity::update(sessions::ActiveModel {
            id_hash: Set(id_hash.to_owned()),
            ended_at: Set(Some(self.clock.now())),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
        let event = AuditEvent::success(SYSTEM_LOG, "session.end", target(id_hash))
            .after(serde_json::json!({ "user": s.user_id }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(())
    }
}
