//! The per-job shared-memory region: a sealed *limits* page and a writable *usage* page.
//!
//! The agent creates both as memfds before it starts the job and passes them to the job's
//! first process as inherited descriptors, named by [`LIMITS_FD_ENV`] and [`USAGE_FD_ENV`].
//! Processes the job forks inherit them too, so all of a job's processes share one budget.
//!
//! - The limits page is sealed with `F_SEAL_FUTURE_WRITE`, `F_SEAL_SHRINK`, `F_SEAL_GROW`
//!   and `F_SEAL_SEAL` once written: no process can write it or map it writable again,
//!   whatever its user id. The agent keeps the one writable mapping it made before sealing,
//!   which is how limits are resized while the job runs.
//! - The usage page is the job's own: its processes' allocations, their launch pacing and
//!   one slot per process. A job that scribbles on it can only hurt itself, and the agent's
//!   NVML check (comparing what the driver says each process holds with the limit) is there
//!   for exactly that and for binaries that bypass the preload.
//!
//! A region that is missing, unsealed, of the wrong size or whose identity checksum does
//! not match is refused ([`RegionError`]); the shim then refuses GPU access (fail closed).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The environment variable naming the inherited limits descriptor.
pub const LIMITS_FD_ENV: &str = "ALLOT_SHIM_LIMITS_FD";
/// The environment variable naming the inherited usage descriptor.
pub const USAGE_FD_ENV: &str = "ALLOT_SHIM_USAGE_FD";
/// GPUs one job can hold on one node.
pub const MAX_GPUS: usize = 16;
/// Processes of one job that can use the GPU at the same time.
pub const MAX_PROCS: usize = 256;

const LIMITS_MAGIC: u64 = u64::from_le_bytes(*b"ALLOTLIM");
const USAGE_MAGIC: u64 = u64::from_le_bytes(*b"ALLOTUSE");
const VERSION: u32 = 2;
const UUID_LEN: usize = 80;
const JOB_ID_LEN: usize = 64;
/// The seals a limits page must carry to be trusted.
const LIMITS_SEALS: i32 =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
const USAGE_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("{0} is not set: the job was started without its GPU limits")]
    Missing(&'static str),
    #[error("{name} is not a descriptor number: {value:?}")]
    BadDescriptor { name: &'static str, value: String },
    #[error("the {0} region is not what the agent creates (wrong size, magic or version)")]
    Corrupt(&'static str),
    #[error("the limits region is not sealed against writes")]
    Unsealed,
    #[error("the limits and usage regions do not belong together")]
    Mismatch,
    #[error("a job holds at most {MAX_GPUS} GPUs on a node, not {0}")]
    TooManyGpus(usize),
    #[error("{0} is too long for the region")]
    TooLong(&'static str),
    #[error("{op} failed: {source}")]
    Os {
        op: &'static str,
        source: std::io::Error,
    },
}

fn os(op: &'static str) -> RegionError {
    RegionError::Os {
        op,
        source: std::io::Error::last_os_error(),
    }
}

/// How a job's compute share is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    /// Always held to the share.
    Strict,
    /// Held to the share only while another job wants the same GPU.
    Elastic,
}

impl ComputeMode {
    fn code(self) -> u32 {
        match self {
            ComputeMode::Strict => 0,
            ComputeMode::Elastic => 1,
        }
    }

    fn from_code(code: u32) -> Self {
        // Anything but the elastic code is held strictly: fail closed.
        if code == 1 {
            ComputeMode::Elastic
        } else {
            ComputeMode::Strict
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Strict => "strict",
            ComputeMode::Elastic => "elastic",
        }
    }
}

impl std::str::FromStr for ComputeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "strict" => Ok(ComputeMode::Strict),
            "elastic" => Ok(ComputeMode::Elastic),
            other => Err(format!("`{other}` is not a compute mode (strict, elastic)")),
        }
    }
}

/// What a job may use of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuGrant {
    /// `GPU-…`, as NVML and CUDA name the device.
    pub uuid: String,
    /// GPU memory the job's processes may hold together, context memory included.
    pub memory_limit: u64,
    /// The share of the GPU's compute, in thousandths (1000: all of it, not throttled).
    pub compute_milli: u32,
    pub mode: ComputeMode,
}

