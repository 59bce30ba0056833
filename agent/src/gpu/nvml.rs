//! Real GPUs through NVML. `nvml-wrapper` loads `libnvidia-ml.so` at run time, so the agent
//! builds and runs anywhere; on a machine without the driver this backend just fails to
//! start. Everything here reads, except MIG instances, which are created (always at an
//! explicit placement) and destroyed through [`super::nvml_raw`]. The agent never changes
//! clocks, power limits, persistence or MIG mode, and never resets a GPU.
//!
//! Health from the driver's counters: a row-remapping failure or a GPU that fell off the
//! bus is unhealthy; a pending row remapping or page retirement, or corrected ECC errors
//! rising by [`ECC_RISE_DEGRADED`] between two looks, is degraded (until the agent starts
//! again). XIDs arrive on an NVML event set watched by a dedicated thread.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_domain::mig::geometry;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde::Serialize;

use super::nvml_raw::{self, RemappedRows};
use super::{BackendError, GpuBackend, GpuEvent, GpuInfo, MigBackend, MigInstance};

/// Corrected ECC errors gained between two looks that make a GPU degraded.
pub const ECC_RISE_DEGRADED: u64 = 100;

fn failed(what: &str, e: NvmlError) -> BackendError {
    BackendError::Failed(format!("NVML {what}: {e}"))
}

/// What the agent remembers between looks at a GPU's counters.
#[derive(Debug, Default)]
struct Counters {
    corrected_ecc: HashMap<u32, u64>,
    /// GPUs seen degraded: they stay so until the agent starts again.
    degraded: HashSet<u32>,
}

pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    counters: Mutex<Counters>,
    /// NVLink data counters (KiB, all links) per GPU index when last read: rates come from
    /// their differences.
    nvlink: Mutex<HashMap<u32, (std::time::Instant, u64, u64)>>,
    /// Each GPU's NVLink domain, read from the links once: the wiring does not change
    /// while the driver is loaded, and the inventory is read on every heartbeat.
    nvlink_domains: std::sync::OnceLock<Vec<Option<u32>>>,
    events: Arc<Mutex<Vec<GpuEvent>>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl NvmlBackend {
    /// Loads NVML and starts watching for XIDs. Fails where there is no driver.
    pub fn start() -> Result<Self, BackendError> {
        let nvml = Arc::new(Nvml::init().map_err(|e| failed("init", e))?);
        let events = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (nvml, events, stop) = (nvml.clone(), events.clone(), stop.clone());
            std::thread::Builder::new()
                .name("nvml-events".into())
                .spawn(move || watch_events(&nvml, &events, &stop))
                .map_err(|e| {
                    BackendError::Failed(format!("starting the NVML event thread: {e}"))
                })?;
        }
        Ok(Self {
            nvml,
            counters: Mutex::new(Counters::default()),
            nvlink: Mutex::new(HashMap::new()),
            nvlink_domains: std::sync::OnceLock::new(),
            events,
            stop,
        })
    }

    /// NVLink data throughput (rx, tx) in bytes per second since the last read of this GPU
    /// (0 the first time, and on GPUs without NVLink).
    fn nvlink_rates(&self, index: u32, device: &Device<'_>) -> (f64, f64) {
        use nvml_wrapper::enums::device::SampleValue;
        use nvml_wrapper::structs::device::FieldId;
        use nvml_wrapper_sys::bindings::field_id::{
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        };
        let ids = [
            FieldId(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
            FieldId(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
        ];
        let Ok(values) = device.field_values_for(&ids) else {
            return (0.0, 0.0);
        };
        let kib = |i: usize| match values.get(i).map(|v| v.as_ref().map(|s| &s.value)) {
            Some(Ok(Ok(SampleValue::U64(v)))) => Some(*v),
            Some(Ok(Ok(SampleValue::U32(v)))) => Some(u64::from(*v)),
            _ => None,
        };
        let (Some(rx), Some(tx)) = (kib(0), kib(1)) else {
            return (0.0, 0.0);
        };
        let now = std::time::Instant::now();
        let mut last = self.nvlink.lock().unwrap_or_else(|e| e.into_inner());
        let rates = match last.get(&index) {
            Some((at, rx0, tx0)) => {
                let secs = now.duration_since(*at).as_secs_f64().max(1e-3);
                (
                    rx.saturating_sub(*rx0) as f64 * 1024.0 / secs,
                    tx.saturating_sub(*tx0) as f64 * 1024.0 / secs,
                )
            }
            None => (0.0, 0.0),
        };
        last.insert(index, (now, rx, tx));
        rates
    }

    fn device(&self, index: u32) -> Result<Device<'_>, BackendError> {
        self.nvml
            .device_by_index(index)
            .map_err(|e| failed(&format!("GPU {index}"), e))
    }

    fn counters(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (healthy, degraded) of a GPU from its counters.
    /// Each GPU's NVLink domain: GPUs joined by active NVLinks, directly or through an
    /// NVSwitch (a link whose far end is no GPU of this node joins every GPU linked to
    /// it), numbered in order of their first GPU. A GPU with no active link has none.
    fn read_nvlink_domains(&self, count: u32) -> Vec<Option<u32>> {
        // NVML_NVLINK_MAX_LINKS.
        const MAX_LINKS: u32 = 18;
        let bus = |i: u32| {
            self.device(i)
                .ok()
                .and_then(|d| d.pci_info().ok())
                .map(|p| p.bus_id.to_ascii_lowercase())
        };
        let buses: Vec<Option<String>> = (0..count).map(bus).collect();
        // Union-find over GPUs, and one node per switch (by its bus id).
        let mut parent: Vec<usize> = (0..count as usize).collect();
        let mut switches: HashMap<String, usize> = HashMap::new();
        let mut linked = vec![false; count as usize];
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        let mut edges = Vec::new();
        for i in 0..count {
            let Ok(device) = self.device(i) else {
                continue;
            };
            for link in 0..MAX_LINKS {
                let l = device.link_wrapper_for(link);
                if !l.is_active().unwrap_or(false) {
                    continue;
                }
                let Ok(remote) = l.remote_pci_info() else {
                    continue;
                };
                let remote = remote.bus_id.to_ascii_lowercase();
                linked[i as usize] = true;
                match buses
                    .iter()
                    .position(|b| b.as_deref() == Some(remote.as_str()))
                {
                    Some(j) => edges.push((i as usize, j)),
                    None => {
                        let next = parent.len() + switches.len();
                        let s = *switches.entry(remote).or_insert(next);
                        edges.push((i as usize, s));
                    }
                }
            }
        }
        parent.extend(count as usize..count as usize + switches.len());
        for (a, b) in edges {
            let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
            if ra != rb {
                parent[ra.max(rb)] = ra.min(rb);
            }
        }
        let mut ids: HashMap<usize, u32> = HashMap::new();
        (0..count as usize)
            .map(|i| {
                if !linked[i] {
                    return None;
                }
                let r = root(&mut parent, i);
                let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                Some(*ids.entry(r).or_insert(next))
            })
            .collect()
    }

    fn health(&self, index: u32, device: &Device<'_>) -> (bool, bool) {
        let remapped = nvml_raw::remapped_rows(&self.nvml, device).ok();
        if remapped.is_some_and(|r| r.failed) {
            return (false, true);
        }
        let pending = remapped.is_some_and(|r| r.pending)
            || device.are_pages_pending_retired().unwrap_or(false);
        let corrected = device
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .ok();
        let mut c = self.counters();
        if let Some(now) = corrected {
            let before = c.corrected_ecc.insert(index, now);
            if before.is_some_and(|b| now.saturating_sub(b) >= ECC_RISE_DEGRADED) {
                c.degraded.insert(index);
            }
        }
        if pending {
            c.degraded.insert(index);
        }
        (true, c.degraded.contains(&index))
    }

    /// Everything NVML says about this machine's GPUs, read-only: the report of
    /// `allot gpu check` (and `agent/scripts/gpu-check.sh`).
    pub fn report(&self) -> Result<MachineReport, BackendError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| failed("device count", e))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            gpus.push(self.gpu_report(index));
        }
        Ok(MachineReport {
            driver_version: self.nvml.sys_driver_version().ok(),
            nvml_version: self.nvml.sys_nvml_version().ok(),
            cuda_driver_version: self.nvml.sys_cuda_driver_version().ok(),
            gpus,
        })
    }

    fn gpu_report(&self, index: u32) -> GpuReport {
        let mut r = GpuReport {
            index,
            ..GpuReport::default()
        };
        let device = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                r.errors.push(format!("opening the GPU: {e}"));
                return r;
            }
        };
        let mut note = |what: &str, e: NvmlError| {
            if !matches!(e, NvmlError::NotSupported) {
                r.errors.push(format!("{what}: {e}"));
            }
        };
        match device.uuid() {
            Ok(v) => r.uuid = v,
            Err(e) => note("uuid", e),
        }
        match device.name() {
            Ok(v) => r.name = v,
            Err(e) => note("name", e),
        }
        match device.pci_info() {
            Ok(v) => r.pci_bus_id = v.bus_id,
            Err(e) => note("PCI info", e),
        }
        match device.memory_info() {
            Ok(m) => {
                r.memory_total_bytes = m.total;
                r.memory_used_bytes = m.used;
            }
            Err(e) => note("memory", e),
        }
        match device.utilization_rates() {
            Ok(u) => {
                r.utilization = Some(Utilization {
                    gpu_percent: u.gpu,
                    memory_percent: u.memory,
                })
            }
            Err(e) => note("utilization", e),
        }
        match device.mig_mode() {
            Ok(m) => {
                r.mig_enabled = Some(m.current == 1);
                r.mig_pending = Some(m.pending == 1);
            }
            Err(e) => note("MIG mode", e),
        }
        match device.running_compute_processes() {
            Ok(ps) => {
                r.processes = ps
                    .into_iter()
                    .map(|p| Process {
                        pid: p.pid,
                        used_memory_bytes: match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        },
                        gpu_instance_id: p.gpu_instance_id,
                    })
                    .collect();
            }
            Err(e) => note("processes", e),
        }
        for (field, counter) in [
            (&mut r.ecc_corrected_volatile, MemoryError::Corrected),
            (&mut r.ecc_uncorrected_volatile, MemoryError::Uncorrected),
        ] {
            *field = device.total_ecc_errors(counter, EccCounter::Volatile).ok();
        }
        r.pages_pending_retirement = device.are_pages_pending_retired().ok();
        match nvml_raw::remapped_rows(&self.nvml, &device) {
            Ok(v) => r.remapped_rows = Some(v),
            Err(e) => note("remapped rows", e),
        }
        match device.supported_event_types() {
            Ok(t) => r.xid_events_supported = Some(t.contains(EventTypes::CRITICAL_XID_ERROR)),
            Err(e) => note("event types", e),
        }
        if r.mig_enabled == Some(true) {
            match nvml_raw::gi_profiles(&self.nvml, &device) {
                Ok(p) => r.mig_profiles = p,
                Err(e) => note("MIG profiles", e),
            }
            match self.mig_instances(index) {
                Ok(i) => r.mig_instances = i.unwrap_or_default(),
                Err(e) => r.errors.push(e.to_string()),
            }
        }
        let (healthy, degraded) = self.health(index, &device);
        r.health = if !healthy {
            "unhealthy"
        } else if degraded {
            "degraded"
        } else {
            "healthy"
        };
        r
    }

    /// The GPU's MIG geometry and its driver profile whose id is `profile`.
    fn profile_shape(
        &self,
        device: &Device<'_>,
        profile: u32,
    ) -> Result<(nvml_raw::GiProfile, u8), BackendError> {
        let memory_mib = device.memory_info().ok().map(|m| m.total >> 20);
        let name = device.name().unwrap_or_default();
        let compute = geometry(&name, memory_mib)
            .and_then(|g| g.profile(profile))
            .map(|p| p.compute_slices)
            .ok_or_else(|| {
                BackendError::Failed(format!("MIG profile {profile} is unknown for {name}"))
            })?;
        let driver = nvml_raw::gi_profiles(&self.nvml, device)
            .map_err(|e| failed("MIG profiles", e))?
            .into_iter()
            .find(|p| p.id == profile)
            .ok_or_else(|| {
                BackendError::Failed(format!("the driver offers no MIG profile {profile}"))
            })?;
        Ok((driver, compute))
    }
}

