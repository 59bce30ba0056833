//! Scheduling: which pending job goes where, which borrowers make way, and why the others
//! wait.
//!
//! Pure functions over snapshots; no IO, no clock. `quota` holds the hierarchical quota
//! arithmetic, `placement` the cluster model (nodes, requests) and the placement policies
//! (Allot's own and the published baselines), `engine` the pass that decides quotas and
//! placement together, `live` the control plane's pass over the store's nodes, tenants and
//! jobs, and `openb` the benchmark harness that replays the openb trace through the same
//! model and policies.

pub mod admission;
pub mod engine;
pub mod estimate;
pub mod fair_share;
pub mod live;
pub mod mig;
#[cfg(feature = "openb")]
pub mod openb;
pub mod placement;
pub mod quota;
pub mod resize;
#[cfg(test)]
mod testing;

pub use live::{LIVE_POLICIES, LiveDecision, LiveError, LiveScheduler, SchedulerMemory, Snapshot};
