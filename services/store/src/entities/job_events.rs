use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "job_events")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub job_id: String,
    pub from_state: Option<String>,
    pub to_state: String,
    pub at: DateTimeUtc,
    #[sea_orm(column_type = "Text", nullable)]
    pub message: Option<String>,
    /// The share held from this event on, where it changed (placement, resize).
    pub gpu_milli: Option<i32>,
    pub gpu_memory_bytes: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