/// One GPU's limits, as the job sees them.
#[repr(C)]
pub struct GpuLimits {
    uuid: [u8; UUID_LEN],
    memory_limit: AtomicU64,
    compute_milli: AtomicU32,
    mode: AtomicU32,
    /// Set by the agent while another job on this GPU is launching work.
    contended: AtomicU32,
    _reserved: u32,
}

impl GpuLimits {
    pub fn uuid(&self) -> &str {
        let end = self.uuid.iter().position(|b| *b == 0).unwrap_or(UUID_LEN);
        std::str::from_utf8(&self.uuid[..end]).unwrap_or("")
    }
    pub fn memory_limit(&self) -> u64 {
        self.memory_limit.load(Ordering::Acquire)
    }
    pub fn compute_milli(&self) -> u32 {
        self.compute_milli.load(Ordering::Acquire).min(1000)
    }
    pub fn mode(&self) -> ComputeMode {
        ComputeMode::from_code(self.mode.load(Ordering::Acquire))
    }
    pub fn contended(&self) -> bool {
        self.contended.load(Ordering::Acquire) != 0
    }
    /// Whether launches on this GPU are paced now.
    pub fn throttled(&self) -> bool {
        self.compute_milli() < 1000 && (self.mode() == ComputeMode::Strict || self.contended())
    }
}

#[repr(C)]
struct LimitsPage {
    magic: u64,
    version: u32,
    gpu_count: u32,
    context_reserve_bytes: u64,
    /// FNV-1a of everything above `gpus` and each GPU's UUID: what never changes.
    identity: u64,
    job_id: [u8; JOB_ID_LEN],
    gpus: [GpuLimits; MAX_GPUS],
}

/// One GPU's usage by the whole job, and its launch pacing.
#[repr(C)]
pub struct GpuUsage {
    /// Bytes the job's processes hold on the GPU, context memory included.
    pub used: AtomicU64,
    /// The pacer's theoretical arrival time (see [`crate::pacer`]).
    pub tat_ns: AtomicU64,
    /// The pacer's rate in launches per second, as `f64` bits (0: not measured yet).
    pub rate_bits: AtomicU64,
    /// Launches made on the GPU, all processes together.
    pub launches: AtomicU64,
    /// When the last launch was made ([`crate::monotonic_ns`]).
    pub last_launch_ns: AtomicU64,
    /// When the controller last ran, and the launch count it saw then: one process runs
    /// each control period, the one that advances this first.
    pub control_at_ns: AtomicU64,
    pub control_launches: AtomicU64,
    /// The controller's state, as `f64` bits: GPU-seconds per launch, and its integral term.
    pub cost_bits: AtomicU64,
    pub integral_bits: AtomicU64,
    /// The NVML sample timestamp (µs) the controller read up to.
    pub nvml_seen_us: AtomicU64,
    /// GPU time the job's kernels used, as the controller measured it each period (ns):
    /// what the agent reports as the job's busy time, and sizing reads.
    pub busy_ns: AtomicU64,
    /// The time those periods covered (ns): busy time over it is the job's busy share,
    /// whenever it is read.
    pub measured_ns: AtomicU64,
    /// Time the job's launches waited for its share, all its threads together (ns): the
    /// sign that its share is too small.
    pub held_back_ns: AtomicU64,
}

/// One process of the job and what it holds on each GPU.
#[repr(C)]
pub struct ProcSlot {
    /// 0: free; [`RECLAIMING`] while a sweep returns a dead process's bytes.
    pub pid: AtomicU32,
    _reserved: u32,
    pub used: [AtomicU64; MAX_GPUS],
}

/// The pid a slot holds while its dead owner's bytes are being returned.
pub const RECLAIMING: u32 = u32::MAX;

#[repr(C)]
struct UsagePage {
    magic: u64,
    version: u32,
    gpu_count: u32,
    identity: u64,
    gpus: [GpuUsage; MAX_GPUS],
    procs: [ProcSlot; MAX_PROCS],
}

const LIMITS_LEN: usize = std::mem::size_of::<LimitsPage>();
const USAGE_LEN: usize = std::mem::size_of::<UsagePage>();

fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn identity_of(page: &LimitsPage) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325;
    h = fnv1a(h, &page.magic.to_le_bytes());
    h = fnv1a(h, &page.version.to_le_bytes());
    h = fnv1a(h, &page.gpu_count.to_le_bytes());
    h = fnv1a(h, &page.context_reserve_bytes.to_le_bytes());
    h = fnv1a(h, &page.job_id);
    for g in &page.gpus[..(page.gpu_count as usize).min(MAX_GPUS)] {
        h = fnv1a(h, &g.uuid);
    }
    h
}

/// A shared mapping, unmapped on drop.
struct Mapping {
    ptr: std::ptr::NonNull<libc::c_void>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every field that changes after creation is
// an atomic, so it may be used from any thread.
#[allow(unsafe_code)]
unsafe impl Send for Mapping {}
#[allow(unsafe_code)]
unsafe impl Sync for Mapping {}

#[allow(unsafe_code)]
impl Mapping {
    fn map(fd: RawFd, len: usize, writable: bool) -> Result<Self, RegionError> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of `len` bytes of `fd`; the kernel picks the address.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        let ptr = std::ptr::NonNull::new(ptr).ok_or_else(|| os("mmap"))?;
        Ok(Mapping { ptr, len })
    }
}

#[allow(unsafe_code)]
impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr(), self.len) };
    }
}

#[allow(unsafe_code)]
fn memfd(name: &std::ffi::CStr, len: usize) -> Result<OwnedFd, RegionError> {
    // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(os("memfd_create"));
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = libc::off_t::try_from(len).map_err(|_| RegionError::Corrupt("limits"))?;
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(os("ftruncate"));
    }
    Ok(fd)
}

#[allow(unsafe_code)]
fn seal(fd: RawFd, seals: i32) -> Result<(), RegionError> {
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os("sealing the region"));
    }
    Ok(())
}

#[allow(unsafe_code)]
fn seals_of(fd: RawFd) -> i32 {
    // SAFETY: fcntl with no argument on a descriptor; -1 on any error.
    unsafe { libc::fcntl(fd, libc::F_GET_SEALS) }
}

#[allow(unsafe_code)]
fn size_of_fd(fd: RawFd) -> Result<(usize, u64), RegionError> {
    // SAFETY: fstat writes into `st`, which outlives the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os("fstat"));
    }
    Ok((usize::try_from(st.st_size).unwrap_or(0), st.st_ino))
}

/// The two pages, mapped: what both the agent and the shim read through.
pub struct RegionView {
    limits: Mapping,
    usage: Mapping,
}

#[allow(unsafe_code)]
impl RegionView {
    fn limits_page(&self) -> &LimitsPage {
        // SAFETY: the mapping is LIMITS_LEN bytes, page aligned, and was validated (or
        // written) as a LimitsPage; it lives as long as `self`.
        unsafe { &*self.limits.ptr.as_ptr().cast::<LimitsPage>() }
    }

    fn usage_page(&self) -> &UsagePage {
        // SAFETY: as above, for the USAGE_LEN-byte usage mapping.
        unsafe { &*self.usage.ptr.as_ptr().cast::<UsagePage>() }
    }

    pub fn gpu_count(&self) -> usize {
        (self.limits_page().gpu_count as usize).min(MAX_GPUS)
    }

    pub fn job_id(&self) -> &str {
        let id = &self.limits_page().job_id;
        let end = id.iter().position(|b| *b == 0).unwrap_or(JOB_ID_LEN);
        std::str::from_utf8(&id[..end]).unwrap_or("")
    }

    /// Memory every process reserves on each GPU it uses, for its CUDA context.
    pub fn context_reserve_bytes(&self) -> u64 {
        self.limits_page().context_reserve_bytes
    }

    pub fn limits(&self, gpu: usize) -> Option<&GpuLimits> {
        (gpu < self.gpu_count()).then(|| &self.limits_page().gpus[gpu])
    }

    pub fn usage(&self, gpu: usize) -> Option<&GpuUsage> {
        (gpu < self.gpu_count()).then(|| &self.usage_page().gpus[gpu])
    }

