//! A fake CUDA driver for tests: `libcuda.so.1` and the slice of `libnvidia-ml.so.1` the
//! shim uses, in one library (tests link it under both names).
//!
//! It simulates `ALLOT_FAKE_CUDA_DEVICES` GPUs (default 1) of `ALLOT_FAKE_CUDA_MEMORY` bytes
//! each (default 80 GiB). Allocations are tracked and refused past the device's size,
//! contexts cost `ALLOT_FAKE_CUDA_CONTEXT_BYTES` (default 300 MiB), and kernels take time:
//! a launch runs for `gridDimX` microseconds (a graph launch for as many microseconds as
//! its handle's value), on the calling thread, and the time is counted as the process's
//! GPU time. NVML reports that time as the process's utilization and the allocations as
//! memory in use.
//!
//! GPUs that contend: with `ALLOT_FAKE_CUDA_SHARED_DIR` set, processes that name the same
//! directory share each GPU (by UUID) the way a GPU without MPS is shared: one context's
//! kernel runs at a time, time-sliced between processes kernel by kernel in turn, with a
//! context switch (`ALLOT_FAKE_CUDA_SWITCH_MICROS`, default 25 µs) whenever the GPU passes
//! from one process to another; a process's kernels run one after another on the thread
//! that launched them. Each GPU's state is a small file there (`<uuid>.gpu`): a lock held
//! while a kernel runs (released by the kernel if its process dies), how many processes
//! wait for it, who ran last, and the GPU's own busy and switch time. Without the variable
//! each process has the GPU to itself, as before. See `docs/shim.md`.
//!
//! Test hooks: `fakeCudaBusyNanos()` returns the GPU time the process has used;
//! `fakeCudaGpuBusyNanos(dev)` the time device `dev` was busy with any process's kernels
//! (and context switches) while shared.
//!
//! Nothing here is used outside tests and benchmarks.
#![allow(unsafe_code)] // every export is an `extern "C"` CUDA or NVML entry point
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

type CuResult = c_int;
const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const NOT_INITIALIZED: CuResult = 3;
const INVALID_DEVICE: CuResult = 101;
const INVALID_CONTEXT: CuResult = 201;
const NOT_FOUND: CuResult = 500;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_INVALID_ARGUMENT: c_int = 2;
const NVML_ERROR_NOT_FOUND: c_int = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

struct Device {
    total: u64,
    used: u64,
    next: u64,
    has_context: bool,
}

struct Driver {
    context_bytes: u64,
    devices: Vec<Device>,
    /// Device pointers and array / allocation handles: device and size.
    allocations: HashMap<u64, (usize, u64)>,
    /// GPU time: total, and recent busy intervals (µs) for NVML's utilization samples.
    busy_ns: u64,
    intervals: Vec<(u64, u64)>,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl Driver {
    fn new() -> Self {
        let count = env_u64("ALLOT_FAKE_CUDA_DEVICES", 1).clamp(1, 16) as usize;
        let total = env_u64("ALLOT_FAKE_CUDA_MEMORY", 80 << 30);
        Driver {
            context_bytes: env_u64("ALLOT_FAKE_CUDA_CONTEXT_BYTES", 300 << 20),
            devices: (0..count)
                .map(|i| Device {
                    total,
                    used: 0,
                    next: 0x7000_0000_0000 + ((i as u64) << 40),
                    has_context: false,
                })
                .collect(),
            allocations: HashMap::new(),
            busy_ns: 0,
            intervals: Vec::new(),
        }
    }

    fn allocate(&mut self, dev: usize, size: u64) -> Result<u64, CuResult> {
        let d = self.devices.get_mut(dev).ok_or(INVALID_DEVICE)?;
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        if d.used + size > d.total {
            return Err(OUT_OF_MEMORY);
        }
        d.used += size;
        let ptr = d.next;
        d.next += size.div_ceil(4096) * 4096;
        self.allocations.insert(ptr, (dev, size));
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64) -> CuResult {
        match self.allocations.remove(&ptr) {
            Some((dev, size)) => {
                self.devices[dev].used -= size;
                SUCCESS
            }
            None => INVALID_VALUE,
        }
    }

    fn open_context(&mut self, dev: usize) -> CuResult {
        let bytes = self.context_bytes;
        let Some(d) = self.devices.get_mut(dev) else {
            return INVALID_DEVICE;
        };
        if !d.has_context {
            if d.used + bytes > d.total {
                return OUT_OF_MEMORY;
            }
            d.used += bytes;
            d.has_context = true;
        }
        CURRENT.with(|c| c.set(Some(dev)));
        SUCCESS
    }
}

static DRIVER: Mutex<Option<Driver>> = Mutex::new(None);
/// Set by `cuInit`. Outside the lock: a real driver answers `cuCtxGetDevice` from
/// thread-local state, without a lock, and so does this one.
static INITIALIZED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    static CURRENT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

fn with<T>(f: impl FnOnce(&mut Driver) -> T) -> T {
    let mut guard = DRIVER.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Driver::new))
}

