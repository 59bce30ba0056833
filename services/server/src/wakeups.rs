//! Wakeups between replicas (`allot_store::Wakeup`): followers announce what only the
//! leader can act on; every replica listens, and acts only while it leads.

use std::sync::Arc;
use std::time::Duration;

use allot_store::{JobRepo, Store, TenantScope, Wakeup};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::hub::{self, Hub};
use crate::leadership::Leadership;

/// Sends `Wakeup::Schedule` whenever `wanted` is notified: submits on a follower in quick
/// succession share one notification (they coalesce while one is in flight).
pub async fn announce_schedules(store: Store, wanted: Arc<Notify>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = wanted.notified() => {}
        }
        if let Err(e) = store.announce(&Wakeup::Schedule).await {
            tracing::warn!(error = %e, "cannot wake the leader; its periodic pass will place the work");
        }
    }
}

/// Sends one wakeup in the background (from synchronous event handlers).
pub fn announce(store: &Store, wakeup: Wakeup) {
    let store = store.clone();
    tokio::spawn(async move {
        if let Err(e) = store.announce(&wakeup).await {
            tracing::warn!(error = %e, wakeup = %wakeup.payload(), "cannot wake the leader");
        }
    });
}

/// What a leader does on hearing a wakeup.
pub struct Router {
    pub store: Store,
    pub leadership: Arc<Leadership>,
    pub notify: Arc<Notify>,
    pub hub: Arc<Hub>,
}

impl Router {
    /// Listens until `stop`, listening anew (after a second) whenever the connection is
    /// lost for good. Returns at once on SQLite.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            match self.store.listen().await {
                Ok(None) => return,
                Ok(Some(mut listener)) => loop {
                    let heard = tokio::select! {
                        () = stop.cancelled() => return,
                        heard = listener.next() => heard,
                    };
                    match heard {
                        Ok(wakeup) => self.act(wakeup).await,
                        Err(e) => {
                            tracing::warn!(error = %e, "lost the wakeup channel; listening again");
                            break;
                        }
                    }
                },
                Err(e) => tracing::warn!(error = %e, "cannot listen for wakeups"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn act(&self, wakeup: Wakeup) {
        if !self.leadership.leads() {
            return;
        }
        match wakeup {
            Wakeup::Schedule => self.notify.notify_one(),
            Wakeup::Cancel { job } => match self.store.job(&TenantScope::All, &job).await {
                Ok(job) => {
                    if let Some(node) = &job.node_id {
                        self.hub.send(node, hub::cancel(&job));
                    }
                }
                Err(e) => tracing::warn!(%job, error = %e, "a cancel announced by another replica"),
            },
            Wakeup::Revoke { node } => self.hub.disconnect(
                &node,
                tonic::Status::unauthenticated("the node's certificates were revoked"),
            ),
        }
    }
}
