//! Nodes, their GPU inventory and their leases.

use std::collections::HashMap;

use allot_domain::{AuditContext, AuditEvent, GpuDevice, Node, SYSTEM_LOG};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Query;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, JoinType, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect, RelationDef,
};

use crate::audit::record;
use crate::convert::{to_i64, to_u32, to_u64};
use crate::enrollment::{
    Admission, NewNodeCertificate, TokenUse, consume_bootstrap_token, insert_certificate,
    revoke_certificates,
};
use crate::entities::{gpus, node_certificates, nodes};
use crate::{Store, StoreError, new_id};

/// What an operator changes about a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAdmin {
    Cordon,
    Uncordon,
    /// Cordon it, its jobs leaving once the drain's deadline has passed.
    Drain(allot_domain::node::Drain),
    DrainGpu(String),
    ReturnGpu(String),
    /// Set labels (`Some`) and remove them (`None`).
    Label(std::collections::BTreeMap<String, Option<String>>),
}

impl NodeAdmin {
    fn action(&self) -> &'static str {
        match self {
            NodeAdmin::Cordon => "node.cordon",
            NodeAdmin::Uncordon => "node.uncordon",
            NodeAdmin::Drain(_) => "node.drain",
            NodeAdmin::DrainGpu(_) => "node.gpu.drain",
            NodeAdmin::ReturnGpu(_) => "node.gpu.return",
            NodeAdmin::Label(_) => "node.label",
        }
    }
}

/// What an agent presents when it (re-)registers.
#[derive(Debug, Clone)]
pub struct NodeRegistration {
    pub name: String,
    /// What admits it: a bootstrap token or its current certificate.
    pub admission: Admission,
    /// The certificate the CA issued it for this registration.
    pub certificate: NewNodeCertificate,
    pub agent_version: String,
    pub gpu_backend: String,
    /// What runs its jobs (`oci`, `process`).
    pub runtime: String,
    /// CPU (milli) and memory the node offers to jobs; 0 when not reported.
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    pub gpus: Vec<GpuDevice>,
    pub lease_expires_at: DateTime<Utc>,
    /// Where other nodes reach it (empty: not said).
    pub address: String,
}