fn initialized() -> bool {
    INITIALIZED.load(std::sync::atomic::Ordering::Acquire)
}

fn current() -> Result<usize, CuResult> {
    if !initialized() {
        return Err(NOT_INITIALIZED);
    }
    CURRENT.with(|c| c.get()).ok_or(INVALID_CONTEXT)
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What processes sharing a simulated GPU agree on, in its state file.
/// The state file's first page. The simulated node backend reads `busy_ns` from byte 16 as
/// a native-endian u64 (`allot_agent::gpu::fake_gpu_busy_ns`, which the efficiency
/// benchmark and tests use too): keep the layout.
#[repr(C)]
struct SharedPage {
    /// Processes waiting for the GPU.
    waiting: AtomicU64,
    /// Who holds (or last held) it: a process id and a count of its turns.
    owner: AtomicU64,
    /// Time the GPU ran kernels or switched between processes, in nanoseconds.
    busy_ns: AtomicU64,
    switches: AtomicU64,
}

/// One simulated GPU shared with other processes.
struct SharedGpu {
    fd: c_int,
    page: &'static SharedPage,
}

/// The shared state of device `dev`, when `ALLOT_FAKE_CUDA_SHARED_DIR` names a directory;
/// opened once per process and device (a state that cannot be opened leaves the device
/// unshared, as before).
fn shared_gpu(dev: usize) -> Option<&'static SharedGpu> {
    static OPEN: Mutex<Vec<(usize, Option<&'static SharedGpu>)>> = Mutex::new(Vec::new());
    let dir = std::env::var_os("ALLOT_FAKE_CUDA_SHARED_DIR")?;
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, g)) = open.iter().find(|(d, _)| *d == dev) {
        return *g;
    }
    let path = std::path::Path::new(&dir).join(format!("{}.gpu", uuid_string(dev)));
    let gpu = open_shared(&path).map(|g| &*Box::leak(Box::new(g)));
    open.push((dev, gpu));
    gpu
}

fn open_shared(path: &std::path::Path) -> Option<SharedGpu> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path; the descriptor is kept for the process's life.
    let fd = unsafe {
        libc::open(
            c_path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o666,
        )
    };
    if fd < 0 {
        return None;
    }
    let size = std::mem::size_of::<SharedPage>() as libc::off_t;
    // SAFETY: `fd` is open; growing a new file fills it with zeros (every count 0).
    if unsafe { libc::ftruncate(fd, size.max(4096)) } != 0 {
        return None;
    }
    // SAFETY: a shared mapping of the file's first page, never unmapped: the page lives as
    // long as the process, and every field is an atomic.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: page-aligned, zero-initialised or written only as these atomics.
    let page = unsafe { &*(ptr as *const SharedPage) };
    Some(SharedGpu { fd, page })
}