/// Waits for XIDs on every GPU that reports them, until `stop`.
fn watch_events(nvml: &Nvml, events: &Mutex<Vec<GpuEvent>>, stop: &AtomicBool) {
    let register = || -> Result<nvml_wrapper::EventSet<'_>, NvmlError> {
        let mut set = nvml.create_event_set()?;
        for index in 0..nvml.device_count()? {
            let device = nvml.device_by_index(index)?;
            let supported = device.supported_event_types()?;
            let wanted = supported & EventTypes::CRITICAL_XID_ERROR;
            if !wanted.is_empty() {
                set = device.register_events(wanted, set).map_err(|e| e.error)?;
            }
        }
        Ok(set)
    };
    let set = match register() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch XID events: GPU faults will go unnoticed");
            return;
        }
    };
    while !stop.load(Ordering::Relaxed) {
        match set.wait(1000) {
            Ok(data) if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) => {
                let code = match data.event_data {
                    Some(XidError::Value(v)) => u32::try_from(v).unwrap_or(u32::MAX),
                    _ => continue,
                };
                match data.device.index() {
                    Ok(index) => events
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(GpuEvent::Xid { index, code }),
                    Err(e) => tracing::warn!(error = %e, code, "XID on a GPU without an index"),
                }
            }
            Ok(_) | Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!(error = %e, "waiting for NVML events");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| failed("device count", e))?;
        let mut out = Vec::new();
        for index in 0..count {
            let device = self.device(index)?;
            let uuid = device.uuid().map_err(|e| failed("uuid", e))?;
            match device.memory_info() {
                Ok(memory) => {
                    let (healthy, degraded) = self.health(index, &device);
                    out.push(GpuInfo {
                        uuid,
                        index,
                        model: device.name().unwrap_or_else(|_| "unknown".into()),
                        memory_bytes: memory.total,
                        healthy,
                        degraded,
                        nvlink_domain: None,
                    });
                }
                // Fallen off the bus: still listed (its jobs must move), never healthy.
                Err(NvmlError::GpuLost) => out.push(GpuInfo {
                    uuid,
                    index,
                    model: device.name().unwrap_or_else(|_| "unknown".into()),
                    memory_bytes: 0,
                    healthy: false,
                    degraded: true,
                    nvlink_domain: None,
                }),
                Err(e) => return Err(failed("memory", e)),
            }
        }
        let domains = self
            .nvlink_domains
            .get_or_init(|| self.read_nvlink_domains(count));
        for g in &mut out {
            g.nvlink_domain = domains.get(g.index as usize).copied().flatten();
        }
        Ok(out)
    }

    fn take_events(&self) -> Vec<GpuEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn mig(&self) -> Option<&dyn MigBackend> {
        Some(self)
    }

    fn process_memory(&self, index: u32) -> Option<Vec<(u32, u64)>> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let device = self.nvml.device_by_index(index).ok()?;
        let processes = device.running_compute_processes().ok()?;
        Some(
            processes
                .into_iter()
                .filter_map(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some((p.pid, bytes)),
                    UsedGpuMemory::Unavailable => None,
                })
                .collect(),
        )
    }

    /// The driver's utilization: the share of its last sample period (1/6 s to 1 s, by
    /// product) during which kernels ran.
    fn busy(&self, index: u32) -> Option<f64> {
        let device = self.nvml.device_by_index(index).ok()?;
        let u = device.utilization_rates().ok()?;
        Some(f64::from(u.gpu) / 100.0)
    }

    fn sample(&self, index: u32, _load: f64) -> Option<super::GpuSample> {
        use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, PcieUtilCounter};
        let device = self.nvml.device_by_index(index).ok()?;
        // NVML's PCIe counters are KB/s over its last 20 ms window.
        let pcie = |c| {
            device
                .pcie_throughput(c)
                .map_or(0.0, |kb| f64::from(kb) * 1024.0)
        };
        let (nvlink_rx, nvlink_tx) = self.nvlink_rates(index, &device);
        let ecc = |kind| {
            device
                .total_ecc_errors(kind, EccCounter::Volatile)
                .unwrap_or(0)
        };
        Some(super::GpuSample {
            utilization: device
                .utilization_rates()
                .map_or(0.0, |u| f64::from(u.gpu) / 100.0),
            memory_used_bytes: device.memory_info().map_or(0, |m| m.used),
            power_watts: device
                .power_usage()
                .map_or(0.0, |mw| f64::from(mw) / 1000.0),
            temperature_c: device
                .temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu)
                .map_or(0.0, f64::from),
            pcie_rx_bytes_per_s: pcie(PcieUtilCounter::Receive),
            pcie_tx_bytes_per_s: pcie(PcieUtilCounter::Send),
            nvlink_rx_bytes_per_s: nvlink_rx,
            nvlink_tx_bytes_per_s: nvlink_tx,
            throttle_mask: device
                .current_throttle_reasons()
                .map(|r| {
                    let names: Vec<String> = r
                        .iter_names()
                        .map(|(name, _)| name.to_ascii_lowercase())
                        .collect();
                    allot_domain::node::throttle_mask(&names)
                })
                .unwrap_or_default(),
            ecc_corrected: ecc(MemoryError::Corrected),
            ecc_uncorrected: ecc(MemoryError::Uncorrected),
        })
    }

    fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }
}

