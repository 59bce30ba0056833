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
    #[sea_orm(column_type = "Text")]
    pub body: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
