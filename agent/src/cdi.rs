//! Container Device Interface (CDI) specs: how the devices assigned to a job get into its
//! container. NVIDIA's `nvidia-ctk cdi generate` writes a spec to `/etc/cdi` or
//! `/var/run/cdi` naming each GPU (by index, UUID, or both) and MIG device with the edits a
//! container needs for it: device nodes, driver library mounts, hooks, environment, plus
//! edits every GPU container needs (the control devices). The agent reads those specs, finds
//! the assigned devices in them, and applies the edits of exactly those devices, so nothing
//! else of the GPU driver is reachable from the container. The simulated backend writes a
//! spec of the same kind for its simulated GPUs, with device nodes it creates, so the same
//! path runs in every test.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::gpu::{GpuInfo, MigInstance};

/// The CDI kind of GPUs (NVIDIA's, which the simulator uses too).
pub const GPU_KIND: &str = "nvidia.com/gpu";

/// The directories CDI specs are read from unless configured otherwise.
pub const DEFAULT_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("{path}: {message}")]
    Spec { path: PathBuf, message: String },
    #[error("no CDI spec on this node names device {0} (see `nvidia-ctk cdi generate`)")]
    Unknown(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One spec file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default)]
    pub devices: Vec<Device>,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Where it appears in the container.
    pub path: String,
    /// Where it is on the host (the same path when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// A device node resolved against the host: what the container gets and the device
/// cgroup allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedNode {
    pub container_path: String,
    pub host_path: PathBuf,
    /// `c` or `b`.
    pub kind: char,
    pub major: i64,
    pub minor: i64,
    /// `rwm`-style access for the device cgroup.
    pub access: String,
}

/// The edits for one container: the assigned devices' and their specs' common ones,
/// without repeats, with device nodes resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    pub env: Vec<String>,
    pub nodes: Vec<ResolvedNode>,
    pub mounts: Vec<Mount>,
    pub hooks: Vec<Hook>,
}

impl Edits {
    fn add(&mut self, e: &ContainerEdits) -> Result<(), CdiError> {
        for v in &e.env {
            if !self.env.contains(v) {
                self.env.push(v.clone());
            }
        }
        for n in &e.device_nodes {
            let node = resolve(n)?;
            if !self
                .nodes
                .iter()
                .any(|x| x.container_path == node.container_path)
            {
                self.nodes.push(node);
            }
        }
        for m in &e.mounts {
            if !self.mounts.contains(m) {
                self.mounts.push(m.clone());
            }
        }
        for h in &e.hooks {
            if !self.hooks.contains(h) {
                self.hooks.push(h.clone());
            }
        }
        Ok(())
    }
}

fn resolve(n: &DeviceNode) -> Result<ResolvedNode, CdiError> {
    let host = PathBuf::from(n.host_path.as_deref().unwrap_or(&n.path));
    let (kind, major, minor) = match (n.kind.as_deref(), n.major, n.minor) {
        (Some(k), Some(major), Some(minor)) => (k.chars().next().unwrap_or('c'), major, minor),
        _ => {
            let meta = std::fs::metadata(&host).map_err(|e| CdiError::Spec {
                path: host.clone(),
                message: format!("device node: {e}"),
            })?;
            let kind = if meta.file_type().is_char_device() {
                'c'
            } else if meta.file_type().is_block_device() {
                'b'
            } else {
                return Err(CdiError::Spec {
                    path: host,
                    message: "not a device node".into(),
                });
            };
            let rdev = meta.rdev();
            (
                kind,
                i64::from(nix::sys::stat::major(rdev) as u32),
                i64::from(nix::sys::stat::minor(rdev) as u32),
            )
        }
    };
    let access = n
        .permissions
        .clone()
        .filter(|p| !p.is_empty() && p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')))
        .unwrap_or_else(|| "rw".into());
    Ok(ResolvedNode {
        container_path: n.path.clone(),
        host_path: host,
        kind,
        major,
        minor,
        access,
    })
}

/// The specs of a node, as read from its CDI directories.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    specs: Vec<(PathBuf, Spec)>,
}

