use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "audit_entries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub log_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub seq: i64,
    pub at: DateTimeUtc,
    pub leaf_hash: String,
    #[sea_orm(column_type = "Text", nullable)]
    pub body: Option<String>,
    pub actor: Option<String>,
    pub action: String,
    #[sea_orm(column_type = "Text", nullable)]
    pub target: Option<String>,
    pub outcome: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