impl MigBackend for NvmlBackend {
    fn mig_instances(&self, index: u32) -> Result<Option<Vec<MigInstance>>, BackendError> {
        let device = self.device(index)?;
        match device.mig_mode() {
            Ok(m) if m.current == 1 => {}
            Ok(_) | Err(NvmlError::NotSupported) => return Ok(None),
            Err(e) => return Err(failed("MIG mode", e)),
        }
        // MIG device UUIDs by GPU instance id.
        let mut uuids = HashMap::new();
        let slots = device.mig_device_count().unwrap_or(7);
        for i in 0..slots {
            let Ok(mig) = device.mig_device_by_index(i) else {
                continue;
            };
            if let (Ok(id), Ok(uuid)) = (nvml_raw::gpu_instance_id(&self.nvml, &mig), mig.uuid()) {
                uuids.insert(id, uuid);
            }
        }
        let mut out = Vec::new();
        for profile in
            nvml_raw::gi_profiles(&self.nvml, &device).map_err(|e| failed("MIG profiles", e))?
        {
            for gi in nvml_raw::gpu_instances(&self.nvml, &device, profile.id)
                .map_err(|e| failed("GPU instances", e))?
            {
                out.push(MigInstance {
                    profile: gi.profile_id,
                    start: u8::try_from(gi.start).unwrap_or(u8::MAX),
                    uuid: uuids.get(&gi.id).cloned().unwrap_or_default(),
                });
            }
        }
        out.sort_by_key(|i| i.start);
        Ok(Some(out))
    }