pub trait NodeRepo {
    /// Creates the node, or takes over the existing one of the same name, when its
    /// admission holds; records its new certificate. A bootstrap token is consumed, and
    /// revokes the earlier certificates of a node it takes over.
    fn register_node(
        &self,
        ctx: &AuditContext,
        r: NodeRegistration,
    ) -> impl Future<Output = Result<Node, StoreError>> + Send;
    /// Renews the lease and, when given (it changed), replaces the reported inventory.
    fn heartbeat(
        &self,
        node_id: &str,
        gpus: Option<Vec<GpuDevice>>,
        lease_expires_at: DateTime<Utc>,
    ) -> impl Future<Output = Result<Node, StoreError>> + Send;
    fn node(&self, id: &str) -> impl Future<Output = Result<Node, StoreError>> + Send;
    /// The node that certificate `serial` was issued to, if the certificate is current at
    /// `now` (known, unrevoked, unexpired): what authenticates each call of an agent, read
    /// in one statement.
    fn node_by_certificate(
        &self,
        serial: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<Node>, StoreError>> + Send;
    /// An operator's decision about a node (audited): cordon or return it to service, and
    /// drain a GPU or return it.
    fn set_node_admin(
        &self,
        ctx: &AuditContext,
        id: &str,
        change: NodeAdmin,
    ) -> impl Future<Output = Result<Node, StoreError>> + Send;
    fn list_nodes(&self) -> impl Future<Output = Result<Vec<Node>, StoreError>> + Send;
    /// How many nodes hold a lease current at `now` (those heartbeating).
    fn count_ready_nodes(
        &self,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

fn gpu_to_domain(m: gpus::Model) -> Result<GpuDevice, StoreError> {
    Ok(GpuDevice {
        index: to_u32("gpu index", m.idx.into())?,
        memory_bytes: to_u64("gpu memory", m.memory_bytes)?,
        uuid: m.uuid,
        model: m.model,
        healthy: m.healthy,
        degraded: m.degraded,
        memory_enforcement: crate::convert::parse("memory_enforcement", &m.memory_enforcement)?,
        nvlink_domain: m
            .nvlink_domain
            .map(|d| to_u32("nvlink_domain", d.into()))
            .transpose()?,
        mig: m
            .mig_layout
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("gpu mig_layout: {e}")))?,
    })
}

fn to_domain(m: nodes::Model, gpus: Vec<GpuDevice>) -> Node {
    Node {
        id: m.id,
        name: m.name,
        registered_at: m.registered_at,
        last_heartbeat_at: m.last_heartbeat_at,
        lease_expires_at: m.lease_expires_at,
        agent_version: m.agent_version,
        gpu_backend: m.gpu_backend,
        runtime: m.runtime,
        // Written from u64 values that fit i64: a negative one can only be tampering, and
        // reads as "not reported".
        cpu_milli: u64::try_from(m.cpu_milli).unwrap_or(0),
        memory_bytes: u64::try_from(m.memory_bytes).unwrap_or(0),
        gpus,
        cordoned: m.cordoned,
        drain: m.drain_deadline.map(|deadline| allot_domain::node::Drain {
            reason: m.drain_reason.unwrap_or_default(),
            deadline,
        }),
        // Written by `set_node_admin` only; unreadable reads as nothing drained, and the
        // GPUs' own health still applies.
        drained_gpus: serde_json::from_str(&m.drained_gpus).unwrap_or_default(),
        // Written by `register_node` only; unreadable reads as not recorded (the stored
        // inventory then stands for it).
        approved_gpus: m
            .approved_gpus
            .as_deref()
            .and_then(|a| serde_json::from_str(a).ok()),
        address: m.address,
        // Written by `set_node_admin` only; unreadable reads as no labels.
        labels: serde_json::from_str(&m.labels).unwrap_or_default(),
        unavailable: m.unavailable,
    }
}

pub(crate) async fn replace_gpus<C: ConnectionTrait>(
    db: &C,
    node_id: &str,
    devices: &[GpuDevice],
) -> Result<(), StoreError> {
    // A node reports only its own GPUs: one another node holds stays that node's.
    let uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    if let Some(theirs) = gpus::Entity::find()
        .filter(gpus::Column::Uuid.is_in(uuids))
        .filter(gpus::Column::NodeId.ne(node_id))
        .one(db)
        .await?
    {
        return Err(StoreError::Conflict(format!(
            "GPU {} is another node's",
            theirs.uuid
        )));
    }
    gpus::Entity::delete_many()
        .filter(gpus::Column::NodeId.eq(node_id))
        .exec(db)
        .await?;
    if devices.is_empty() {
        return Ok(());
    }
    let rows = devices
        .iter()
        .map(|g| {
            Ok(gpus::ActiveModel {
                uuid: Set(g.uuid.clone()),
                node_id: Set(node_id.to_owned()),
                idx: Set(i32::try_from(g.index)
                    .map_err(|_| StoreError::Corrupt("gpu index exceeds i32".into()))?),
                model: Set(g.model.clone()),
                memory_bytes: Set(to_i64("gpu memory", g.memory_bytes)?),
                healthy: Set(g.healthy),
                degraded: Set(g.degraded),
                memory_enforcement: Set(g.memory_enforcement.as_str().to_owned()),
                nvlink_domain: Set(g
                    .nvlink_domain
                    .map(|d| {
                        i32::try_from(d)
                            .map_err(|_| StoreError::Corrupt("nvlink domain exceeds i32".into()))
                    })
                    .transpose()?),
                mig_layout: Set(g
                    .mig
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()
                    .map_err(|e| StoreError::Corrupt(format!("gpu mig_layout: {e}")))?),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    gpus::Entity::insert_many(rows).exec(db).await?;
    Ok(())
}

/// Points the node at its newest certificate.
pub(crate) async fn set_latest_serial<C: ConnectionTrait>(
    db: &C,
    node_id: &str,
    serial: &str,
) -> Result<(), StoreError> {
    nodes::Entity::update(nodes::ActiveModel {
        id: Set(node_id.to_owned()),
        latest_cert_serial: Set(serial.to_owned()),
        ..Default::default()
    })
    .exec(db)
    .await
    .map_err(|e| match e {
        sea_orm::DbErr::RecordNotUpdated => StoreError::NotFound(format!("node {node_id}")),
        e => e.into(),
    })?;
    Ok(())
}

impl Store {
    async fn gpus_of(&self, node_id: &str) -> Result<Vec<GpuDevice>, StoreError> {
        gpus::Entity::find()
            .filter(gpus::Column::NodeId.eq(node_id))
            .order_by_asc(gpus::Column::Idx)
            .all(&self.db)
            .await?
            .into_iter()
            .map(gpu_to_domain)
            .collect()
    }
}

impl NodeRepo for Store {
    async fn register_node(
        &self,
        ctx: &AuditContext,
        r: NodeRegistration,
    ) -> Result<Node, StoreError> {
        let now = self.clock.now();
        let cpu_milli = to_i64("cpu_milli", r.cpu_milli)?;
        let memory_bytes = to_i64("memory_bytes", r.memory_bytes)?;
        let txn = self.begin().await?;
        let existing = nodes::Entity::find()
            .filter(nodes::Column::Name.eq(&r.name))
            .one(&txn)
            .await?;
        match (&r.admission, &existing) {
            (Admission::BootstrapToken { secret_hash, key }, _) => {
                let used = consume_bootstrap_token(
                    &txn,
                    secret_hash,
                    &r.name,
                    key,
                    existing.as_ref(),
                    now,
                )
                .await?;
                // Whoever held this name before is not trusted any more: an admin's
                // explicit replace, audited as such. A retry replaces only the certificate
                // its lost answer carried, which never reached the node.
                if let (Some(m), TokenUse::Retry) = (&existing, used) {
                    revoke_certificates(&txn, &m.id, now).await?;
                } else if let Some(m) = &existing {
                    let revoked = revoke_certificates(&txn, &m.id, now).await?;
                    let event =
                        AuditEvent::success(SYSTEM_LOG, "node.replace", format!("node/{}", m.id))
                            .before(serde_json::json!({
                                "name": m.name, "certificate": m.latest_cert_serial,
                                "certificates_revoked": revoked,
                            }))
                            .after(serde_json::json!({
                                "name": r.name, "certificate": r.certificate.serial,
                            }));
                    record(&txn, self, ctx, event).await?;
                }
            }
            (Admission::Certificate { serial }, Some(m)) => {
                let current = node_certificates::Entity::find_by_id(serial.clone())
                    .one(&txn)
                    .await?
                    .is_some_and(|c| {
                        c.node_id == m.id && c.revoked_at.is_none() && now < c.expires_at
                    });
                if !current {
                    return Err(StoreError::Refused(format!(
                        "the certificate is not a current one of node {}",
                        r.name
                    )));
                }
            }
            (Admission::Certificate { .. }, None) => {
                return Err(StoreError::Refused(format!(
                    "node {} is not registered",
                    r.name
                )));
            }
        }
        let serial = r.certificate.serial.clone();
        // What a bootstrap token (an admin's) admits is the inventory the node may report
        // from then on; a certificate's holder adds nothing to it.
        let approved = match r.admission {
            Admission::BootstrapToken { .. } => {
                let uuids: Vec<&str> = r.gpus.iter().map(|g| g.uuid.as_str()).collect();
                Set(Some(serde_json::to_string(&uuids).map_err(|e| {
                    StoreError::Corrupt(format!("approved GPUs: {e}"))
                })?))
            }
            Admission::Certificate { .. } => sea_orm::ActiveValue::NotSet,
        };
        let row = match existing {
            Some(m) => {
                nodes::Entity::update(nodes::ActiveModel {
                    id: Set(m.id),
                    latest_cert_serial: Set(serial),
                    agent_version: Set(r.agent_version),
                    gpu_backend: Set(r.gpu_backend),
                    runtime: Set(r.runtime),
                    last_heartbeat_at: Set(now),
                    lease_expires_at: Set(r.lease_expires_at),
                    cpu_milli: Set(cpu_milli),
                    memory_bytes: Set(memory_bytes),
                    address: Set(r.address),
                    approved_gpus: approved,
                    ..Default::default()
                })
                .exec(&txn)
                .await?
            }
            None => {
                nodes::Entity::insert(nodes::ActiveModel {
                    id: Set(new_id(self.clock.as_ref())),
                    name: Set(r.name),
                    latest_cert_serial: Set(serial),
                    agent_version: Set(r.agent_version),
                    gpu_backend: Set(r.gpu_backend),
                    runtime: Set(r.runtime),
                    registered_at: Set(now),
                    last_heartbeat_at: Set(now),
                    lease_expires_at: Set(r.lease_expires_at),
                    cpu_milli: Set(cpu_milli),
                    memory_bytes: Set(memory_bytes),
                    cordoned: Set(false),
                    drain_reason: Set(None),
                    drain_deadline: Set(None),
                    drained_gpus: Set("[]".to_owned()),
                    labels: Set("{}".to_owned()),
                    address: Set(r.address),
                    unavailable: Set(String::new()),
                    approved_gpus: approved,
                })
                .exec_with_returning(&txn)
                .await?
            }
        };
        replace_gpus(&txn, &row.id, &r.gpus).await?;
        insert_certificate(&txn, &row.id, r.certificate).await?;
        let node = to_domain(row, r.gpus);
        let event = AuditEvent::success(SYSTEM_LOG, "node.register", format!("node/{}", node.id))
            .after(&node);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(node)
    }

    async fn heartbeat(
        &self,
        node_id: &str,
        gpus: Option<Vec<GpuDevice>>,
        lease_expires_at: DateTime<Utc>,
    ) -> Result<Node, StoreError> {
        let beat = crate::Beat {
            node_id: node_id.to_owned(),
            lease_expires_at,
            gpus,
            samples: None,
            unavailable: None,
        };
        let txn = self.begin().await?;
        crate::beats::write_in(&txn, self, std::slice::from_ref(&beat)).await?;
        self.commit(txn).await?;
        self.node(node_id).await
    }

    async fn node(&self, id: &str) -> Result<Node, StoreError> {
        let m = nodes::Entity::find_by_id(id.to_owned())
            .one(&self.db)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("node {id}")))?;
        let gpus = self.gpus_of(&m.id).await?;
        Ok(to_domain(m, gpus))
    }

    async fn node_by_certificate(
        &self,
        serial: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Node>, StoreError> {
        let current = Query::select()
            .column(node_certificates::Column::NodeId)
            .from(node_certificates::Entity)
            .and_where(node_certificates::Column::Serial.eq(serial))
            .and_where(node_certificates::Column::RevokedAt.is_null())
            .and_where(node_certificates::Column::ExpiresAt.gt(now))
            .to_owned();
        let gpus_of_node: RelationDef = gpus::Entity::belongs_to(nodes::Entity)
            .from(gpus::Column::NodeId)
            .to(nodes::Column::Id)
            .into();
        let rows = nodes::Entity::find()
            .select_also(gpus::Entity)
            .join_rev(JoinType::LeftJoin, gpus_of_node)
            .filter(nodes::Column::Id.in_subquery(current))
            .order_by_asc(gpus::Column::Idx)
            .all(&self.db)
            .await?;
        let mut node = None;
        let mut gpus = Vec::new();
        for (n, g) in rows {
            node.get_or_insert(n);
            if let Some(g) = g {
                gpus.push(gpu_to_domain(g)?);
            }
        }
        Ok(node.map(|n| to_domain(n, gpus)))
    }

    async fn set_node_admin(
        &self,
        ctx: &AuditContext,
        id: &str,
        change: NodeAdmin,
    ) -> Result<Node, StoreError> {
        let before = self.node(id).await?;
        let mut cordoned = before.cordoned;
        let mut drained = before.drained_gpus.clone();
        let mut labels = before.labels.clone();
        let mut drain = before.drain.clone();
        match &change {
            NodeAdmin::Label(changes) => {
                for (k, v) in changes {
                    match v {
                        Some(v) => labels.insert(k.clone(), v.clone()),
                        None => labels.remove(k),
                    };
                }
            }
            NodeAdmin::Cordon => cordoned = true,
            NodeAdmin::Uncordon => {
                cordoned = false;
                drain = None;
            }
            NodeAdmin::Drain(d) => {
                cordoned = true;
                drain = Some(d.clone());
            }
            NodeAdmin::DrainGpu(uuid) | NodeAdmin::ReturnGpu(uuid)
                if !before.gpus.iter().any(|g| g.uuid == *uuid) =>
            {
                return Err(StoreError::NotFound(format!(
                    "GPU {uuid} on node {}",
                    before.name
                )));
            }
            NodeAdmin::DrainGpu(uuid) => {
                if !drained.contains(uuid) {
                    drained.push(uuid.clone());
                }
            }
            NodeAdmin::ReturnGpu(uuid) => drained.retain(|g| g != uuid),
        }
        let txn = self.begin().await?;
        let row = nodes::Entity::update(nodes::ActiveModel {
            id: Set(before.id.clone()),
            cordoned: Set(cordoned),
            drain_reason: Set(drain.as_ref().map(|d| d.reason.clone())),
            drain_deadline: Set(drain.as_ref().map(|d| d.deadline)),
            drained_gpus: Set(serde_json::to_string(&drained)
                .map_err(|e| StoreError::Corrupt(format!("drained_gpus: {e}")))?),
            labels: Set(serde_json::to_string(&labels)
                .map_err(|e| StoreError::Corrupt(format!("labels: {e}")))?),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
        let event = AuditEvent::success(SYSTEM_LOG, change.action(), format!("node/{}", before.id))
            .before(serde_json::json!({ "cordoned": before.cordoned, "drain": before.drain, "drained_gpus": before.drained_gpus, "labels": before.labels }))
            .after(serde_json::json!({ "cordoned": cordoned, "drain": drain, "drained_gpus": drained, "labels": labels }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(to_domain(row, before.gpus))
    }

    async fn list_nodes(&self) -> Result<Vec<Node>, StoreError> {
        let rows = nodes::Entity::find()
            .order_by_asc(nodes::Column::Name)
            .all(&self.db)
            .await?;
        let mut by_node: HashMap<String, Vec<GpuDevice>> = HashMap::new();
        for g in gpus::Entity::find()
            .order_by_asc(gpus::Column::Idx)
            .all(&self.db)
            .await?
        {
            let node = g.node_id.clone();
            by_node.entry(node).or_default().push(gpu_to_domain(g)?);
        }
        let mut nodes: Vec<Node> = rows
            .into_iter()
            .map(|m| {
                let gpus = by_node.remove(&m.id).unwrap_or_default();
                to_domain(m, gpus)
            })
            .collect();
        // As people count: node-2 before node-10.
        nodes.sort_by(|a, b| allot_domain::node::natural_order(&a.name, &b.name));
        Ok(nodes)
    }

    async fn count_ready_nodes(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        Ok(nodes::Entity::find()
            .filter(nodes::Column::LeaseExpiresAt.gt(now))
            .count(&self.db)
            .await?)
    }
}
