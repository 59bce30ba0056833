use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "nodes")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    #[sea_orm(unique)]
    pub name: String,
    /// The serial of the node's latest certificate. (The column once held the hash of a
    /// node secret, which certificates replaced.)
    #[sea_orm(unique, column_name = "secret_hash")]
    pub latest_cert_serial: String,
    pub agent_version: String,
    pub gpu_backend: String,
    pub runtime: String,
    pub registered_at: DateTimeUtc,
    pub last_heartbeat_at: DateTimeUtc,
    pub lease_expires_at: DateTimeUtc,
    pub cpu_milli: i64,
    pub memory_bytes: i64,
    pub cordoned: bool,
    /// Why an operator drained it (none: not drained, or cordoned only).
    pub drain_reason: Option<String>,
    /// Until when its jobs may finish before they are requeued elsewhere.
    pub drain_deadline: Option<DateTimeUtc>,
    /// JSON array of GPU UUIDs.
    #[sea_orm(column_type = "Text")]
    pub drained_gpus: String,
    /// Where other nodes reach it (empty: not said).
    pub address: String,
    /// JSON object of label names to values.
    #[sea_orm(column_type = "Text")]
    pub labels: String,
    /// Why its agent says it takes no new work (empty: it takes work).
    #[sea_orm(column_type = "Text")]
    pub unavailable: String,
    /// JSON array of the GPU UUIDs it may report (`allot_domain::Node::approved_gpus`);
    /// NULL for a node registered before they were recorded.
    #[sea_orm(column_type = "Text", nullable)]
    pub approved_gpus: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
