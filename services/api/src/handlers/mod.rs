//! Request handlers, one module per resource.

pub mod audit;
pub mod bindings;
pub mod enrollment;
mod grant;
pub mod health;
pub mod job_logs;
pub mod jobs;
pub mod nodes;
pub mod tenants;
pub mod tokens;
pub mod usage;
pub mod users;
pub mod volumes;
