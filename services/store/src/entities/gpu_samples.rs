use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "gpu_samples")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub gpu_uuid: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub resolution_secs: i32,
    #[sea_orm(primary_key, auto_increment = false)]
    pub at: DateTimeUtc,
    pub node_id: String,
    pub utilization_sum: f64,
    pub memory_used_sum: f64,
    pub power_sum: f64,
    pub temperature_sum: f64,
    pub pcie_rx_sum: f64,
    pub pcie_tx_sum: f64,
    pub nvlink_rx_sum: f64,
    pub nvlink_tx_sum: f64,
    pub throttle_mask: i64,
    pub ecc_corrected: i64,
    pub ecc_uncorrected: i64,
    pub count: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
