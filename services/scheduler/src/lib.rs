//! Scheduling: which pending job goes where, which borrowers make way, and why the others
//! wait.
//!
//! Pure functions over snapshots; no IO, no clock. `quota` holds the hierarchical quota
//! arithmetic, `engine` the pass that decides quotas and placement together, `openb` the
//! cluster model, the placement policies (Allot's own and the published baselines) and the
//! openb benchmark, and `live` the control plane's pass over the store's nodes, tenants and
//! jobs.

pub mod admission;
pub mod engine;
pub mod estimate;
pub mod live;
pub mod mig;
pub mod openb;
pub mod quota;
pub mod resize;
#[cfg(test)]
mod testing;

pub use live::{LIVE_POLICIES, LiveDecision, LiveError, LiveScheduler, Snapshot};
