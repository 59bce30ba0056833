//! Simulated GPUs, described as `8xH200` or `2xH200,1xT4`.

use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::{BackendError, GpuBackend, GpuInfo};

const GIB: u64 = 1 << 30;

/// Models the simulator knows, with their memory as the driver reports it.
const MODELS: &[(&str, u64)] = &[
    ("H200", 141 * GIB),
    ("H100", 80 * GIB),
    ("A100-80GB", 80 * GIB),
    ("A100-40GB", 40 * GIB),
    ("L40S", 48 * GIB),
    ("L4", 24 * GIB),
    ("T4", 16 * GIB),
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SimSpecError {
    #[error("`{0}` is not COUNTxMODEL (e.g. 4xH200)")]
    Shape(String),
    #[error("unknown GPU model `{model}` (known: {known})")]
    Model { model: String, known: String },
    #[error("GPU count in `{0}` must be between 0 and 64")]
    Count(String),
}

#[derive(Debug)]
pub struct SimBackend {
    gpus: Mutex<Vec<GpuInfo>>,
}

impl SimBackend {
    /// Builds the devices from `spec`; UUIDs derive from the node name and index, so they are
    /// stable across restarts and distinct across nodes.
    pub fn from_spec(spec: &str, node_name: &str) -> Result<Self, SimSpecError> {
        let mut gpus = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (count, model) = part
                .split_once(['x', 'X'])
                .ok_or_else(|| SimSpecError::Shape(part.to_owned()))?;
            let count: u32 = count
                .trim()
                .parse()
                .map_err(|_| SimSpecError::Shape(part.to_owned()))?;
            if count > 64 {
                return Err(SimSpecError::Count(part.to_owned()));
            }
            let model = model.trim();
            let &(name, memory) = MODELS
                .iter()
                .find(|(m, _)| m.eq_ignore_ascii_case(model))
                .ok_or_else(|| SimSpecError::Model {
                    model: model.to_owned(),
                    known: MODELS.iter().map(|m| m.0).collect::<Vec<_>>().join(", "),
                })?;
            for _ in 0..count {
                let index = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
                gpus.push(GpuInfo {
                    uuid: sim_uuid(node_name, index),
                    index,
                    model: name.to_owned(),
                    memory_bytes: memory,
                    healthy: true,
                });
            }
        }
        Ok(Self {
            gpus: Mutex::new(gpus),
        })
    }

    /// Marks a GPU healthy or not, as a fault would.
    pub fn set_healthy(&self, index: u32, healthy: bool) {
        let mut gpus = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = gpus.iter_mut().find(|g| g.index == index) {
            g.healthy = healthy;
        }
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, like NVML's, from a hash of node and index.
fn sim_uuid(node: &str, index: u32) -> String {
    let h = hex::encode(Sha256::digest(format!("{node}/{index}").as_bytes()));
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        Ok(self.gpus.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counts_and_models() {
        let b = SimBackend::from_spec("2xH200, 1xt4", "n1").expect("valid");
        let inv = b.inventory().expect("inventory");
        assert_eq!(inv.len(), 3);
        assert_eq!(inv[0].model, "H200");
        assert_eq!(inv[0].memory_bytes, 141 * GIB);
        assert_eq!(inv[2].model, "T4");
        assert_eq!(inv[2].index, 2);
        assert!(inv[0].uuid.starts_with("GPU-") && inv[0].uuid.len() == 40);
    }

    #[test]
    fn uuids_differ_between_nodes_and_are_stable() {
        let a = SimBackend::from_spec("1xH200", "a").expect("valid");
        let b = SimBackend::from_spec("1xH200", "b").expect("valid");
        let a2 = SimBackend::from_spec("1xH200", "a").expect("valid");
        let uuid = |x: &SimBackend| x.inventory().expect("inv")[0].uuid.clone();
        assert_ne!(uuid(&a), uuid(&b));
        assert_eq!(uuid(&a), uuid(&a2));
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(matches!(
            SimBackend::from_spec("H200", "n"),
            Err(SimSpecError::Shape(_))
        ));
        assert!(matches!(
            SimBackend::from_spec("2xB999", "n"),
            Err(SimSpecError::Model { .. })
        ));
        assert!(matches!(
            SimBackend::from_spec("100xH200", "n"),
            Err(SimSpecError::Count(_))
        ));
    }

    #[test]
    fn health_can_change() {
        let b = SimBackend::from_spec("2xH200", "n").expect("valid");
        b.set_healthy(1, false);
        assert!(!b.inventory().expect("inv")[1].healthy);
    }
}
