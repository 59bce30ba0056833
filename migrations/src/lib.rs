//! The database schema, as ordered migrations. The schema changes only through here.

pub use sea_orm_migration::prelude::*;

mod columns;
mod m20261129_000001_initial;
mod m20261130_000001_audit;
mod m20261130_000002_audit_checkpoints;
mod m20261201_000001_scheduling;
mod m20261201_000002_retries;
mod m20261201_000003_node_admin;
mod m20261201_000004_checkpoints;
mod m20261202_000001_identity;
mod m20261202_000002_sessions;
mod m20261202_000003_gpu_degraded;
mod m20261203_000001_node_enrollment;
mod m20261203_000002_mig;
mod m20261203_000003_budgets;
mod m20261203_000004_gpu_samples;
mod m20261203_000005_traceparent;
mod m20261203_000006_anti_affinity;
mod m20261204_000001_gpu_compute;
mod m20261204_000002_gpu_sample_signals;
mod m20261204_000003_job_samples;
mod m20261204_000004_resize;
mod m20261205_000001_containers;
mod m20261206_000001_volumes;
mod m20261206_000002_bootstrap_binding;
mod m20261207_000001_tenant_secrets;
mod m20261208_000001_job_logs;
mod m20261209_000001_tenant_deletion;
mod m20261209_000002_job_time_limits;
mod m20261209_000003_sign_ins;
mod m20261210_000001_gangs;
mod m20261210_000002_topology;
mod m20261210_000003_auth_failures;
mod m20261210_000004_fair_share;
mod m20261211_000001_leader_lease;
mod m20261212_000001_jobs_changed;
mod m20261212_000002_tenants_version;
mod m20261213_000001_gpus_by_node;
mod m20261214_000001_node_unavailable;
mod m20261214_000002_network_policy;
mod m20261214_000003_job_limits;
mod m20261214_000004_approved_gpus;
mod m20261214_000005_job_short_ids;
mod m20261215_000001_gpu_sizing;
mod m20261216_000001_bootstrap_retry;
mod m20261217_000001_default_gpu_share;
mod m20261217_000002_replica_instance;
mod m20261218_000001_writer_epoch;
mod m20261218_000002_leader_memory;
mod m20261219_000001_job_workflows;
mod m20261219_000002_node_drains;
mod m20261219_000003_log_times;
mod roles;

pub use roles::{APPEND_ONLY_TABLES, BadRoleName, postgres_app_role_grants};

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261129_000001_initial::Migration),
            Box::new(m20261130_000001_audit::Migration),
            Box::new(m20261130_000002_audit_checkpoints::Migration),
            Box::new(m20261201_000001_scheduling::Migration),
            Box::new(m20261201_000002_retries::Migration),
            Box::new(m20261201_000003_node_admin::Migration),
            Box::new(m20261201_000004_checkpoints::Migration),
            Box::new(m20261202_000001_identity::Migration),
            Box::new(m20261202_000002_sessions::Migration),
            Box::new(m20261202_000003_gpu_degraded::Migration),
            Box::new(m20261203_000001_node_enrollment::Migration),
            Box::new(m20261203_000002_mig::Migration),
            Box::new(m20261203_000003_budgets::Migration),
            Box::new(m20261203_000004_gpu_samples::Migration),
            Box::new(m20261203_000005_traceparent::Migration),
            Box::new(m20261203_000006_anti_affinity::Migration),
            Box::new(m20261204_000001_gpu_compute::Migration),
            Box::new(m20261204_000002_gpu_sample_signals::Migration),
            Box::new(m20261204_000003_job_samples::Migration),
            Box::new(m20261204_000004_resize::Migration),
            Box::new(m20261205_000001_containers::Migration),
            Box::new(m20261206_000001_volumes::Migration),
            Box::new(m20261206_000002_bootstrap_binding::Migration),
            Box::new(m20261207_000001_tenant_secrets::Migration),
            Box::new(m20261208_000001_job_logs::Migration),
            Box::new(m20261209_000001_tenant_deletion::Migration),
            Box::new(m20261209_000002_job_time_limits::Migration),
            Box::new(m20261209_000003_sign_ins::Migration),
            Box::new(m20261210_000001_gangs::Migration),
            Box::new(m20261210_000002_topology::Migration),
            Box::new(m20261210_000003_auth_failures::Migration),
            Box::new(m20261210_000004_fair_share::Migration),
            Box::new(m20261211_000001_leader_lease::Migration),
            Box::new(m20261212_000001_jobs_changed::Migration),
            Box::new(m20261212_000002_tenants_version::Migration),
            Box::new(m20261213_000001_gpus_by_node::Migration),
            Box::new(m20261214_000001_node_unavailable::Migration),
            Box::new(m20261214_000002_network_policy::Migration),
            Box::new(m20261214_000003_job_limits::Migration),
            Box::new(m20261214_000004_approved_gpus::Migration),
            Box::new(m20261214_000005_job_short_ids::Migration),
            Box::new(m20261215_000001_gpu_sizing::Migration),
            Box::new(m20261216_000001_bootstrap_retry::Migration),
            Box::new(m20261217_000001_default_gpu_share::Migration),
            Box::new(m20261217_000002_replica_instance::Migration),
            Box::new(m20261218_000001_writer_epoch::Migration),
            Box::new(m20261218_000002_leader_memory::Migration),
            Box::new(m20261219_000001_job_workflows::Migration),
            Box::new(m20261219_000002_node_drains::Migration),
            Box::new(m20261219_000003_log_times::Migration),
        ]
    }
}
