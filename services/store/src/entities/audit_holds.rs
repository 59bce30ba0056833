use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "audit_holds")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub log_id: String,
    #[sea_orm(column_type = "Text")]
    pub reason: String,
    pub set_by: String,
    pub set_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
