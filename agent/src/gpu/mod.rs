//! GPU backends: what GPUs a node has and how healthy they are.
//!
//! The agent talks to GPUs only through [`GpuBackend`]. The simulated backend serves
//! development and tests; the NVML backend drives real machines behind the same trait.

mod nvml;
mod nvml_raw;
mod sim;

pub use nvml::{GpuReport, MachineReport, NvmlBackend};
pub use nvml_raw::{GiProfile, RemappedRows};
pub use sim::{
    PROCESS_MEMORY_FILE_PREFIX, SimBackend, SimSpecError, XID_FILE_PREFIX, fake_gpu_busy_ns,
};

use serde::{Deserialize, Serialize};

/// One GPU as the backend sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub uuid: String,
    pub index: u32,
    pub model: String,
    pub memory_bytes: u64,
    pub healthy: bool,
    /// Suspect but working (e.g. ECC counters rising): keeps its jobs, takes no new work.
    pub degraded: bool,
    /// Its NVLink domain (GPUs of one talk over NVLink or NVSwitch); None: no NVLink.
    pub nvlink_domain: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("GPU backend failed: {0}")]
    Failed(String),
}

pub use allot_domain::GpuSample;

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
    /// MIG partitioning, where the backend can do it.
    fn mig(&self) -> Option<&dyn MigBackend> {
        None
    }
    /// What the GPU with this index is doing now, given the share of it the agent's jobs
    /// hold (`load`, 0 to 1): measured by the driver, or synthesized by the simulator.
    fn sample(&self, index: u32, load: f64) -> Option<GpuSample> {
        let _ = (index, load);
        None
    }
    /// The GPU memory each process holds on the GPU with this index, by the driver's
    /// count: `(pid, bytes)`. `None` where the backend cannot tell.
    fn process_memory(&self, index: u32) -> Option<Vec<(u32, u64)>> {
        let _ = index;
        None
    }
    /// The NVIDIA driver's version (`550.54.15`), where there is one.
    fn driver_version(&self) -> Option<String> {
        None
    }
    /// The share of the time since the last call (or of the driver's last sample period)
    /// the GPU with this index ran kernels, 0 to 1; `None` where the backend cannot tell.
    fn busy(&self, index: u32) -> Option<f64> {
        let _ = index;
        None
    }
    /// Variables a job on these GPUs (`gpu_uuids`) needs to reach them, beside
    /// `CUDA_VISIBLE_DEVICES`: none for real GPUs; for simulated ones, what ties the fake
    /// driver a job loads to the node's simulated GPUs.
    fn job_env(&self, gpu_uuids: &[String]) -> Vec<(String, String)> {
        let _ = gpu_uuids;
        Vec::new()
    }
}

/// A MIG GPU instance (with its one compute instance) as the backend reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// The GPU-instance profile id (see `allot_domain::mig`).
    pub profile: u32,
    /// The first memory slice it occupies.
    pub start: u8,
    /// `MIG-…`: what `CUDA_VISIBLE_DEVICES` names for a job on it.
    pub uuid: String,
}

/// MIG partitioning, for backends whose GPUs support it. Instances are always created at an
/// explicit placement (start slice), never where the driver would choose.
pub trait MigBackend: Send + Sync {
    /// The GPU's instances, by start; `None` when the GPU has no MIG.
    fn mig_instances(&self, index: u32) -> Result<Option<Vec<MigInstance>>, BackendError>;
    /// Creates a GPU instance of `profile` at `start` and its compute instance.
    fn create_instance(
        &self,
        index: u32,
        profile: u32,
        start: u8,
    ) -> Result<MigInstance, BackendError>;
    /// Destroys the instance at `start`: its compute instance first, then the GPU instance.
    fn destroy_instance(&self, index: u32, start: u8) -> Result<(), BackendError>;
}