    fn create_instance(
        &self,
        index: u32,
        profile: u32,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        let device = self.device(index)?;
        let (driver, compute_slices) = self.profile_shape(&device, profile)?;
        // The placement must be one the driver offers now (free, and allowed there).
        let size = nvml_raw::possible_placements(&self.nvml, &device, profile)
            .map_err(|e| failed("MIG placements", e))?
            .into_iter()
            .find(|&(s, _)| s == u32::from(start))
            .map(|(_, size)| size)
            .ok_or_else(|| {
                BackendError::Failed(format!(
                    "MIG profile {profile} cannot be placed at slice {start} of GPU {index} now"
                ))
            })?;
        debug_assert_eq!(size, driver.memory_slices);
        nvml_raw::create_instance(
            &self.nvml,
            &device,
            profile,
            u32::from(start),
            size,
            u32::from(compute_slices),
        )
        .map_err(|e| failed("creating a MIG instance", e))?;
        self.mig_instances(index)?
            .unwrap_or_default()
            .into_iter()
            .find(|i| i.start == start && i.profile == profile)
            .ok_or_else(|| BackendError::Failed("the new MIG instance is not listed".into()))
    }

    fn destroy_instance(&self, index: u32, start: u8) -> Result<(), BackendError> {
        let device = self.device(index)?;
        let running = device
            .running_compute_processes()
            .map_err(|e| failed("processes", e))?;
        for profile in
            nvml_raw::gi_profiles(&self.nvml, &device).map_err(|e| failed("MIG profiles", e))?
        {
            for gi in nvml_raw::gpu_instances(&self.nvml, &device, profile.id)
                .map_err(|e| failed("GPU instances", e))?
            {
                if gi.start != u32::from(start) {
                    continue;
                }
                if running.iter().any(|p| p.gpu_instance_id == Some(gi.id)) {
                    return Err(BackendError::Failed(format!(
                        "processes run on the MIG instance at slice {start} of GPU {index}"
                    )));
                }
                return nvml_raw::destroy_instance(&self.nvml, &gi)
                    .map_err(|e| failed("destroying a MIG instance", e));
            }
        }
        Err(BackendError::Failed(format!(
            "no MIG instance starts at slice {start} of GPU {index}"
        )))
    }
}