impl Registry {
    /// Reads every `.json`, `.yaml` and `.yml` spec in `dirs` (missing directories are
    /// fine; a spec that does not parse is an error naming it).
    pub fn load(dirs: &[PathBuf]) -> Result<Self, CdiError> {
        let mut specs = Vec::new();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for path in paths {
                let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
                if !matches!(ext, "json" | "yaml" | "yml") {
                    continue;
                }
                let text = std::fs::read_to_string(&path)?;
                // JSON is YAML too.
                let spec: Spec = serde_yaml_ng::from_str(&text).map_err(|e| CdiError::Spec {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                specs.push((path, spec));
            }
        }
        Ok(Registry { specs })
    }

    /// The edits for the GPUs assigned to a job: each named by its UUID, or a whole GPU by
    /// its index when a spec names devices by index (`nvidia-ctk`'s default).
    pub fn edits_for(&self, gpus: &[(String, u32)]) -> Result<Edits, CdiError> {
        let mut edits = Edits::default();
        let mut common: Vec<&Path> = Vec::new();
        for (uuid, index) in gpus {
            let by_uuid = self.find(uuid);
            let found = match by_uuid {
                Some(f) => Some(f),
                None if !uuid.starts_with("MIG-") => self.find(&index.to_string()),
                None => None,
            };
            let Some((path, spec, device)) = found else {
                return Err(CdiError::Unknown(uuid.clone()));
            };
            if !common.contains(&path) {
                edits.add(&spec.container_edits)?;
                common.push(path);
            }
            edits.add(&device.container_edits)?;
        }
        Ok(edits)
    }

    fn find(&self, name: &str) -> Option<(&Path, &Spec, &Device)> {
        self.specs.iter().find_map(|(path, spec)| {
            if spec.kind != GPU_KIND {
                return None;
            }
            spec.devices
                .iter()
                .find(|d| d.name == name)
                .map(|d| (path.as_path(), spec, d))
        })
    }
}

/// The file the simulated backend writes its spec to, in `dir`.
pub const SIMULATED_SPEC: &str = "allot-simulated-gpus.json";

/// Device numbers of simulated GPUs: NVIDIA's character major for the GPUs and the control
/// device, and unused majors for UVM and MIG capabilities.
const NVIDIA_MAJOR: u64 = 195;
const SIM_UVM_MAJOR: u64 = 510;
const SIM_CAPS_MAJOR: u64 = 511;

/// Writes a CDI spec for simulated GPUs into `spec_dir`, with device nodes it creates in
/// `dev_dir` (`nvidia<index>`, `nvidiactl`, `nvidia-uvm`, and `nvidia-caps/nvidia-cap<n>`
/// for MIG instances), as `nvidia-ctk` describes a real node's. Creating device nodes needs
/// root (`CAP_MKNOD`): without it this fails, and only jobs that need no container can run.
pub fn write_simulated(
    spec_dir: &Path,
    dev_dir: &Path,
    gpus: &[GpuInfo],
    mig: &BTreeMap<u32, Vec<MigInstance>>,
) -> Result<PathBuf, CdiError> {
    std::fs::create_dir_all(dev_dir.join("nvidia-caps"))?;
    std::fs::create_dir_all(spec_dir)?;
    let node = |name: &str, major: u64, minor: u64| -> Result<DeviceNode, CdiError> {
        let host = dev_dir.join(name);
        ensure_char_device(&host, major, minor)?;
        Ok(DeviceNode {
            path: format!("/dev/{name}"),
            host_path: Some(host.display().to_string()),
            kind: Some("c".into()),
            major: Some(major as i64),
            minor: Some(minor as i64),
            permissions: Some("rw".into()),
        })
    };
    let mut devices = Vec::new();
    for g in gpus {
        let edits = ContainerEdits {
            device_nodes: vec![node(
                &format!("nvidia{}", g.index),
                NVIDIA_MAJOR,
                u64::from(g.index),
            )?],
            ..Default::default()
        };
        for name in [g.uuid.clone(), g.index.to_string()] {
            devices.push(Device {
                name,
                container_edits: edits.clone(),
            });
        }
        for (slot, i) in mig.get(&g.index).into_iter().flatten().enumerate() {
            let cap = u64::from(g.index) * 16 + slot as u64 + 1;
            let mut edits = edits.clone();
            edits.device_nodes.push(node(
                &format!("nvidia-caps/nvidia-cap{cap}"),
                SIM_CAPS_MAJOR,
                cap,
            )?);
            devices.push(Device {
                name: i.uuid.clone(),
                container_edits: edits,
            });
        }
    }
    let spec = Spec {
        cdi_version: "0.6.0".into(),
        kind: GPU_KIND.into(),
        devices,
        container_edits: ContainerEdits {
            device_nodes: vec![
                node("nvidiactl", NVIDIA_MAJOR, 255)?,
                node("nvidia-uvm", SIM_UVM_MAJOR, 0)?,
            ],
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            ..Default::default()
        },
    };
    let path = spec_dir.join(SIMULATED_SPEC);
    let tmp = spec_dir.join(format!(".{SIMULATED_SPEC}.tmp"));
    let json = serde_json::to_vec_pretty(&spec).map_err(|e| CdiError::Spec {
        path: path.clone(),
        message: e.to_string(),
    })?;
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Makes `path` a character device `major:minor`, mode 0666 (as NVIDIA's are).
fn ensure_char_device(path: &Path, major: u64, minor: u64) -> Result<(), CdiError> {
    let want = nix::sys::stat::makedev(major, minor);
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_char_device() && meta.rdev() == want {
            return Ok(());
        }
        std::fs::remove_file(path)?;
    }
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        want,
    )
    .map_err(|e| CdiError::Spec {
        path: path.to_owned(),
        message: format!("cannot create the simulated device node: {e}"),
    })?;
    // mknod is subject to the umask.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVIDIA_CTK: &str = r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      type: c
      major: 195
      minor: 0
- name: GPU-aaaa
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      type: c
      major: 195
      minor: 0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
      type: c
      major: 195
      minor: 1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
    type: c
    major: 195
    minor: 255
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
"#;

    #[test]
    fn only_the_assigned_devices_and_the_common_edits_are_applied() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("nvidia.yaml"), NVIDIA_CTK).expect("write");
        let reg = Registry::load(&[dir.path().to_owned()]).expect("load");
        let edits = reg.edits_for(&[("GPU-bbbb".into(), 1)]).expect("by index");
        let paths: Vec<&str> = edits
            .nodes
            .iter()
            .map(|n| n.container_path.as_str())
            .collect();
        assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia1"]);
        assert_eq!(edits.hooks.len(), 1);
        assert_eq!(edits.mounts.len(), 1);
        assert_eq!(edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
        let by_uuid = reg.edits_for(&[("GPU-aaaa".into(), 7)]).expect("by uuid");
        assert!(
            by_uuid
                .nodes
                .iter()
                .any(|n| n.container_path == "/dev/nvidia0")
        );
        assert!(
            !by_uuid
                .nodes
                .iter()
                .any(|n| n.container_path == "/dev/nvidia1")
        );
        match reg.edits_for(&[("MIG-cccc".into(), 0)]) {
            Err(CdiError::Unknown(d)) => assert_eq!(d, "MIG-cccc"),
            other => panic!("a MIG device is never matched by its GPU's index: {other:?}"),
        }
    }

    #[test]
    fn a_spec_that_does_not_parse_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("bad.json"), "{ not a spec").expect("write");
        match Registry::load(&[dir.path().to_owned()]) {
            Err(CdiError::Spec { path, .. }) => assert!(path.ends_with("bad.json")),
            other => panic!("{other:?}"),
        }
    }
}
