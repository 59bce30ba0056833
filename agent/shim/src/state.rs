//! The shim's state in one process: the job's region, this process's slot in it, what this
//! process has allocated, and which CUDA devices are the job's GPUs.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use allot_shim_core::region::{AttachedRegion, process_alive};
use allot_shim_core::{MAX_GPUS, RegionError};

use crate::real;
use crate::{CUDA_ERROR_NOT_PERMITTED, SUCCESS};

/// Device ordinals the shim maps (more than any node has).
const MAX_ORDINALS: usize = 64;
const UNKNOWN: i32 = -2;
const NOT_OURS: i32 = -1;
const NO_SLOT: usize = usize::MAX;

/// What this process holds: device pointer or handle → (GPU index, bytes).
type Held = HashMap<u64, (usize, u64), std::hash::BuildHasherDefault<PointerHasher>>;

/// Device pointers are distinct: a folded multiply is hash enough, and much faster than
/// SipHash on the allocation path.
#[derive(Default)]
pub struct PointerHasher(u64);

impl std::hash::Hasher for PointerHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // A folded multiply: the high half of the product carries the pointer's high bits
        // down, so page-aligned pointers (low bits all zero) still spread over the buckets.
        let product = u128::from(v ^ self.0) * 0x9e37_79b9_7f4a_7c15;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

/// Why a call has no GPU of the job's to account to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoGpu {
    /// The driver's own error (no current context, say): passed on as it is.
    Driver(i32),
    /// The device is not one of the job's GPUs.
    NotOurs,
}

pub struct Shim {
    pub region: AttachedRegion,
    slot: AtomicUsize,
    held: Mutex<Held>,
    /// Whether this process has charged its CUDA context on each GPU.
    contexts: [AtomicBool; MAX_GPUS],
    /// CUDA ordinal → index of the job's GPU, [`NOT_OURS`], or [`UNKNOWN`] until looked up.
    ordinals: [AtomicI32; MAX_ORDINALS],
}

static SHIM: OnceLock<Result<Shim, String>> = OnceLock::new();
/// Set in a forked child: it takes a slot of its own before it charges anything.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    FORKED.store(true, Ordering::Release);
}

/// The shim, or why GPU access is refused (printed once).
pub fn shim() -> Option<&'static Shim> {
    SHIM.get_or_init(init).as_ref().ok()
}

/// Why the shim refuses GPU access, if it does.
pub fn refusal() -> Option<&'static str> {
    SHIM.get_or_init(init).as_ref().err().map(String::as_str)
}

#[allow(unsafe_code)]
fn init() -> Result<Shim, String> {
    let region = AttachedRegion::from_env().map_err(|e: RegionError| {
        let why = format!(
            "allot-shim: GPU access refused: {e}. This job's GPU limits could not be read, and \
             the shim fails closed."
        );
        eprintln!("{why}");
        why
    })?;
    // SAFETY: registers a handler that only stores to an atomic.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    let shim = Shim {
        region,
        slot: AtomicUsize::new(NO_SLOT),
        held: Mutex::new(Held::with_capacity_and_hasher(4096, Default::default())),
        contexts: std::array::from_fn(|_| AtomicBool::new(false)),
        ordinals: std::array::from_fn(|_| AtomicI32::new(UNKNOWN)),
    };
    Ok(shim)
}

fn uuid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[allow(unsafe_code)]
impl Shim {
    /// This process's slot, claimed on first use (and again in a forked child).
    pub fn slot(&self) -> Option<usize> {
        if FORKED.load(Ordering::Relaxed) && FORKED.swap(false, Ordering::AcqRel) {
            self.slot.store(NO_SLOT, Ordering::Release);
            for c in &self.contexts {
                c.store(false, Ordering::Release);
            }
            if let Ok(mut held) = self.held.lock() {
                held.clear();
            }
        }
        let s = self.slot.load(Ordering::Acquire);
        if s != NO_SLOT {
            return Some(s);
        }
        let claimed = self.region.claim_slot(std::process::id(), process_alive)?;
        self.slot.store(claimed, Ordering::Release);
        Some(claimed)
    }

    /// The job's GPU behind a CUDA device ordinal, by UUID: a device the job was not given
    /// (say, through a changed `CUDA_VISIBLE_DEVICES`) is not the job's.
    pub fn gpu_of(&self, ordinal: c_int) -> Option<usize> {
        let i = usize::try_from(ordinal)
            .ok()
            .filter(|i| *i < MAX_ORDINALS)?;
        let cached = self.ordinals[i].load(Ordering::Acquire);
        if cached != UNKNOWN {
            return usize::try_from(cached).ok();
        }
        let mut uuid = [0u8; 16];
        let get = real::cuDeviceGetUuid_v2().or_else(real::cuDeviceGetUuid)?;
        // SAFETY: the driver writes 16 bytes into `uuid`.
        if unsafe { get(&mut uuid, ordinal) } != SUCCESS {
            return None;
        }
        let found = self.region.gpu_index(&uuid_text(&uuid));
        self.ordinals[i].store(
            found.map_or(NOT_OURS, |g| i32::try_from(g).unwrap_or(NOT_OURS)),
            Ordering::Release,
        );
        found
    }

    /// The job's GPU the calling thread's current context is on.
    pub fn current_gpu(&self) -> Result<usize, NoGpu> {
        let get = real::cuCtxGetDevice().ok_or(NoGpu::Driver(CUDA_ERROR_NOT_PERMITTED))?;
        let mut dev: c_int = -1;
        // SAFETY: the driver writes the device ordinal.
        let r = unsafe { get(&mut dev) };
        if r != SUCCESS {
            return Err(NoGpu::Driver(r));
        }
        self.gpu_of(dev).ok_or(NoGpu::NotOurs)
    }

    /// Charges this process's CUDA context on `gpu`, once.
    pub fn ensure_context(&self, gpu: usize, slot: usize) -> bool {
        let Some(flag) = self.contexts.get(gpu) else {
            return false;
        };
        if flag.load(Ordering::Acquire) || flag.swap(true, Ordering::AcqRel) {
            return true;
        }
        let bytes = self.region.context_reserve_bytes();
        if self.reserve_bytes(gpu, slot, bytes) {
            true
        } else {
            flag.store(false, Ordering::Release);
            false
        }
    }

    fn reserve_bytes(&self, gpu: usize, slot: usize, bytes: u64) -> bool {
        if self.region.reserve(gpu, slot, bytes) {
            return true;
        }
        // Budget held by processes that have died comes back before we say no.
        self.region.sweep_dead(process_alive) > 0 && self.region.reserve(gpu, slot, bytes)
    }

    /// Charges `bytes` on `gpu` to this process (and its context, first time), within the
    /// job's limit. `None`: over the limit.
    pub fn reserve(&self, gpu: usize, bytes: u64) -> Option<usize> {
        let slot = self.slot()?;
        if !self.ensure_context(gpu, slot) {
            return None;
        }
        self.reserve_bytes(gpu, slot, bytes).then_some(slot)
    }

    pub fn release(&self, gpu: usize, bytes: u64) {
        if let Some(slot) = self.slot() {
            self.region.release(gpu, slot, bytes);
        }
    }

    /// Remembers what an allocation holds, so its free returns the bytes.
    pub fn track(&self, handle: u64, gpu: usize, bytes: u64) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, (gpu, bytes));
    }

    /// Forgets an allocation being freed: what it held.
    pub fn untrack(&self, handle: u64) -> Option<(usize, u64)> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
    }
}
