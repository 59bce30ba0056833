//! Simulated GPUs, described as `8xH200` or `2xH200,1xT4`; `2xH200:mig` puts them in MIG
//! mode (boards with a MIG geometry only), as an administrator would a real GPU.
//!
//! NVLink: the SXM boards (A100, H100, H200) of one part share one NVSwitch domain, as on an
//! HGX board; `8xH200:nvlink=4` makes domains of four GPUs instead (NVLink islands),
//! `:nvlink=0` none; PCIe boards (L40S, L4, T4) have none.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use std::path::PathBuf;

use allot_domain::mig::{MigGeometry, geometry};

use super::{BackendError, GpuBackend, GpuEvent, GpuInfo, MigBackend, MigInstance};

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
    #[error("`{0}`: only A100, H100 and H200 boards have MIG")]
    NoMig(String),
    #[error("`{0}`: a part's flags are `mig` and `nvlink=N` (GPUs per NVLink domain)")]
    Flag(String),
}

/// Files named `xid-<gpu index>-<code>` in the fault directory inject an XID (each is
/// consumed once read): the fault-injection control for agents in other processes.
pub const XID_FILE_PREFIX: &str = "xid-";
/// A file named `ecc-<gpu index>` makes that GPU's corrected-ECC counters rise: it reports
/// itself degraded from then on.
pub const ECC_FILE_PREFIX: &str = "ecc-";

/// A file named `gpu-mem-<gpu index>-<pid>` holding a byte count says that process holds
/// that much memory on the GPU (what the driver would report for it), for as long as the
/// file and the process exist.
pub const PROCESS_MEMORY_FILE_PREFIX: &str = "gpu-mem-";

#[derive(Debug)]
pub struct SimBackend {
    gpus: Mutex<Vec<GpuInfo>>,
    /// MIG instances per GPU index, for boards with a MIG geometry.
    mig: Mutex<Vec<Option<Vec<MigInstance>>>>,
    events: Mutex<Vec<GpuEvent>>,
    fault_dir: Option<PathBuf>,
    /// Where the fake CUDA driver keeps each simulated GPU's shared state, so jobs on one
    /// GPU contend for it (`ALLOT_FAKE_CUDA_SHARED_DIR`, see docs/shim.md).
    state_dir: Option<PathBuf>,
    /// Per GPU index, the fake driver's busy count and when it was read last (`busy`).
    busy_seen: Mutex<HashMap<u32, (u64, std::time::Instant)>>,
    /// Corrected ECC errors per GPU index: they rise while a GPU is degraded.
    ecc: Mutex<Vec<u64>>,
}

