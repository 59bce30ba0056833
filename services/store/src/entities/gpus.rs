use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "gpus")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub uuid: String,
    pub node_id: String,
    pub idx: i32,
    pub model: String,
    pub memory_bytes: i64,
    pub healthy: bool,
    pub degraded: bool,
    /// JSON array of `MigSlot`; NULL when the GPU is not in MIG mode.
    #[sea_orm(column_type = "Text", nullable)]
    pub mig_layout: Option<String>,
    /// `check`, `shim` or `mig` (`allot_domain::MemoryEnforcement`).
    pub memory_enforcement: String,
    /// Its NVLink domain on its node; NULL: no NVLink.
    pub nvlink_domain: Option<i32>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