/// The machine as NVML sees it.
#[derive(Debug, Clone, Serialize)]
pub struct MachineReport {
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    /// E.g. 12040 for CUDA 12.4.
    pub cuda_driver_version: Option<i32>,
    pub gpus: Vec<GpuReport>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuReport {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub utilization: Option<Utilization>,
    pub mig_enabled: Option<bool>,
    /// MIG mode after the next GPU reset.
    pub mig_pending: Option<bool>,
    pub mig_profiles: Vec<nvml_raw::GiProfile>,
    pub mig_instances: Vec<MigInstance>,
    pub processes: Vec<Process>,
    pub ecc_corrected_volatile: Option<u64>,
    pub ecc_uncorrected_volatile: Option<u64>,
    pub pages_pending_retirement: Option<bool>,
    pub remapped_rows: Option<RemappedRows>,
    pub xid_events_supported: Option<bool>,
    /// healthy, degraded or unhealthy, as the agent would report it.
    pub health: &'static str,
    /// Queries that failed (not merely unsupported).
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Utilization {
    pub gpu_percent: u32,
    pub memory_percent: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Process {
    pub pid: u32,
    pub used_memory_bytes: Option<u64>,
    pub gpu_instance_id: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the driver is absent (CI), starting fails with a clear error rather than a
    /// panic; where it is present, the inventory and the report agree.
    #[test]
    fn starts_only_where_the_driver_is_and_then_reads_every_gpu() {
        match NvmlBackend::start() {
            Err(BackendError::Failed(msg)) => assert!(msg.contains("NVML init"), "{msg}"),
            Ok(backend) => {
                let inventory = backend.inventory().expect("inventory");
                let report = backend.report().expect("report");
                assert_eq!(inventory.len(), report.gpus.len());
                for (i, r) in inventory.iter().zip(&report.gpus) {
                    assert_eq!(i.uuid, r.uuid);
                    assert_eq!(i.memory_bytes, r.memory_total_bytes);
                }
            }
        }
    }
}