impl SimBackend {
    /// Builds the devices from `spec`; UUIDs derive from the node name and index, so they are
    /// stable across restarts and distinct across nodes.
    pub fn from_spec(spec: &str, node_name: &str) -> Result<Self, SimSpecError> {
        let mut gpus = Vec::new();
        let mut mig_modes = Vec::new();
        let mut next_domain = 0u32;
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
            let mut flags = model.trim().split(':');
            let model = flags.next().unwrap_or_default().trim();
            let (mut mig_mode, mut per_domain) = (false, None);
            for flag in flags.map(str::trim) {
                if flag.eq_ignore_ascii_case("mig") {
                    mig_mode = true;
                } else if let Some(n) = flag.strip_prefix("nvlink=") {
                    per_domain = Some(
                        n.parse::<u32>()
                            .map_err(|_| SimSpecError::Flag(part.to_owned()))?,
                    );
                } else {
                    return Err(SimSpecError::Flag(part.to_owned()));
                }
            }
            let &(name, memory) = MODELS
                .iter()
                .find(|(m, _)| m.eq_ignore_ascii_case(model))
                .ok_or_else(|| SimSpecError::Model {
                    model: model.to_owned(),
                    known: MODELS.iter().map(|m| m.0).collect::<Vec<_>>().join(", "),
                })?;
            let sxm = ["A100", "H100", "H200"].iter().any(|b| name.starts_with(b));
            // GPUs per domain in this part (0: no NVLink).
            let per_domain = per_domain.unwrap_or(if sxm { count } else { 0 });
            for i in 0..count {
                let index = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
                mig_modes.push(mig_mode);
                gpus.push(GpuInfo {
                    uuid: sim_uuid(node_name, index),
                    index,
                    model: name.to_owned(),
                    memory_bytes: memory,
                    healthy: true,
                    degraded: false,
                    nvlink_domain: (per_domain > 0).then(|| next_domain + i / per_domain),
                });
            }
            if per_domain > 0 {
                next_domain += count.div_ceil(per_domain);
            }
        }
        let mig = gpus
            .iter()
            .zip(&mig_modes)
            .map(|(g, &on)| match (on, mig_geometry(g)) {
                (true, Some(_)) => Ok(Some(Vec::new())),
                (true, None) => Err(SimSpecError::NoMig(g.model.clone())),
                (false, _) => Ok(None),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            gpus: Mutex::new(gpus),
            mig: Mutex::new(mig),
            events: Mutex::new(Vec::new()),
            fault_dir: None,
            state_dir: None,
            busy_seen: Mutex::new(HashMap::new()),
            ecc: Mutex::new(Vec::new()),
        })
    }

    /// Reads injected faults from `dir` too (see [`XID_FILE_PREFIX`]).
    pub fn with_fault_dir(mut self, dir: PathBuf) -> Self {
        self.fault_dir = Some(dir);
        self
    }

    /// Jobs are told to share the simulated GPUs through state in `dir`: the fake driver
    /// they load then time-slices each GPU between them as a GPU without MPS does.
    pub fn with_state_dir(mut self, dir: PathBuf) -> Self {
        self.state_dir = Some(dir);
        self
    }

    /// Injects an XID on the GPU with this index, as the driver would report it.
    pub fn inject_xid(&self, index: u32, code: u32) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(GpuEvent::Xid { index, code });
    }

    /// XIDs injected as files, consumed.
    fn file_events(&self) -> Vec<GpuEvent> {
        let Some(dir) = &self.fault_dir else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        files
            .into_iter()
            .filter_map(|path| {
                let name = path.file_name()?.to_str()?.to_owned();
                if let Some(index) = name.strip_prefix(ECC_FILE_PREFIX) {
                    self.set_degraded(index.parse().ok()?, true);
                    std::fs::remove_file(&path).ok()?;
                    return None;
                }
                let (index, code) = name.strip_prefix(XID_FILE_PREFIX)?.split_once('-')?;
                let event = GpuEvent::Xid {
                    index: index.parse().ok()?,
                    code: code.parse().ok()?,
                };
                std::fs::remove_file(&path).ok()?;
                Some(event)
            })
            .collect()
    }

    /// Marks a GPU degraded (its corrected-ECC counters rising) or not.
    pub fn set_degraded(&self, index: u32, degraded: bool) {
        let mut gpus = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = gpus.iter_mut().find(|g| g.index == index) {
            g.degraded = degraded;
        }
    }

    /// Marks a GPU healthy or not, as a fault would.
    pub fn set_healthy(&self, index: u32, healthy: bool) {
        let mut gpus = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = gpus.iter_mut().find(|g| g.index == index) {
            g.healthy = healthy;
        }
    }
}

fn mig_geometry(g: &GpuInfo) -> Option<&'static MigGeometry> {
    geometry(&g.model, Some(g.memory_bytes / (1 << 20)))
}

fn failed(msg: impl Into<String>) -> BackendError {
    BackendError::Failed(msg.into())
}

impl SimBackend {
    fn gpu(&self, index: u32) -> Result<GpuInfo, BackendError> {
        self.inventory()?
            .into_iter()
            .find(|g| g.index == index)
            .ok_or_else(|| failed(format!("no GPU {index}")))
    }
}

/// The instances of the GPU with `index`, when it has MIG.
fn instances_of(
    mig: &mut [Option<Vec<MigInstance>>],
    index: u32,
) -> Result<&mut Vec<MigInstance>, BackendError> {
    usize::try_from(index)
        .ok()
        .and_then(|gpu| mig.get_mut(gpu))
        .and_then(Option::as_mut)
        .ok_or_else(|| failed(format!("GPU {index} has no MIG")))
}

