use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "leader_lease")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub name: String,
    /// The replica holding it (empty before anyone did).
    pub holder: String,
    /// Which process of that replica: drawn when it starts.
    pub instance: String,
    /// Where the holder's agents' endpoint is reached.
    pub address: String,
    /// Incremented by every takeover: the fencing token.
    pub epoch: i64,
    pub expires_at: DateTimeUtc,
    pub acquired_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
