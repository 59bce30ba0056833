use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_failures")]
pub struct Model {
    /// The client address (or `unknown`).
    #[sea_orm(primary_key, auto_increment = false)]
    pub source: String,
    pub window_start: DateTimeUtc,
    pub failures: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
