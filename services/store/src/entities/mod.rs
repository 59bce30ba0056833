//! sea-orm entities: one module per table, mirroring `migrations/` exactly.

pub mod api_tokens;
pub mod audit_checkpoints;
pub mod audit_entries;
pub mod audit_holds;
pub mod audit_logs;
pub mod auth_failures;
pub mod bootstrap_tokens;
pub mod fair_share_usage;
pub mod gpu_samples;
pub mod gpus;
pub mod job_events;
pub mod job_logs;
pub mod job_samples;
pub mod jobs;
pub mod leader_lease;
pub mod node_certificates;
pub mod nodes;
pub mod registry_credentials;
pub mod role_bindings;
pub mod sessions;
pub mod sign_ins;
pub mod tenant_secrets;
pub mod tenants;
pub mod tenants_version;
pub mod users;
pub mod volumes;
