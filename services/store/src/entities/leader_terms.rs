use sea_orm::entity::prelude::*;

/// One term of leadership: written when the lease is taken, never changed.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "leader_terms")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub epoch: i64,
    /// The replica that took the lease.
    pub holder: String,
    /// Which process of it.
    pub instance: String,
    pub started_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
