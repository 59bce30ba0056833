//! The API's wire types: request bodies (strict: unknown fields are rejected) and responses,
//! one module per resource, all re-exported here.

mod access;
mod jobs;
mod nodes;
mod secrets;
mod tenants;
mod usage;

pub use access::*;
pub use jobs::*;
pub use nodes::*;
pub use secrets::*;
pub use tenants::*;
pub use usage::*;
