//! Web sign-ins in progress, kept in the database so that the identity provider may send
//! the browser back to any replica of the control plane. Keyed by the SHA-256 of the
//! sign-in's `state` (which only the browser's cookie and the provider's redirect carry);
//! what the callback needs is sealed under the secrets key, bound to its row. Each is
//! taken once: of two callbacks with one state, on one replica or two, one gets it.

use chrono::Duration;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde::{Deserialize, Serialize};

use crate::entities::sign_ins;
use crate::{Store, StoreError};

/// What a sign-in's callback needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSignIn {
    /// The PKCE code verifier.
    pub verifier: String,
    /// The nonce the ID token must carry.
    pub nonce: String,
    /// Where the browser goes once signed in.
    pub return_to: String,
}

pub trait SignInRepo {
    /// Keeps a sign-in started now, under `state_hash`; sweeps those older than `ttl`, and
    /// refuses (`Conflict`) when `max` are in progress.
    fn begin_sign_in(
        &self,
        state_hash: &str,
        pending: &PendingSignIn,
        ttl: Duration,
        max: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Takes the sign-in under `state_hash` (it is gone afterwards); none when there is
    /// none, another took it first, or it is older than `ttl`.
    fn take_sign_in(
        &self,
        state_hash: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<PendingSignIn>, StoreError>> + Send;
}

/// What a sealed sign-in is bound to: its row.
fn context(state_hash: &str) -> Vec<u8> {
    format!("sign_ins\0{state_hash}").into_bytes()
}

impl SignInRepo for Store {
    async fn begin_sign_in(
        &self,
        state_hash: &str,
        pending: &PendingSignIn,
        ttl: Duration,
        max: u64,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let plain = serde_json::to_vec(pending)
            .map_err(|e| StoreError::Corrupt(format!("sign-in: {e}")))?;
        let sealed = self
            .secrets
            .seal(&context(state_hash), &plain)
            .map_err(|e| StoreError::Refused(e.to_string()))?;
        let txn = self.begin().await?;
        sign_ins::Entity::delete_many()
            .filter(sign_ins::Column::StartedAt.lt(now - ttl))
            .exec(&txn)
            .await?;
        if sign_ins::Entity::find().count(&txn).await? >= max {
            return Err(StoreError::Conflict("too many sign-ins in progress".into()));
        }
        sign_ins::Entity::insert(sign_ins::ActiveModel {
            state_hash: Set(state_hash.to_owned()),
            sealed: Set(sealed),
            started_at: Set(now),
        })
        .exec(&txn)
        .await?;
        self.commit(txn).await?;
        Ok(())
    }

    async fn take_sign_in(
        &self,
        state_hash: &str,
        ttl: Duration,
    ) -> Result<Option<PendingSignIn>, StoreError> {
        let Some(row) = sign_ins::Entity::find_by_id(state_hash.to_owned())
            .one(&self.db)
            .await?
        else {
            return Ok(None);
        };
        // Whoever deletes the row has taken it.
        let taken = sign_ins::Entity::delete_by_id(state_hash.to_owned())
            .exec(&self.db)
            .await?
            .rows_affected;
        if taken != 1 || row.started_at < self.clock.now() - ttl {
            return Ok(None);
        }
        let plain = self
            .secrets
            .open(&context(state_hash), &row.sealed)
            .map_err(|e| StoreError::Corrupt(format!("a sign-in in progress: {e}")))?;
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("a sign-in in progress: {e}")))
    }
}