    /// The index of the GPU with this UUID.
    pub fn gpu_index(&self, uuid: &str) -> Option<usize> {
        (0..self.gpu_count()).find(|i| self.limits_page().gpus[*i].uuid() == uuid)
    }

    pub fn slot(&self, index: usize) -> Option<&ProcSlot> {
        self.usage_page().procs.get(index)
    }

    /// Takes a free process slot for `pid` (sweeping dead processes' slots when none is
    /// free).
    pub fn claim_slot(&self, pid: u32, alive: impl Fn(u32) -> bool) -> Option<usize> {
        let claim = || {
            self.usage_page().procs.iter().position(|s| {
                s.pid
                    .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
        };
        claim().or_else(|| {
            self.sweep_dead(&alive);
            claim()
        })
    }

    /// Returns the bytes of processes that are gone to the job's budget; how many slots were
    /// freed.
    pub fn sweep_dead(&self, alive: impl Fn(u32) -> bool) -> usize {
        let mut freed = 0;
        for slot in &self.usage_page().procs {
            let pid = slot.pid.load(Ordering::Acquire);
            if pid == 0 || pid == RECLAIMING || alive(pid) {
                continue;
            }
            // Only the sweep that wins this exchange returns the bytes.
            if slot
                .pid
                .compare_exchange(pid, RECLAIMING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            for (gpu, used) in slot.used.iter().enumerate().take(self.gpu_count()) {
                let bytes = used.swap(0, Ordering::AcqRel);
                if let Some(u) = self.usage(gpu) {
                    saturating_sub(&u.used, bytes);
                }
            }
            slot.pid.store(0, Ordering::Release);
            freed += 1;
        }
        freed
    }

    /// Reserves `bytes` on `gpu` for the process in `slot`, if the job's limit allows.
    pub fn reserve(&self, gpu: usize, slot: usize, bytes: u64) -> bool {
        let (Some(limits), Some(usage), Some(proc_slot)) =
            (self.limits(gpu), self.usage(gpu), self.slot(slot))
        else {
            return false;
        };
        let limit = limits.memory_limit();
        let reserved = usage
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            })
            .is_ok();
        if reserved {
            proc_slot.used[gpu].fetch_add(bytes, Ordering::AcqRel);
        }
        reserved
    }

    /// Returns `bytes` on `gpu` from the process in `slot`.
    pub fn release(&self, gpu: usize, slot: usize, bytes: u64) {
        if let (Some(usage), Some(proc_slot)) = (self.usage(gpu), self.slot(slot)) {
            saturating_sub(&proc_slot.used[gpu], bytes);
            saturating_sub(&usage.used, bytes);
        }
    }

    /// Bytes the job holds on `gpu`.
    pub fn used(&self, gpu: usize) -> u64 {
        self.usage(gpu)
            .map_or(0, |u| u.used.load(Ordering::Acquire))
    }

    /// GPU time the job's kernels used on GPU `gpu` (ns), as its controller measured it.
    pub fn busy_ns(&self, gpu: usize) -> u64 {
        self.usage(gpu)
            .map_or(0, |u| u.busy_ns.load(Ordering::Acquire))
    }

    /// The time [`Self::busy_ns`] was measured over on GPU `gpu` (ns).
    pub fn measured_ns(&self, gpu: usize) -> u64 {
        self.usage(gpu)
            .map_or(0, |u| u.measured_ns.load(Ordering::Acquire))
    }

    /// Time the job's launches on GPU `gpu` waited for its share (ns).
    pub fn held_back_ns(&self, gpu: usize) -> u64 {
        self.usage(gpu)
            .map_or(0, |u| u.held_back_ns.load(Ordering::Acquire))
    }

    /// The pids holding slots now.
    pub fn pids(&self) -> Vec<u32> {
        self.usage_page()
            .procs
            .iter()
            .map(|s| s.pid.load(Ordering::Acquire))
            .filter(|p| *p != 0 && *p != RECLAIMING)
            .collect()
    }
}

fn saturating_sub(counter: &AtomicU64, bytes: u64) {
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(bytes))
    });
}

