use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "sign_ins")]
pub struct Model {
    /// SHA-256 (hex) of the sign-in's `state`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub state_hash: String,
    /// The PKCE verifier, the nonce and where to return, sealed under the secrets key.
    #[sea_orm(column_type = "Text")]
    pub sealed: String,
    pub started_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
