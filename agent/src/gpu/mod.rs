//! GPU backends: what GPUs a node has and how healthy they are.
//!
//! The agent talks to GPUs only through [`GpuBackend`]. The simulated backend serves
//! development and tests; the NVML backend for real machines plugs in behind the same trait.

mod sim;

pub use sim::{SimBackend, SimSpecError, XID_FILE_PREFIX};

/// One GPU as the backend sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub uuid: String,
    pub index: u32,
    pub model: String,
    pub memory_bytes: u64,
    pub healthy: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("GPU backend failed: {0}")]
    Failed(String),
}

/// Something the driver reported about a GPU since the last look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuEvent {
    /// An XID error on the GPU with this index (see `allot_domain::xid`).
    Xid { index: u32, code: u32 },
}

pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// `simulated`, `nvml`, …: reported to the control plane.
    fn kind(&self) -> &'static str;
    /// Current inventory, with health.
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError>;
    /// Events since the last call, oldest first.
    fn take_events(&self) -> Vec<GpuEvent> {
        Vec::new()
    }
}