/// Whether a process with this pid exists (signal 0).
#[allow(unsafe_code)]
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The agent's side of a job's region: owns both descriptors and the only writable
/// mapping of the limits.
pub struct JobRegion {
    limits_fd: OwnedFd,
    usage_fd: OwnedFd,
    view: RegionView,
    limits_inode: u64,
}

impl std::fmt::Debug for JobRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobRegion")
            .field("job_id", &self.view.job_id())
            .field("limits_fd", &self.limits_fd.as_raw_fd())
            .field("usage_fd", &self.usage_fd.as_raw_fd())
            .finish()
    }
}

impl std::ops::Deref for JobRegion {
    type Target = RegionView;
    fn deref(&self) -> &RegionView {
        &self.view
    }
}

fn copy_str(dst: &mut [u8], src: &str, what: &'static str) -> Result<(), RegionError> {
    // One byte stays zero: the terminator.
    if src.len() >= dst.len() {
        return Err(RegionError::TooLong(what));
    }
    dst[..src.len()].copy_from_slice(src.as_bytes());
    Ok(())
}

#[allow(unsafe_code)]
impl JobRegion {
    /// Creates and seals a job's region.
    pub fn create(
        job_id: &str,
        grants: &[GpuGrant],
        context_reserve_bytes: u64,
    ) -> Result<Self, RegionError> {
        if grants.len() > MAX_GPUS {
            return Err(RegionError::TooManyGpus(grants.len()));
        }
        let limits_fd = memfd(c"allot-limits", LIMITS_LEN)?;
        let usage_fd = memfd(c"allot-usage", USAGE_LEN)?;
        let limits = Mapping::map(limits_fd.as_raw_fd(), LIMITS_LEN, true)?;
        let usage = Mapping::map(usage_fd.as_raw_fd(), USAGE_LEN, true)?;
        // SAFETY: the mapping is fresh, zero-filled and LIMITS_LEN bytes; a zeroed
        // LimitsPage is valid (integers and atomics), and nothing else maps it yet.
        let page = unsafe { &mut *limits.ptr.as_ptr().cast::<LimitsPage>() };
        page.magic = LIMITS_MAGIC;
        page.version = VERSION;
        page.gpu_count = u32::try_from(grants.len()).unwrap_or(0);
        page.context_reserve_bytes = context_reserve_bytes;
        copy_str(&mut page.job_id, job_id, "the job id")?;
        for (slot, grant) in page.gpus.iter_mut().zip(grants) {
            copy_str(&mut slot.uuid, &grant.uuid, "a GPU UUID")?;
            *slot.memory_limit.get_mut() = grant.memory_limit;
            *slot.compute_milli.get_mut() = grant.compute_milli.min(1000);
            *slot.mode.get_mut() = grant.mode.code();
        }
        page.identity = identity_of(page);
        // SAFETY: as above, for the zero-filled usage mapping.
        let upage = unsafe { &mut *usage.ptr.as_ptr().cast::<UsagePage>() };
        upage.magic = USAGE_MAGIC;
        upage.version = VERSION;
        upage.gpu_count = page.gpu_count;
        upage.identity = page.identity;
        seal(limits_fd.as_raw_fd(), LIMITS_SEALS)?;
        seal(usage_fd.as_raw_fd(), USAGE_SEALS)?;
        let (_, limits_inode) = size_of_fd(limits_fd.as_raw_fd())?;
        Ok(JobRegion {
            limits_fd,
            usage_fd,
            view: RegionView { limits, usage },
            limits_inode,
        })
    }

    pub fn limits_fd(&self) -> RawFd {
        self.limits_fd.as_raw_fd()
    }

    pub fn usage_fd(&self) -> RawFd {
        self.usage_fd.as_raw_fd()
    }

    /// The limits memfd's inode: a process that maps the job's real limits shows it in
    /// `/proc/<pid>/maps`.
    pub fn limits_inode(&self) -> u64 {
        self.limits_inode
    }

    /// Changes a GPU's memory limit and compute share while the job runs. A lower memory
    /// limit refuses new allocations past it; what is held already stays held.
    pub fn resize(&self, gpu: usize, memory_limit: u64, compute_milli: u32) -> bool {
        let Some(l) = self.view.limits(gpu) else {
            return false;
        };
        l.memory_limit.store(memory_limit, Ordering::Release);
        l.compute_milli
            .store(compute_milli.min(1000), Ordering::Release);
        true
    }