fn flock(fd: c_int, op: c_int) {
    // SAFETY: `fd` is open; retried when a signal interrupts the wait.
    while unsafe { libc::flock(fd, op) } != 0 {
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// How long the GPU takes to pass from one process's context to another's.
fn switch_micros() -> u64 {
    static SWITCH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SWITCH.get_or_init(|| env_u64("ALLOT_FAKE_CUDA_SWITCH_MICROS", 25))
}

/// Runs a kernel of `micros` on a GPU other processes share: waits for its turn, pays the
/// context switch if another process ran last, runs, then lets a waiting process go first.
/// Returns when the kernel itself started and ended.
fn run_shared(gpu: &SharedGpu, micros: u64) -> (u64, u64) {
    static PRECISE: std::sync::Once = std::sync::Once::new();
    // Sleeps as long as asked, not 50 µs more: hand-overs between processes are then as
    // quick as the switch the model charges.
    // SAFETY: sets this thread's timer slack; no memory is passed.
    PRECISE.call_once(|| unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
    });
    let page = gpu.page;
    let pid = u64::from(std::process::id());
    page.waiting.fetch_add(1, Ordering::SeqCst);
    flock(gpu.fd, libc::LOCK_EX);
    page.waiting.fetch_sub(1, Ordering::SeqCst);
    let before = page.owner.load(Ordering::SeqCst);
    let turn = (pid << 32) | ((before.wrapping_add(1)) & 0xffff_ffff);
    page.owner.store(turn, Ordering::SeqCst);
    if before != 0 && before >> 32 != pid {
        let s0 = now_ns();
        std::thread::sleep(Duration::from_micros(switch_micros()));
        page.busy_ns.fetch_add(now_ns() - s0, Ordering::SeqCst);
        page.switches.fetch_add(1, Ordering::SeqCst);
    }
    let start = now_ns();
    std::thread::sleep(Duration::from_micros(micros));
    let end = now_ns();
    page.busy_ns.fetch_add(end - start, Ordering::SeqCst);
    flock(gpu.fd, libc::LOCK_UN);
    // Time-slicing: whoever waits runs next. (A waiter that died while waiting leaves the
    // count high; then this only waits out the bound below.)
    let bound = now_ns() + 2_000_000;
    while page.waiting.load(Ordering::SeqCst) > 0
        && page.owner.load(Ordering::SeqCst) == turn
        && now_ns() < bound
    {
        std::thread::sleep(Duration::from_micros(20));
    }
    (start, end)
}

/// Runs a kernel for `micros` on the current device.
fn run_kernel(micros: u64) -> CuResult {
    let dev = match current() {
        Ok(dev) => dev,
        Err(e) => return e,
    };
    if micros == 0 {
        return SUCCESS;
    }
    let (start, end) = match shared_gpu(dev) {
        Some(gpu) => run_shared(gpu, micros),
        None => {
            let start = now_ns();
            std::thread::sleep(Duration::from_micros(micros));
            (start, now_ns())
        }
    };
    with(|d| {
        d.busy_ns += end - start;
        d.intervals.push((start / 1000, end / 1000));
        if d.intervals.len() > 100_000 {
            d.intervals.drain(..50_000);
        }
    });
    SUCCESS
}

unsafe fn put<T>(out: *mut T, value: T) -> CuResult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller passed a non-null out-pointer, as the CUDA API requires.
    unsafe { out.write(value) };
    SUCCESS
}

unsafe fn alloc_into(out: *mut u64, size: u64) -> CuResult {
    match current().and_then(|dev| with(|d| d.allocate(dev, size))) {
        // SAFETY: as `put`.
        Ok(ptr) => unsafe { put(out, ptr) },
        Err(e) => e,
    }
}

// --- initialization, devices and contexts ---

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    with(|_| ());
    INITIALIZED.store(true, std::sync::atomic::Ordering::Release);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    // SAFETY: out-pointer from the caller.
    unsafe { put(version, 12040) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    if !initialized() {
        return NOT_INITIALIZED;
    }
    let n = with(|d| d.devices.len()) as c_int;
    // SAFETY: out-pointer from the caller.
    unsafe { put(count, n) }
}

