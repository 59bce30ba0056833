//! Allot's domain model: tenants, quotas, jobs and their state machine, API-token roles,
//! GPU inventory and the validation rules for all of them.
//!
//! This crate has no HTTP, database or gRPC dependency. Everything here is plain data and
//! pure functions, so the API, the store, the scheduler and the agent agree on one model.

pub mod accounting;
pub mod audit;
pub mod clock;
pub mod error;
pub mod gang;
pub mod holding;
pub mod identity;
pub mod image;
pub mod isolation;
pub mod job;
pub mod joblog;
pub mod mig;
pub mod network;
pub mod node;
pub mod quantity;
pub mod report;
pub mod secret;
pub mod tenant;
pub mod token;
pub mod volume;
pub mod workflow;
pub mod xid;

pub use audit::{
    Actor, ActorKind, AuditContext, AuditEntry, AuditEvent, LegalHold, Outcome, SYSTEM_LOG,
};
pub use clock::{Clock, FixedClock, SystemClock};
pub use error::{FieldError, ValidationError};
pub use holding::{GangSize, GpuParts, Held, TenantFigures, TenantTotals};
pub use identity::{BindingSubject, Session, StoredBinding, User};
pub use image::{ImageRef, PullSecret, RegistryCredential, TenantPolicy};
pub use isolation::{
    BEST_EFFORT_MILLI, GpuCompute, Isolation, PRIORITY_CLASSES, PRIORITY_RANGE, WorkloadClass,
    parse_priority,
};
pub use job::{
    AVOID_FOR_SECS, Avoid, GPU_MILLI, GpuSizing, Job, JobEvent, JobNetwork, JobSpec, JobState,
    MAX_REPLICAS, MIN_SIZED_GPU_MILLI, MOVE_AVOID_SECS, Pack, PendingReason, Replica, Share,
    TransitionError,
};
pub use network::{EgressRule, NetworkPolicy, PortRange};
pub use node::{GpuDevice, GpuSample, MemoryEnforcement, MigSlot, Node, NodeStatus};
pub use quantity::{
    format_bytes, format_clock, format_duration, format_gpus, format_milli, parse_bytes,
    parse_memory,
};
pub use secret::{SecretUse, SecretValue, TenantSecret};
pub use tenant::{
    EffectiveJobLimits, JobLimits, Quota, ResourceLimits, Resources, Tenant, TenantName,
};
pub use token::{ApiToken, Role, RoleBinding};
pub use volume::{Volume, VolumeMount};
pub use xid::{XidClass, classify as classify_xid};