    /// Says whether another job is launching work on the same GPU (what elastic mode
    /// yields to).
    pub fn set_contended(&self, gpu: usize, contended: bool) {
        if let Some(l) = self.view.limits(gpu) {
            l.contended.store(u32::from(contended), Ordering::Release);
        }
    }

    /// The environment that names the region to the job.
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            (LIMITS_FD_ENV, self.limits_fd().to_string()),
            (USAGE_FD_ENV, self.usage_fd().to_string()),
        ]
    }

    /// Makes the process `cmd` starts inherit the region: both descriptors (kept
    /// close-on-exec everywhere else), and the environment naming them.
    pub fn pass_to(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let (limits, usage) = (self.limits_fd(), self.usage_fd());
        cmd.envs(self.env());
        // SAFETY: the closure runs in the child between fork and exec and only calls
        // fcntl(2), which is async-signal-safe, on two descriptors the child inherited.
        unsafe {
            cmd.pre_exec(move || Self::inherit_in_child(limits, usage));
        }
    }

    /// Clears the close-on-exec flag of both descriptors, in a child between fork and
    /// exec, so the job inherits them. Async-signal-safe.
    pub fn inherit_in_child(limits_fd: RawFd, usage_fd: RawFd) -> std::io::Result<()> {
        for fd in [limits_fd, usage_fd] {
            // SAFETY: fcntl(F_SETFD) is async-signal-safe and touches only the descriptor.
            if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The job's side: the region named by the environment, validated and mapped (limits
/// read-only).
pub struct AttachedRegion {
    view: RegionView,
}

impl std::ops::Deref for AttachedRegion {
    type Target = RegionView;
    fn deref(&self) -> &RegionView {
        &self.view
    }
}

fn fd_from_env(name: &'static str) -> Result<RawFd, RegionError> {
    let value = std::env::var(name).map_err(|_| RegionError::Missing(name))?;
    value
        .trim()
        .parse::<RawFd>()
        .ok()
        .filter(|fd| *fd >= 0)
        .ok_or(RegionError::BadDescriptor { name, value })
}

#[allow(unsafe_code)]
impl AttachedRegion {
    /// Attaches to the region the environment names.
    pub fn from_env() -> Result<Self, RegionError> {
        Self::attach(fd_from_env(LIMITS_FD_ENV)?, fd_from_env(USAGE_FD_ENV)?)
    }

    /// Attaches to the region behind these descriptors, refusing anything the agent did not
    /// make and seal.
    pub fn attach(limits_fd: RawFd, usage_fd: RawFd) -> Result<Self, RegionError> {
        if size_of_fd(limits_fd)?.0 != LIMITS_LEN {
            return Err(RegionError::Corrupt("limits"));
        }
        if size_of_fd(usage_fd)?.0 != USAGE_LEN {
            return Err(RegionError::Corrupt("usage"));
        }
        let seals = seals_of(limits_fd);
        if seals < 0 || seals & LIMITS_SEALS != LIMITS_SEALS {
            return Err(RegionError::Unsealed);
        }
        let usage_seals = seals_of(usage_fd);
        if usage_seals < 0 || usage_seals & USAGE_SEALS != USAGE_SEALS {
            return Err(RegionError::Corrupt("usage"));
        }
        let view = RegionView {
            limits: Mapping::map(limits_fd, LIMITS_LEN, false)?,
            usage: Mapping::map(usage_fd, USAGE_LEN, true)?,
        };
        let page = view.limits_page();
        if page.magic != LIMITS_MAGIC
            || page.version != VERSION
            || page.gpu_count as usize > MAX_GPUS
            || page.identity != identity_of(page)
        {
            return Err(RegionError::Corrupt("limits"));
        }
        let upage = view.usage_page();
        if upage.magic != USAGE_MAGIC || upage.version != VERSION {
            return Err(RegionError::Corrupt("usage"));
        }
        if upage.identity != page.identity || upage.gpu_count != page.gpu_count {
            return Err(RegionError::Mismatch);
        }
        Ok(AttachedRegion { view })
    }
}

#[cfg(test)]
mod tests;
