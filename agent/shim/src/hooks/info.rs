//! What the job is told about GPU memory: its limit as the total and its budget left as
//! free, so frameworks size their caches to the limit rather than to the card.

use std::ffi::{c_char, c_int, c_void};

use crate::real;
use crate::state::{NoGpu, shim};
use crate::{CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_PERMITTED, SUCCESS};

/// Memory info for the job's GPU `gpu`: (total, free), given the driver's free.
fn job_view(gpu: usize, real_free: u64) -> Option<(u64, u64)> {
    let shim = shim()?;
    // The context counts from the first look, as it does on the card.
    if let Some(slot) = shim.slot() {
        shim.ensure_context(gpu, slot);
    }
    let limit = shim.region.limits(gpu)?.memory_limit();
    let left = limit.saturating_sub(shim.region.used(gpu));
    Some((limit, left.min(real_free)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> i32 {
    let Some(real) = real::cuMemGetInfo_v2() else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's out-pointers, passed through.
    let r = unsafe { real(free, total) };
    if r != SUCCESS {
        return r;
    }
    let Some(shim) = shim() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    let view = match shim.current_gpu() {
        Ok(gpu) => {
            // SAFETY: written by the driver just now.
            let real_free = unsafe { free.as_ref() }.map_or(0, |f| *f as u64);
            job_view(gpu, real_free).unwrap_or((0, 0))
        }
        Err(NoGpu::NotOurs) => (0, 0),
        Err(NoGpu::Driver(e)) => return e,
    };
    // SAFETY: the caller's out-pointers (the driver accepted them).
    unsafe {
        if !total.is_null() {
            total.write(view.0 as usize);
        }
        if !free.is_null() {
            free.write(view.1 as usize);
        }
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> i32 {
    let Some(real) = real::cuDeviceTotalMem_v2() else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed through.
    let r = unsafe { real(bytes, dev) };
    if r != SUCCESS {
        return r;
    }
    let Some(shim) = shim() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    let limit = shim
        .gpu_of(dev)
        .and_then(|g| shim.region.limits(g))
        .map_or(0, |l| l.memory_limit());
    if !bytes.is_null() {
        // SAFETY: the caller's out-pointer (the driver accepted it).
        unsafe { bytes.write(limit as usize) };
    }
    SUCCESS
}

const NVML_SUCCESS: i32 = 0;
const NVML_ERROR_NO_PERMISSION: i32 = 4;
const NVML_ERROR_FUNCTION_NOT_FOUND: i32 = 13;

/// The job's GPU behind an NVML handle, by UUID; `None` for GPUs that are not the job's
/// (reported as the driver sees them: NVML is read-only information).
fn nvml_gpu(handle: *mut c_void) -> Option<usize> {
    let shim = shim()?;
    let get = real::nvmlDeviceGetUUID()?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: NVML writes at most `buf.len()` bytes, NUL-terminated.
    if unsafe { get(handle, buf.as_mut_ptr(), buf.len() as u32) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NUL-terminated by NVML on success.
    let uuid = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    shim.region.gpu_index(uuid.to_str().ok()?)
}

/// Rewrites an `nvmlMemory_t` / `nvmlMemory_v2_t` (total, free and used at these offsets).
unsafe fn rewrite(out: *mut c_void, gpu: usize, offsets: (usize, usize, usize)) {
    let Some(shim) = shim() else {
        return;
    };
    let base = out.cast::<u8>();
    // SAFETY: `out` is the caller's structure, which the driver filled; the offsets are
    // those of its u64 fields.
    unsafe {
        let real_free = base.add(offsets.1).cast::<u64>().read_unaligned();
        if let Some((total, free)) = job_view(gpu, real_free) {
            base.add(offsets.0).cast::<u64>().write_unaligned(total);
            base.add(offsets.1).cast::<u64>().write_unaligned(free);
            base.add(offsets.2)
                .cast::<u64>()
                .write_unaligned(shim.region.used(gpu));
        }
    }
}

fn nvml_memory(
    handle: *mut c_void,
    out: *mut c_void,
    real: Option<unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32>,
    offsets: (usize, usize, usize),
) -> i32 {
    let Some(real) = real else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    if shim().is_none() {
        return NVML_ERROR_NO_PERMISSION;
    }
    // SAFETY: the caller's arguments, passed through.
    let r = unsafe { real(handle, out) };
    if r == NVML_SUCCESS
        && !out.is_null()
        && let Some(gpu) = nvml_gpu(handle)
    {
        // SAFETY: filled by the driver just now.
        unsafe { rewrite(out, gpu, offsets) };
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: *mut c_void, memory: *mut c_void) -> i32 {
    // nvmlMemory_t { total, free, used }
    nvml_memory(device, memory, real::nvmlDeviceGetMemoryInfo(), (0, 8, 16))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    memory: *mut c_void,
) -> i32 {
    // nvmlMemory_v2_t { version (u32, padded), total, reserved, free, used }
    nvml_memory(
        device,
        memory,
        real::nvmlDeviceGetMemoryInfo_v2(),
        (8, 24, 32),
    )
}
