use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "bootstrap_tokens")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    #[sea_orm(unique)]
    pub secret_hash: String,
    pub description: String,
    pub created_by: String,
    pub created_at: DateTimeUtc,
    pub expires_at: DateTimeUtc,
    pub used_at: Option<DateTimeUtc>,
    pub used_by: Option<String>,
    /// The key the registration it admitted was for (hex SHA-256 of its subject public key
    /// info): a retry of that registration must prove it holds the same key.
    pub used_key: Option<String>,
    /// The node name it admits, or a pattern with `*` (empty: none).
    pub node_name: String,
    /// It may take over the name of a node already registered.
    pub replace_existing: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
