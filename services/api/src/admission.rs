//! The fleet a submit is admitted against ([`allot_scheduler::admission`]), read at most
//! once per [`FLEET_MAX_AGE_SECS`] by each replica instead of on every submit: a fleet of
//! thousands of nodes is thousands of rows.
//!
//! Stale only on the lenient side. A refusal is never decided on the remembered fleet: it
//! is decided again on the fleet as read then, so a node that has just joined admits at
//! once. What a remembered fleet can do is admit, for a few seconds, a job that only a node
//! just removed could have run; it then waits, with its reason, as any job the fleet cannot
//! place yet does. Quotas are those read for the request itself (with its authentication):
//! a lowered hard limit refuses at once.

use std::sync::Arc;

use allot_domain::{JobSpec, Node, Tenant};
use allot_store::{NodeRepo, Store};
use chrono::{DateTime, Utc};

use crate::ApiError;

/// How long a replica admits against the fleet it last read.
pub const FLEET_MAX_AGE_SECS: i64 = 2;

struct Fleet {
    read_at: DateTime<Utc>,
    nodes: Arc<Vec<Node>>,
}

/// The remembered fleet of one replica.
pub struct Admission {
    store: Store,
    fleet: tokio::sync::Mutex<Option<Fleet>>,
}

impl Admission {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            fleet: tokio::sync::Mutex::new(None),
        }
    }

    /// The fleet as read no earlier than `not_before` and within the last
    /// [`FLEET_MAX_AGE_SECS`]; read again otherwise (one reader at a time, the others
    /// take what it read).
    async fn fleet(&self, not_before: DateTime<Utc>) -> Result<Arc<Vec<Node>>, ApiError> {
        let mut fleet = self.fleet.lock().await;
        let now = self.store.clock().now();
        let max_age = chrono::Duration::seconds(FLEET_MAX_AGE_SECS);
        if let Some(f) = fleet
            .as_ref()
            .filter(|f| f.read_at >= not_before && now - f.read_at < max_age && f.read_at <= now)
        {
            return Ok(f.nodes.clone());
        }
        let nodes = Arc::new(self.store.list_nodes().await?);
        *fleet = Some(Fleet {
            read_at: now,
            nodes: nodes.clone(),
        });
        Ok(nodes)
    }

    /// Refuses what no node of the fleet and no hard limit above `tenant_id` could ever
    /// give `spec` (see the module's note on the fleet's age).
    pub async fn check(
        &self,
        spec: &JobSpec,
        tenant_id: &str,
        tenants: &[Tenant],
    ) -> Result<(), ApiError> {
        let asked = self.store.clock().now();
        let nodes = self.fleet(DateTime::<Utc>::MIN_UTC).await?;
        if allot_scheduler::admission::check(spec, tenant_id, tenants, &nodes).is_ok() {
            return Ok(());
        }
        let nodes = self.fleet(asked).await?;
        Ok(allot_scheduler::admission::check(
            spec, tenant_id, tenants, &nodes,
        )?)
    }
}