impl MigBackend for SimBackend {
    fn mig_instances(&self, index: u32) -> Result<Option<Vec<MigInstance>>, BackendError> {
        let mig = self.mig.lock().unwrap_or_else(|e| e.into_inner());
        let gpu = usize::try_from(index).map_err(|_| failed("GPU index"))?;
        Ok(mig.get(gpu).cloned().flatten())
    }

    fn create_instance(
        &self,
        index: u32,
        profile: u32,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        let g = self.gpu(index)?;
        let geometry = mig_geometry(&g)
            .ok_or_else(|| failed(format!("GPU {index} ({}) has no MIG", g.model)))?;
        let mut mig = self.mig.lock().unwrap_or_else(|e| e.into_inner());
        let instances = instances_of(&mut mig, index)?;
        let mut layout: Vec<(u32, u8)> = instances.iter().map(|i| (i.profile, i.start)).collect();
        layout.push((profile, start));
        // The driver refuses what the geometry does not allow, and so does the simulator.
        geometry
            .validate(&layout)
            .map_err(|e| failed(format!("GPU {index}: {e}")))?;
        let instance = MigInstance {
            profile,
            start,
            uuid: uuid_like("MIG", &format!("{}/{start}/{profile}", g.uuid)),
        };
        instances.push(instance.clone());
        instances.sort_by_key(|i| i.start);
        Ok(instance)
    }

