//! MIG layouts: the agent makes a GPU's instances match the layout it was given, and
//! recreates the stored layouts when it starts again (instances do not survive a driver
//! reload, and the simulator's none of a restart).
//!
//! Reconciling destroys instances that are not wanted (each compute instance before its GPU
//! instance, inside [`MigBackend::destroy_instance`]) and refuses if any of them runs a job;
//! then it creates the missing ones, each at its explicit start slice. A layout the board's
//! geometry does not allow is refused before anything changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use allot_domain::mig::{MigError, geometry};

use crate::gpu::{BackendError, GpuInfo, MigBackend, MigInstance};

/// A layout: (GPU-instance profile id, start slice) per instance.
pub type Layout = Vec<(u32, u8)>;

#[derive(Debug, thiserror::Error)]
pub enum MigReconcileError {
    #[error("GPU {0} has no MIG")]
    NoMig(String),
    #[error("GPU {gpu}: layout refused: {error}")]
    Invalid { gpu: String, error: MigError },
    #[error("GPU {gpu}: instance {instance} runs a job; not repartitioning")]
    Busy { gpu: String, instance: String },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("{0}: {1}")]
    Store(PathBuf, String),
}

fn sorted(mut layout: Layout) -> Layout {
    layout.sort_by_key(|&(_, start)| start);
    layout
}

/// Makes `gpu`'s instances match `desired`; `busy` says whether an instance (by UUID) runs a
/// job. Returns the instances as they are afterwards.
pub fn reconcile(
    backend: &dyn MigBackend,
    gpu: &GpuInfo,
    desired: &[(u32, u8)],
    busy: &dyn Fn(&str) -> bool,
) -> Result<Vec<MigInstance>, MigReconcileError> {
    let g = geometry(&gpu.model, Some(gpu.memory_bytes / (1 << 20)))
        .ok_or_else(|| MigReconcileError::NoMig(gpu.uuid.clone()))?;
    g.validate(desired)
        .map_err(|error| MigReconcileError::Invalid {
            gpu: gpu.uuid.clone(),
            error,
        })?;
    let current = backend
        .mig_instances(gpu.index)?
        .ok_or_else(|| MigReconcileError::NoMig(gpu.uuid.clone()))?;
    let unwanted: Vec<&MigInstance> = current
        .iter()
        .filter(|i| !desired.contains(&(i.profile, i.start)))
        .collect();
    if let Some(i) = unwanted.iter().find(|i| busy(&i.uuid)) {
        return Err(MigReconcileError::Busy {
            gpu: gpu.uuid.clone(),
            instance: i.uuid.clone(),
        });
    }
    for i in &unwanted {
        backend.destroy_instance(gpu.index, i.start)?;
    }
    for &(profile, start) in &sorted(desired.to_vec()) {
        if !current
            .iter()
            .any(|i| (i.profile, i.start) == (profile, start))
        {
            backend.create_instance(gpu.index, profile, start)?;
        }
    }
    Ok(backend.mig_instances(gpu.index)?.unwrap_or_default())
}

/// The layouts this agent was told to keep, by GPU UUID, in `<data dir>/mig-layouts.json`.
#[derive(Debug, Clone)]
pub struct LayoutStore {
    path: PathBuf,
}

impl LayoutStore {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            path: data_dir.join("mig-layouts.json"),
        }
    }

    pub fn load(&self) -> Result<BTreeMap<String, Layout>, MigReconcileError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| MigReconcileError::Store(self.path.clone(), e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(MigReconcileError::Store(self.path.clone(), e.to_string())),
        }
    }

    /// Remembers `layout` for `gpu` (written to a temporary file, then renamed over).
    pub fn save(&self, gpu: &str, layout: &[(u32, u8)]) -> Result<(), MigReconcileError> {
        let mut all = self.load()?;
        all.insert(gpu.to_owned(), sorted(layout.to_vec()));
        let err =
            |e: &dyn std::fmt::Display| MigReconcileError::Store(self.path.clone(), e.to_string());
        let bytes = serde_json::to_vec_pretty(&all).map_err(|e| err(&e))?;
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, bytes).map_err(|e| err(&e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| err(&e))
    }
}

/// Applies `layout` to `gpu` and remembers it, so that it is recreated after a restart.
pub fn apply(
    backend: &dyn MigBackend,
    store: &LayoutStore,
    gpu: &GpuInfo,
    layout: &[(u32, u8)],
    busy: &dyn Fn(&str) -> bool,
) -> Result<Vec<MigInstance>, MigReconcileError> {
    let actual = reconcile(backend, gpu, layout, busy)?;
    store.save(&gpu.uuid, layout)?;
    Ok(actual)
}

/// Recreates every stored layout on the GPUs present (at agent start, before any job runs).
/// Returns the GPUs whose layout could not be recreated, with why.
pub fn restore(
    backend: &dyn MigBackend,
    store: &LayoutStore,
    gpus: &[GpuInfo],
) -> Result<Vec<(String, MigReconcileError)>, MigReconcileError> {
    let mut failures = Vec::new();
    for (uuid, layout) in store.load()? {
        let Some(gpu) = gpus.iter().find(|g| g.uuid == uuid) else {
            continue;
        };
        if let Err(e) = reconcile(backend, gpu, &layout, &|_| false) {
            failures.push((uuid, e));
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests;
