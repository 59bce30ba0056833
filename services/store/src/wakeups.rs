//! Wakeups between replicas: a replica that took a request only the leader can act on
//! (a submit to place, a cancel to tell a node, a node's certificates revoked) says so
//! through PostgreSQL's `NOTIFY`; the leader `LISTEN`s. They are hints that make the leader
//! act at once: what they point at is already committed, and the leader's periodic pass
//! and its answers to heartbeats act on it anyway, so one lost in a reconnect only delays.
//! On SQLite there is one process, and nothing to say.

use sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::{Store, StoreError};

/// The channel the replicas notify on.
pub const WAKEUP_CHANNEL: &str = "allot_wakeup";

/// What a replica tells the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// Jobs were submitted (or room freed): run a scheduling pass.
    Schedule,
    /// Job `job`, held on a node, is being cancelled: tell the node now.
    Cancel { job: String },
    /// Node `node`'s certificates were revoked: end its open calls.
    Revoke { node: String },
}

impl Wakeup {
    /// The notification's payload: `schedule`, `cancel <job id>`, `revoke <node id>`.
    pub fn payload(&self) -> String {
        match self {
            Wakeup::Schedule => "schedule".to_owned(),
            Wakeup::Cancel { job } => format!("cancel {job}"),
            Wakeup::Revoke { node } => format!("revoke {node}"),
        }
    }

    /// Reads a payload back; `None` for anything else (another version's, say).
    pub fn parse(payload: &str) -> Option<Self> {
        match payload.split_once(' ') {
            None if payload == "schedule" => Some(Wakeup::Schedule),
            Some(("cancel", job)) if !job.is_empty() => Some(Wakeup::Cancel {
                job: job.to_owned(),
            }),
            Some(("revoke", node)) if !node.is_empty() => Some(Wakeup::Revoke {
                node: node.to_owned(),
            }),
            _ => None,
        }
    }
}

/// Wakeups as they arrive, on a connection of their own (reconnected when lost).
pub struct WakeupListener {
    listener: sea_orm::sqlx::postgres::PgListener,
}

impl WakeupListener {
    /// The next wakeup. Errors when the connection was lost and cannot be opened again
    /// just now; the caller waits and listens anew.
    pub async fn next(&mut self) -> Result<Wakeup, StoreError> {
        loop {
            let n = self
                .listener
                .recv()
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            if let Some(w) = Wakeup::parse(n.payload()) {
                return Ok(w);
            }
        }
    }
}

impl Store {
    /// Tells whichever replica listens (the leader). Nothing on SQLite.
    pub async fn announce(&self, wakeup: &Wakeup) -> Result<(), StoreError> {
        if self.db.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        self.db
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_notify($1, $2)",
                [WAKEUP_CHANNEL.into(), wakeup.payload().into()],
            ))
            .await?;
        Ok(())
    }

    /// Listens for wakeups; `None` on SQLite, where there is no one else to hear from.
    pub async fn listen(&self) -> Result<Option<WakeupListener>, StoreError> {
        if self.db.get_database_backend() != DbBackend::Postgres {
            return Ok(None);
        }
        let pool = self.db.get_postgres_connection_pool();
        let mut listener = sea_orm::sqlx::postgres::PgListener::connect_with(pool)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        listener
            .listen(WAKEUP_CHANNEL)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(Some(WakeupListener { listener }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_read_back_and_odd_ones_are_ignored() {
        for w in [
            Wakeup::Schedule,
            Wakeup::Cancel { job: "j1".into() },
            Wakeup::Revoke { node: "n1".into() },
        ] {
            assert_eq!(Wakeup::parse(&w.payload()), Some(w));
        }
        for odd in ["", "cancel", "cancel ", "schedule now", "drop everything"] {
            assert_eq!(Wakeup::parse(odd), None, "{odd:?}");
        }
    }
}