    fn destroy_instance(&self, index: u32, start: u8) -> Result<(), BackendError> {
        let mut mig = self.mig.lock().unwrap_or_else(|e| e.into_inner());
        let instances = instances_of(&mut mig, index)?;
        let before = instances.len();
        instances.retain(|i| i.start != start);
        if instances.len() == before {
            return Err(failed(format!(
                "GPU {index} has no instance at slice {start}"
            )));
        }
        Ok(())
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, like NVML's, from a hash of node and index.
fn sim_uuid(node: &str, index: u32) -> String {
    uuid_like("GPU", &format!("{node}/{index}"))
}

/// `<prefix>-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from a hash of `seed`: stable and distinct.
fn uuid_like(prefix: &str, seed: &str) -> String {
    let h = hex::encode(Sha256::digest(seed.as_bytes()));
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The time (ns) the fake CUDA driver has counted the simulated GPU `uuid` busy, from its
/// state in `dir` (the `<uuid>.gpu` page: `busy_ns`, a native-endian u64 at byte 16; see
/// `agent/shim/fake-cuda`); `None` before a job has used the GPU through it.
pub fn fake_gpu_busy_ns(dir: &std::path::Path, uuid: &str) -> Option<u64> {
    let page = std::fs::read(dir.join(format!("{uuid}.gpu"))).ok()?;
    Some(u64::from_ne_bytes(page.get(16..24)?.try_into().ok()?))
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    /// From the fake driver's own count of the GPU's busy time (its state file), since the
    /// last call; unknown before a job has used the GPU through it.
    fn busy(&self, index: u32) -> Option<f64> {
        let dir = self.state_dir.as_ref()?;
        let busy_ns = fake_gpu_busy_ns(dir, &self.gpu(index).ok()?.uuid)?;
        let now = std::time::Instant::now();
        let mut seen = self.busy_seen.lock().unwrap_or_else(|e| e.into_inner());
        let last = seen.insert(index, (busy_ns, now));
        let (before, at) = last?;
        let elapsed = now.duration_since(at).as_nanos() as f64;
        (elapsed > 0.0).then(|| (busy_ns.saturating_sub(before) as f64 / elapsed).clamp(0.0, 1.0))
    }

    /// The fake driver's device 0, 1, … are the job's GPUs, which it shares with the other
    /// jobs on them through the state directory.
    fn job_env(&self, gpu_uuids: &[String]) -> Vec<(String, String)> {
        let Some(dir) = &self.state_dir else {
            return Vec::new();
        };
        vec![
            (
                "ALLOT_FAKE_CUDA_SHARED_DIR".to_owned(),
                dir.display().to_string(),
            ),
            ("ALLOT_FAKE_CUDA_UUIDS".to_owned(), gpu_uuids.join(",")),
        ]
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        Ok(self.gpus.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Synthetic but plausible: busy in proportion to the share its jobs hold (a job keeps
    /// about 90% of its share busy), memory to match, power from idle (60 W) to its board's
    /// limit (700 W), temperature from 32 to 78 °C; PCIe traffic up to 20 GB/s each way and,
    /// on NVLink boards (the SXM H100/H200/A100 class), NVLink traffic up to 300 GB/s each
    /// way; the power cap throttles above 85% busy, the idle reason shows when idle; the
    /// corrected-ECC count rises while the GPU is degraded.
    fn sample(&self, index: u32, load: f64) -> Option<super::GpuSample> {
        let gpu = self.gpu(index).ok()?;
        let busy = (load * 0.9).clamp(0.0, 1.0);
        let nvlink = ["H100", "H200", "A100", "B200", "GH200"]
            .iter()
            .any(|m| gpu.model.to_ascii_uppercase().starts_with(m));
        let mut throttle = Vec::new();
        if busy == 0.0 {
            throttle.push("gpu_idle".to_owned());
        }
        if busy > 0.85 {
            throttle.push("sw_power_cap".to_owned());
        }
        let ecc_corrected = {
            let mut ecc = self.ecc.lock().unwrap_or_else(|e| e.into_inner());
            let i = index as usize;
            if ecc.len() <= i {
                ecc.resize(i + 1, 0);
            }
            if gpu.degraded {
                ecc[i] += 7;
            }
            ecc[i]
        };
        Some(super::GpuSample {
            utilization: busy,
            memory_used_bytes: (gpu.memory_bytes as f64 * load.clamp(0.0, 1.0) * 0.8) as u64,
            power_watts: 60.0 + 640.0 * busy,
            temperature_c: 32.0 + 46.0 * busy,
            pcie_rx_bytes_per_s: 20e9 * busy * 0.6,
            pcie_tx_bytes_per_s: 20e9 * busy * 0.25,
            nvlink_rx_bytes_per_s: if nvlink { 300e9 * busy * 0.5 } else { 0.0 },
            nvlink_tx_bytes_per_s: if nvlink { 300e9 * busy * 0.5 } else { 0.0 },
            throttle_mask: allot_domain::node::throttle_mask(&throttle),
            ecc_corrected,
            ecc_uncorrected: 0,
        })
    }

    fn mig(&self) -> Option<&dyn MigBackend> {
        Some(self)
    }

    fn process_memory(&self, index: u32) -> Option<Vec<(u32, u64)>> {
        let dir = self.fault_dir.as_ref()?;
        let prefix = format!("{PROCESS_MEMORY_FILE_PREFIX}{index}-");
        let entries = std::fs::read_dir(dir).ok()?;
        Some(
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let pid: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
                    let bytes = std::fs::read_to_string(e.path())
                        .ok()?
                        .trim()
                        .parse()
                        .ok()?;
                    std::path::Path::new(&format!("/proc/{pid}"))
                        .exists()
                        .then_some((pid, bytes))
                })
                .collect(),
        )
    }

    fn take_events(&self) -> Vec<GpuEvent> {
        let mut events =
            std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()));
        events.extend(self.file_events());
        events
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
    fn jobs_share_simulated_gpus_through_the_state_dir_whose_busy_time_is_read_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let plain = SimBackend::from_spec("1xH200", "n").expect("spec");
        assert!(plain.job_env(&["GPU-x".into()]).is_empty());
        assert_eq!(plain.busy(0), None);
        let b = SimBackend::from_spec("1xH200", "n")
            .expect("spec")
            .with_state_dir(dir.path().to_owned());
        let uuid = b.inventory().expect("inventory")[0].uuid.clone();
        let env: HashMap<String, String> =
            b.job_env(std::slice::from_ref(&uuid)).into_iter().collect();
        assert_eq!(env["ALLOT_FAKE_CUDA_UUIDS"], uuid);
        assert_eq!(
            env["ALLOT_FAKE_CUDA_SHARED_DIR"],
            dir.path().display().to_string()
        );
        // The fake driver's page: busy nanoseconds at byte 16.
        let page = |busy: u64| {
            let mut p = vec![0u8; 4096];
            p[16..24].copy_from_slice(&busy.to_ne_bytes());
            std::fs::write(dir.path().join(format!("{uuid}.gpu")), p).expect("write");
        };
        assert_eq!(b.busy(0), None, "no job has used the GPU yet");
        page(0);
        assert_eq!(b.busy(0), None, "the first reading is the baseline");
        std::thread::sleep(std::time::Duration::from_millis(100));
        page(50_000_000);
        let busy = b.busy(0).expect("a reading");
        assert!(
            (0.2..=0.55).contains(&busy),
            "50 ms busy in about 100: {busy}"
        );
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
    fn mig_mode_is_chosen_per_gpu_and_only_where_the_board_has_mig() {
        let b = SimBackend::from_spec("1xH200:mig,1xH200", "n").expect("valid");
        assert_eq!(b.mig_instances(0).expect("read"), Some(Vec::new()));
        assert_eq!(b.mig_instances(1).expect("read"), None);
        assert!(matches!(
            SimBackend::from_spec("1xT4:mig", "n"),
            Err(SimSpecError::NoMig(_))
        ));
        assert!(matches!(
            SimBackend::from_spec("1xH200:turbo", "n"),
            Err(SimSpecError::Flag(_))
        ));
    }

    #[test]
    fn sxm_boards_share_one_nvlink_domain_unless_split_and_pcie_boards_have_none() {
        let domains = |spec: &str| -> Vec<Option<u32>> {
            SimBackend::from_spec(spec, "n")
                .expect("valid")
                .inventory()
                .expect("inventory")
                .into_iter()
                .map(|g| g.nvlink_domain)
                .collect()
        };
        assert_eq!(domains("4xH200"), [Some(0); 4]);
        assert_eq!(
            domains("4xH100:nvlink=2,2xT4,2xA100-80GB"),
            [
                Some(0),
                Some(0),
                Some(1),
                Some(1),
                None,
                None,
                Some(2),
                Some(2)
            ]
        );
        assert_eq!(domains("2xH200:nvlink=0"), [None, None]);
        assert!(matches!(
            SimBackend::from_spec("2xH200:nvlink=x", "n"),
            Err(SimSpecError::Flag(_))
        ));
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
    fn injected_xids_are_reported_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let b = SimBackend::from_spec("2xH200", "n")
            .expect("valid")
            .with_fault_dir(dir.path().to_owned());
        b.inject_xid(0, 13);
        std::fs::write(dir.path().join("xid-1-79"), "").expect("fault file");
        std::fs::write(dir.path().join("not-a-fault"), "").expect("other file");
        assert_eq!(
            b.take_events(),
            [
                GpuEvent::Xid { index: 0, code: 13 },
                GpuEvent::Xid { index: 1, code: 79 }
            ]
        );
        assert!(b.take_events().is_empty(), "consumed");
    }

    #[test]
    fn rising_ecc_counters_injected_as_a_file_degrade_the_gpu() {
        let dir = tempfile::tempdir().expect("temp dir");
        let b = SimBackend::from_spec("2xH200", "n")
            .expect("valid")
            .with_fault_dir(dir.path().to_owned());
        std::fs::write(dir.path().join("ecc-1"), "").expect("fault file");
        assert!(b.take_events().is_empty(), "not an event: a state");
        let inv = b.inventory().expect("inv");
        assert!(!inv[0].degraded);
        assert!(inv[1].degraded && inv[1].healthy);
        assert!(!dir.path().join("ecc-1").exists(), "consumed");
    }

    #[test]
    fn health_can_change() {
        let b = SimBackend::from_spec("2xH200", "n").expect("valid");
        b.set_healthy(1, false);
        assert!(!b.inventory().expect("inv")[1].healthy);
    }
}
