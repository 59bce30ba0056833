use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "jobs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub state: String,
    pub gpus: i32,
    pub gpu_memory_bytes: Option<i64>,
    /// JSON array of strings.
    #[sea_orm(column_type = "Text")]
    pub command: String,
    /// JSON object of strings.
    #[sea_orm(column_type = "Text")]
    pub env: String,
    #[sea_orm(column_type = "Text", nullable)]
    pub workdir: Option<String>,
    pub pending_code: Option<String>,
    #[sea_orm(column_type = "Text", nullable)]
    pub pending_message: Option<String>,
    pub node_id: Option<String>,
    /// JSON array of GPU UUIDs.
    #[sea_orm(column_type = "Text")]
    pub gpu_uuids: String,
    pub cancel_requested: bool,
    pub pid: Option<i64>,
    pub exit_code: Option<i32>,
    #[sea_orm(column_type = "Text", nullable)]
    pub message: Option<String>,
    #[sea_orm(column_type = "Text", nullable)]
    pub log_tail: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub scheduled_at: Option<DateTimeUtc>,
    pub started_at: Option<DateTimeUtc>,
    pub finished_at: Option<DateTimeUtc>,
    pub cpu_milli: i32,
    pub memory_bytes: i64,
    pub gpu_milli: Option<i32>,
    /// JSON array of model names.
    #[sea_orm(column_type = "Text")]
    pub gpu_models: String,
    pub priority: i32,
    pub preemptible: bool,
    pub isolation: Option<String>,
    pub workload_class: Option<String>,
    pub held_gpu_milli: Option<i32>,
    pub borrowing: bool,
    pub attempt: i32,
    #[sea_orm(column_type = "Text", nullable)]
    pub preempt_reason: Option<String>,
    pub max_retries: i32,
    pub failures: i32,
    pub retry_at: Option<DateTimeUtc>,
    #[sea_orm(column_type = "Text", nullable)]
    pub checkpoint_dir: Option<String>,
    pub mig_profile: Option<String>,
    /// `strict` or `elastic`, for a share of a GPU.
    pub gpu_compute: Option<String>,
    pub gpu_resizable: bool,
    /// The most share (milli) of a job whose share Allot sizes; null: not sized.
    pub gpu_auto_max_milli: Option<i32>,
    /// Whether Allot sizes the job's GPU memory limit.
    pub gpu_memory_auto: bool,
    pub image: Option<String>,
    pub image_digest: Option<String>,
    pub network: String,
    /// JSON array of `allot_domain::VolumeMount`.
    #[sea_orm(column_type = "Text")]
    pub volumes: String,
    /// JSON array of `allot_domain::SecretUse`: references, never values.
    #[sea_orm(column_type = "Text")]
    pub secrets: String,
    pub traceparent: Option<String>,
    pub avoid_node_id: Option<String>,
    /// JSON array of GPU UUIDs.
    #[sea_orm(column_type = "Text", nullable)]
    pub avoid_gpus: Option<String>,
    pub avoid_until: Option<DateTimeUtc>,
    /// The longest an attempt may run, in seconds.
    pub time_limit_secs: Option<i64>,
    /// How many replicas the job (a gang when more than 1) has.
    pub replicas: i32,
    /// For a replica of a gang: the gang's id (its replica 0's job id).
    pub gang_id: Option<String>,
    pub replica_rank: i32,
    /// JSON `allot_domain::Pack`; NULL: none.
    #[sea_orm(column_type = "Text", nullable)]
    pub pack: Option<String>,
    /// The epoch of the leader handle that last wrote the row; NULL when the last writer
    /// was no leader handle (a submit, a cancel through any replica).
    pub writer_epoch: Option<i64>,
    /// Who submitted it (a person's or a token's name).
    pub submitted_by: Option<String>,
    /// For a task of an array: the array's id (its first task's job id), the task's index,
    /// and the array as submitted (`0-199%16`).
    pub array_id: Option<String>,
    pub array_index: Option<i32>,
    pub array_spec: Option<String>,
    /// JSON array of `allot_domain::workflow::Dependency`.
    #[sea_orm(column_type = "Text")]
    pub dependencies: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
