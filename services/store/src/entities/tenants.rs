use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tenants")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    #[sea_orm(unique)]
    pub name: String,
    pub max_gpu_memory_bytes: Option<i64>,
    pub parent_id: Option<String>,
    pub guaranteed_gpu_milli: i64,
    pub guaranteed_cpu_milli: i64,
    pub guaranteed_memory_bytes: i64,
    pub guaranteed_gpu_memory_bytes: i64,
    pub max_gpu_milli: Option<i64>,
    pub max_cpu_milli: Option<i64>,
    pub max_memory_bytes: Option<i64>,
    pub weight: i32,
    pub min_isolation: String,
    /// JSON object: MIG profile name to the most instances held at once.
    #[sea_orm(column_type = "Text")]
    pub mig_limits: String,
    pub gpu_hour_budget_milli: Option<i64>,
    #[sea_orm(column_type = "Text")]
    pub image_registries: String,
    pub require_confinement: bool,
    /// JSON list of egress rules (`allot_domain::EgressRule`); null: the default egress.
    #[sea_orm(column_type = "Text", nullable)]
    pub egress: Option<String>,
    pub allow_host_network: bool,
    /// Its host uid range on every node (see `allot_domain::Tenant::uid_slot`).
    #[sea_orm(unique)]
    pub uid_slot: Option<i32>,
    pub created_at: DateTimeUtc,
    /// When it was deleted: it is then gone from every list and lookup, but its row stays
    /// (its audit log, jobs and uid range keep naming it).
    pub deleted_at: Option<DateTimeUtc>,
    /// Default and most CPU (milli) and memory per job: its own setting, NULL to take its
    /// parent's (see `allot_domain::JobLimits`).
    pub job_default_cpu_milli: Option<i64>,
    pub job_default_memory_bytes: Option<i64>,
    pub job_max_cpu_milli: Option<i64>,
    pub job_max_memory_bytes: Option<i64>,
    pub job_default_gpu_milli: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