fn device_index(dev: c_int) -> Result<usize, CuResult> {
    if !initialized() {
        return Err(NOT_INITIALIZED);
    }
    let n = with(|d| d.devices.len());
    usize::try_from(dev)
        .ok()
        .filter(|i| *i < n)
        .ok_or(INVALID_DEVICE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CuResult {
    match device_index(ordinal) {
        // SAFETY: out-pointer from the caller.
        Ok(_) => unsafe { put(device, ordinal) },
        Err(e) => e,
    }
}

/// The fake GPUs' UUIDs: those `ALLOT_FAKE_CUDA_UUIDS` lists (comma-separated, as NVML
/// writes them), else `GPU-fa000000-0000-0000-0000-0000000000NN`.
fn uuid_bytes(dev: usize) -> [u8; 16] {
    let listed = std::env::var("ALLOT_FAKE_CUDA_UUIDS")
        .ok()
        .and_then(|list| {
            let text = list
                .split(',')
                .nth(dev)?
                .trim()
                .strip_prefix("GPU-")?
                .replace('-', "");
            let mut b = [0u8; 16];
            for (i, byte) in b.iter_mut().enumerate() {
                *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
            }
            Some(b)
        });
    listed.unwrap_or_else(|| {
        let mut b = [0u8; 16];
        b[0] = 0xfa;
        b[15] = dev as u8;
        b
    })
}

fn uuid_string(dev: usize) -> String {
    let h: String = uuid_bytes(dev).iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: c_int) -> CuResult {
    match device_index(dev) {
        // SAFETY: out-pointer from the caller.
        Ok(i) => unsafe { put(uuid, uuid_bytes(i)) },
        Err(e) => e,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: c_int) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CuResult {
    match device_index(dev) {
        // SAFETY: out-pointer from the caller.
        Ok(i) => unsafe { put(bytes, with(|d| d.devices[i].total) as usize) },
        Err(e) => e,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CuResult {
    if let Err(e) = device_index(dev) {
        return e;
    }
    let text = c"Allot fake GPU".to_bytes_with_nul();
    let Ok(len) = usize::try_from(len) else {
        return INVALID_VALUE;
    };
    if name.is_null() || len < text.len() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's buffer holds `len` bytes, at least `text.len()`.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, text.len()) };
    SUCCESS
}

fn context_handle(dev: usize) -> *mut c_void {
    (dev + 1) as *mut c_void
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut *mut c_void,
    _flags: c_uint,
    dev: c_int,
) -> CuResult {
    let i = match device_index(dev) {
        Ok(i) => i,
        Err(e) => return e,
    };
    match with(|d| d.open_context(i)) {
        // SAFETY: out-pointer from the caller.
        SUCCESS => unsafe { put(ctx, context_handle(i)) },
        e => e,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuCtxCreate_v2(ctx, 0, dev) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(_dev: c_int) -> CuResult {
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(_ctx: *mut c_void) -> CuResult {
    CURRENT.with(|c| c.set(None));
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CuResult {
    let dev = (ctx as usize).checked_sub(1);
    CURRENT.with(|c| c.set(dev));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CuResult {
    let handle = CURRENT
        .with(|c| c.get())
        .map_or(std::ptr::null_mut(), context_handle);
    // SAFETY: out-pointer from the caller.
    unsafe { put(ctx, handle) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> CuResult {
    match current() {
        // SAFETY: out-pointer from the caller.
        Ok(i) => unsafe { put(dev, i as c_int) },
        Err(e) => e,
    }
}

// --- memory ---

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut u64, size: usize) -> CuResult {
    // SAFETY: out-pointer from the caller.
    unsafe { alloc_into(ptr, size as u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(ptr: *mut u64, size: usize, _flags: c_uint) -> CuResult {
    // SAFETY: out-pointer from the caller.
    unsafe { alloc_into(ptr, size as u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    ptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _element_size: c_uint,
) -> CuResult {
    if pitch.is_null() {
        return INVALID_VALUE;
    }
    let p = width.div_ceil(512) * 512;
    // SAFETY: out-pointers from the caller.
    match unsafe { alloc_into(ptr, (p * height.max(1)) as u64) } {
        SUCCESS => unsafe { put(pitch, p) },
        e => e,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    with(|d| d.free(ptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    _flags: u64,
) -> CuResult {
    if prop.is_null() {
        return INVALID_VALUE;
    }
    // CUmemAllocationProp: type, requestedHandleTypes, location.type, location.id (ints).
    // SAFETY: the caller passes a CUmemAllocationProp, which starts with four ints.
    let dev = unsafe { prop.cast::<c_int>().add(3).read() };
    let dev = match device_index(dev) {
        Ok(i) => i,
        Err(e) => return e,
    };
    match with(|d| d.allocate(dev, size as u64)) {
        // SAFETY: out-pointer from the caller.
        Ok(h) => unsafe { put(handle, h) },
        Err(e) => e,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    with(|d| d.free(handle))
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (the 2D descriptor is its first two fields, then format and
/// channels).
#[repr(C)]
pub struct Array3D {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

#[repr(C)]
pub struct Array2D {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

fn array_size(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    let bytes = match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    };
    (w.max(1) * h.max(1) * d.max(1) * channels.max(1) as usize * bytes) as u64
}

unsafe fn array_into(out: *mut u64, size: u64) -> CuResult {
    // SAFETY: out-pointer from the caller.
    unsafe { alloc_into(out, size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(array: *mut u64, desc: *const Array2D) -> CuResult {
    // SAFETY: the caller passes a valid descriptor.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return INVALID_VALUE;
    };
    let size = array_size(d.width, d.height, 1, d.format, d.channels);
    // SAFETY: out-pointer from the caller.
    unsafe { array_into(array, size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(array: *mut u64, desc: *const Array3D) -> CuResult {
    // SAFETY: the caller passes a valid descriptor.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return INVALID_VALUE;
    };
    let _ = d.flags;
    let size = array_size(d.width, d.height, d.depth, d.format, d.channels);
    // SAFETY: out-pointer from the caller.
    unsafe { array_into(array, size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut u64,
    desc: *const Array3D,
    levels: c_uint,
) -> CuResult {
    // SAFETY: the caller passes a valid descriptor.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return INVALID_VALUE;
    };
    let shrink = |x: usize, l: u32| if x == 0 { 0 } else { (x >> l).max(1) };
    let size = (0..levels.max(1))
        .map(|l| {
            array_size(
                shrink(d.width, l),
                shrink(d.height, l),
                shrink(d.depth, l),
                d.format,
                d.channels,
            )
        })
        .sum();
    // SAFETY: out-pointer from the caller.
    unsafe { array_into(array, size) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(array: u64) -> CuResult {
    with(|d| d.free(array))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMipmappedArrayDestroy(array: u64) -> CuResult {
    with(|d| d.free(array))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    let dev = match current() {
        Ok(i) => i,
        Err(e) => return e,
    };
    let (t, u) = with(|d| (d.devices[dev].total, d.devices[dev].used));
    // SAFETY: out-pointers from the caller.
    match unsafe { put(free, (t - u) as usize) } {
        SUCCESS => unsafe { put(total, t as usize) },
        e => e,
    }
}

/// Stream-ordered allocation and free: the stream is ignored (everything is synchronous).
macro_rules! async_memory {
    ($alloc:ident, $pool_alloc:ident, $free:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $alloc(
            ptr: *mut u64,
            size: usize,
            _stream: *mut c_void,
        ) -> CuResult {
            // SAFETY: out-pointer from the caller.
            unsafe { alloc_into(ptr, size as u64) }
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $pool_alloc(
            ptr: *mut u64,
            size: usize,
            _pool: *mut c_void,
            _stream: *mut c_void,
        ) -> CuResult {
            // SAFETY: out-pointer from the caller.
            unsafe { alloc_into(ptr, size as u64) }
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn $free(ptr: u64, _stream: *mut c_void) -> CuResult {
            with(|d| d.free(ptr))
        }
    };
}
async_memory!(cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync);
async_memory!(
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync_ptsz
);

// --- launches ---

macro_rules! launches {
    ($launch:ident, $launch_ex:ident, $cooperative:ident, $graph:ident) => {
        #[unsafe(no_mangle)]
        pub extern "C" fn $launch(
            _f: *mut c_void,
            grid_x: c_uint,
            _grid_y: c_uint,
            _grid_z: c_uint,
            _block_x: c_uint,
            _block_y: c_uint,
            _block_z: c_uint,
            _shared: c_uint,
            _stream: *mut c_void,
            _params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CuResult {
            run_kernel(u64::from(grid_x))
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $launch_ex(
            config: *const c_uint,
            _f: *mut c_void,
            _params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CuResult {
            if config.is_null() {
                return INVALID_VALUE;
            }
            // SAFETY: CUlaunchConfig starts with gridDimX.
            run_kernel(u64::from(unsafe { config.read() }))
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn $cooperative(
            _f: *mut c_void,
            grid_x: c_uint,
            _grid_y: c_uint,
            _grid_z: c_uint,
            _block_x: c_uint,
            _block_y: c_uint,
            _block_z: c_uint,
            _shared: c_uint,
            _stream: *mut c_void,
            _params: *mut *mut c_void,
        ) -> CuResult {
            run_kernel(u64::from(grid_x))
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn $graph(exec: *mut c_void, _stream: *mut c_void) -> CuResult {
            run_kernel(exec as u64)
        }
    };
}
launches!(
    cuLaunchKernel,
    cuLaunchKernelEx,
    cuLaunchCooperativeKernel,
    cuGraphLaunch
);
launches!(
    cuLaunchKernel_ptsz,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel_ptsz,
    cuGraphLaunch_ptsz
);

// --- entry points by name ---

fn entry_point(name: &[u8], per_thread: bool) -> Option<*mut c_void> {
    macro_rules! pick {
        ($legacy:ident, $ptsz:ident) => {
            if per_thread {
                $ptsz as *mut c_void
            } else {
                $legacy as *mut c_void
            }
        };
    }
    Some(match name {
        b"cuInit" => cuInit as *mut c_void,
        b"cuDriverGetVersion" => cuDriverGetVersion as *mut c_void,
        b"cuDeviceGetCount" => cuDeviceGetCount as *mut c_void,
        b"cuDeviceGet" => cuDeviceGet as *mut c_void,
        b"cuDeviceGetUuid" => cuDeviceGetUuid_v2 as *mut c_void,
        b"cuDeviceTotalMem" => cuDeviceTotalMem_v2 as *mut c_void,
        b"cuDeviceGetName" => cuDeviceGetName as *mut c_void,
        b"cuCtxCreate" => cuCtxCreate_v2 as *mut c_void,
        b"cuCtxDestroy" => cuCtxDestroy_v2 as *mut c_void,
        b"cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain as *mut c_void,
        b"cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease_v2 as *mut c_void,
        b"cuCtxSetCurrent" => cuCtxSetCurrent as *mut c_void,
        b"cuCtxGetCurrent" => cuCtxGetCurrent as *mut c_void,
        b"cuCtxGetDevice" => cuCtxGetDevice as *mut c_void,
        b"cuMemAlloc" => cuMemAlloc_v2 as *mut c_void,
        b"cuMemAllocPitch" => cuMemAllocPitch_v2 as *mut c_void,
        b"cuMemAllocManaged" => cuMemAllocManaged as *mut c_void,
        b"cuMemAllocAsync" => pick!(cuMemAllocAsync, cuMemAllocAsync_ptsz),
        b"cuMemAllocFromPoolAsync" => pick!(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
        b"cuMemFree" => cuMemFree_v2 as *mut c_void,
        b"cuMemFreeAsync" => pick!(cuMemFreeAsync, cuMemFreeAsync_ptsz),
        b"cuMemCreate" => cuMemCreate as *mut c_void,
        b"cuMemRelease" => cuMemRelease as *mut c_void,
        b"cuArrayCreate" => cuArrayCreate_v2 as *mut c_void,
        b"cuArray3DCreate" => cuArray3DCreate_v2 as *mut c_void,
        b"cuArrayDestroy" => cuArrayDestroy as *mut c_void,
        b"cuMipmappedArrayCreate" => cuMipmappedArrayCreate as *mut c_void,
        b"cuMipmappedArrayDestroy" => cuMipmappedArrayDestroy as *mut c_void,
        b"cuMemGetInfo" => cuMemGetInfo_v2 as *mut c_void,
        b"cuLaunchKernel" => pick!(cuLaunchKernel, cuLaunchKernel_ptsz),
        b"cuLaunchKernelEx" => pick!(cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
        b"cuLaunchCooperativeKernel" => {
            pick!(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz)
        }
        b"cuGraphLaunch" => pick!(cuGraphLaunch, cuGraphLaunch_ptsz),
        b"cuGetProcAddress" => cuGetProcAddress_v2 as *mut c_void,
        _ => return None,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    if symbol.is_null() || pfn.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a NUL-terminated symbol name from the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let found = entry_point(name, flags & PER_THREAD_DEFAULT_STREAM != 0);
    if !status.is_null() {
        // SAFETY: optional out-pointer from the caller. 0: found, 1: symbol not found.
        unsafe { status.write(if found.is_some() { 0 } else { 1 }) };
    }
    match found {
        // SAFETY: out-pointer from the caller.
        Some(f) => unsafe { put(pfn, f) },
        None => {
            // SAFETY: as above.
            unsafe { pfn.write(std::ptr::null_mut()) };
            NOT_FOUND
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    // SAFETY: same contract, without the status.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

// --- NVML ---

fn nvml_device(handle: *mut c_void) -> Option<usize> {
    let i = (handle as usize).checked_sub(1)?;
    (i < with(|d| d.devices.len())).then_some(i)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> c_int {
    NVML_SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> c_int {
    NVML_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> c_int {
    let n = with(|d| d.devices.len()) as c_uint;
    // SAFETY: out-pointer from the caller.
    if unsafe { put(count, n) } == SUCCESS {
        NVML_SUCCESS
    } else {
        NVML_ERROR_INVALID_ARGUMENT
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    handle: *mut *mut c_void,
) -> c_int {
    if index as usize >= with(|d| d.devices.len()) || handle.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: out-pointer from the caller.
    unsafe { handle.write(context_handle(index as usize)) };
    NVML_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    handle: *mut *mut c_void,
) -> c_int {
    if uuid.is_null() || handle.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: a NUL-terminated UUID from the caller.
    let wanted = unsafe { CStr::from_ptr(uuid) }
        .to_string_lossy()
        .into_owned();
    let n = with(|d| d.devices.len());
    match (0..n).find(|i| uuid_string(*i) == wanted) {
        Some(i) => {
            // SAFETY: out-pointer from the caller.
            unsafe { handle.write(context_handle(i)) };
            NVML_SUCCESS
        }
        None => NVML_ERROR_NOT_FOUND,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    handle: *mut c_void,
    uuid: *mut c_char,
    len: c_uint,
) -> c_int {
    let Some(i) = nvml_device(handle) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let text = uuid_string(i);
    if uuid.is_null() || (len as usize) <= text.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `len` bytes, more than the text and its NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast(), uuid, text.len());
        uuid.add(text.len()).write(0);
    }
    NVML_SUCCESS
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

fn memory_of(handle: *mut c_void) -> Option<(u64, u64)> {
    let i = nvml_device(handle)?;
    Some(with(|d| (d.devices[i].total, d.devices[i].used)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    handle: *mut c_void,
    out: *mut NvmlMemory,
) -> c_int {
    match memory_of(handle) {
        Some((total, used)) if !out.is_null() => {
            // SAFETY: out-pointer from the caller.
            unsafe {
                out.write(NvmlMemory {
                    total,
                    free: total - used,
                    used,
                })
            };
            NVML_SUCCESS
        }
        _ => NVML_ERROR_INVALID_ARGUMENT,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    handle: *mut c_void,
    out: *mut NvmlMemoryV2,
) -> c_int {
    match memory_of(handle) {
        Some((total, used)) if !out.is_null() => {
            // SAFETY: out-pointer from the caller, whose version field it set.
            unsafe {
                let version = (*out).version;
                out.write(NvmlMemoryV2 {
                    version,
                    total,
                    reserved: 0,
                    free: total - used,
                    used,
                })
            };
            NVML_SUCCESS
        }
        _ => NVML_ERROR_INVALID_ARGUMENT,
    }
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
pub struct ProcessSample {
    pid: c_uint,
    time_stamp: u64,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// One sample for this process: the share of the time since `last_seen` (µs, at most the
/// last second) its kernels ran.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    handle: *mut c_void,
    samples: *mut ProcessSample,
    count: *mut c_uint,
    last_seen: u64,
) -> c_int {
    if nvml_device(handle).is_none() || count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: in/out count from the caller.
    if samples.is_null() || unsafe { count.read() } < 1 {
        unsafe { count.write(1) };
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    let now = now_ns() / 1000;
    let from = last_seen.max(now.saturating_sub(1_000_000));
    if from >= now {
        return NVML_ERROR_NOT_FOUND;
    }
    let busy: u64 = with(|d| {
        d.intervals
            .iter()
            .filter(|(_, end)| *end > from)
            .map(|(start, end)| end.min(&now) - start.max(&from))
            .sum()
    });
    let window = now - from;
    let util = ((busy * 100 + window / 2) / window).min(100) as c_uint;
    // SAFETY: the caller's buffer holds at least one sample, and its count.
    unsafe {
        samples.write(ProcessSample {
            pid: std::process::id(),
            time_stamp: now,
            sm_util: util,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        });
        count.write(1);
    }
    NVML_SUCCESS
}

/// Test hook: the GPU time this process's kernels have used, in nanoseconds.
#[unsafe(no_mangle)]
pub extern "C" fn fakeCudaBusyNanos() -> u64 {
    with(|d| d.busy_ns)
}

/// Test hook: the time device `dev` has been busy with every sharing process's kernels and
/// the switches between them, in nanoseconds (0 when it is not shared).
#[unsafe(no_mangle)]
pub extern "C" fn fakeCudaGpuBusyNanos(dev: c_int) -> u64 {
    usize::try_from(dev)
        .ok()
        .and_then(shared_gpu)
        .map_or(0, |g| g.page.busy_ns.load(Ordering::SeqCst))
}
