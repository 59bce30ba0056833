//! How programs reach the driver, and how each way is made to reach the shim instead:
//!
//! - linked against `libcuda.so.1`: the preload's exports come first (symbol interposition);
//! - `dlopen` + `dlsym`: the shim's `dlsym` answers with its own entry points;
//! - `cuGetProcAddress` / `_v2` (CUDA 11.3+ runtimes, PyTorch): the shim asks the driver,
//!   then hands back its own entry point in place of the driver's.
//!
//! And `cuInit`, which refuses GPU access when the job's limits cannot be read.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use super::{info, launch, memory};
use crate::state::refusal;
use crate::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_PERMITTED, SUCCESS, real,
};

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

macro_rules! entry {
    ($f:path) => {
        $f as *mut c_void
    };
}

/// The shim's entry point exported under this exact symbol name.
fn hook_for_symbol(name: &[u8]) -> Option<*mut c_void> {
    Some(match name {
        b"cuInit" => entry!(cuInit),
        b"cuGetProcAddress" => entry!(cuGetProcAddress),
        b"cuGetProcAddress_v2" => entry!(cuGetProcAddress_v2),
        b"cuMemAlloc_v2" => entry!(memory::cuMemAlloc_v2),
        b"cuMemAllocPitch_v2" => entry!(memory::cuMemAllocPitch_v2),
        b"cuMemAllocManaged" => entry!(memory::cuMemAllocManaged),
        b"cuMemAllocAsync" => entry!(memory::cuMemAllocAsync),
        b"cuMemAllocAsync_ptsz" => entry!(memory::cuMemAllocAsync_ptsz),
        b"cuMemAllocFromPoolAsync" => entry!(memory::cuMemAllocFromPoolAsync),
        b"cuMemAllocFromPoolAsync_ptsz" => entry!(memory::cuMemAllocFromPoolAsync_ptsz),
        b"cuMemCreate" => entry!(memory::cuMemCreate),
        b"cuArrayCreate_v2" => entry!(memory::cuArrayCreate_v2),
        b"cuArray3DCreate_v2" => entry!(memory::cuArray3DCreate_v2),
        b"cuMipmappedArrayCreate" => entry!(memory::cuMipmappedArrayCreate),
        b"cuMemFree_v2" => entry!(memory::cuMemFree_v2),
        b"cuMemFreeAsync" => entry!(memory::cuMemFreeAsync),
        b"cuMemFreeAsync_ptsz" => entry!(memory::cuMemFreeAsync_ptsz),
        b"cuMemRelease" => entry!(memory::cuMemRelease),
        b"cuArrayDestroy" => entry!(memory::cuArrayDestroy),
        b"cuMipmappedArrayDestroy" => entry!(memory::cuMipmappedArrayDestroy),
        b"cuMemGetInfo_v2" => entry!(info::cuMemGetInfo_v2),
        b"cuDeviceTotalMem_v2" => entry!(info::cuDeviceTotalMem_v2),
        b"nvmlDeviceGetMemoryInfo" => entry!(info::nvmlDeviceGetMemoryInfo),
        b"nvmlDeviceGetMemoryInfo_v2" => entry!(info::nvmlDeviceGetMemoryInfo_v2),
        b"cuLaunchKernel" => entry!(launch::cuLaunchKernel),
        b"cuLaunchKernel_ptsz" => entry!(launch::cuLaunchKernel_ptsz),
        b"cuLaunchKernelEx" => entry!(launch::cuLaunchKernelEx),
        b"cuLaunchKernelEx_ptsz" => entry!(launch::cuLaunchKernelEx_ptsz),
        b"cuLaunchCooperativeKernel" => entry!(launch::cuLaunchCooperativeKernel),
        b"cuLaunchCooperativeKernel_ptsz" => entry!(launch::cuLaunchCooperativeKernel_ptsz),
        b"cuGraphLaunch" => entry!(launch::cuGraphLaunch),
        b"cuGraphLaunch_ptsz" => entry!(launch::cuGraphLaunch_ptsz),
        _ => return None,
    })
}

/// The shim's entry point for a `cuGetProcAddress` request: the base name, the CUDA version
/// the caller was built for (which picks the ABI) and its flags (which pick the per-thread
/// default stream variants).
fn hook_for_request(name: &[u8], version: c_int, flags: u64) -> Option<*mut c_void> {
    let per_thread = flags & PER_THREAD_DEFAULT_STREAM != 0;
    let pick = |legacy: &[u8], ptsz: &[u8]| hook_for_symbol(if per_thread { ptsz } else { legacy });
    match name {
        b"cuInit"
        | b"cuMemAllocManaged"
        | b"cuMemCreate"
        | b"cuMemRelease"
        | b"cuArrayDestroy"
        | b"cuMipmappedArrayCreate"
        | b"cuMipmappedArrayDestroy" => hook_for_symbol(name),
        b"cuGetProcAddress" if version >= 12000 => entry!(cuGetProcAddress_v2).into(),
        b"cuGetProcAddress" => entry!(cuGetProcAddress).into(),
        // The `_v2` ABIs (64-bit sizes) since CUDA 3.2; older callers keep the driver's.
        b"cuMemAlloc" | b"cuMemAllocPitch" | b"cuMemFree" | b"cuMemGetInfo"
        | b"cuDeviceTotalMem" | b"cuArrayCreate" | b"cuArray3DCreate"
            if version >= 3020 =>
        {
            let mut v2 = name.to_vec();
            v2.extend_from_slice(b"_v2");
            hook_for_symbol(&v2)
        }
        b"cuMemAllocAsync" => pick(b"cuMemAllocAsync", b"cuMemAllocAsync_ptsz"),
        b"cuMemAllocFromPoolAsync" => {
            pick(b"cuMemAllocFromPoolAsync", b"cuMemAllocFromPoolAsync_ptsz")
        }
        b"cuMemFreeAsync" => pick(b"cuMemFreeAsync", b"cuMemFreeAsync_ptsz"),
        b"cuLaunchKernel" => pick(b"cuLaunchKernel", b"cuLaunchKernel_ptsz"),
        b"cuLaunchKernelEx" => pick(b"cuLaunchKernelEx", b"cuLaunchKernelEx_ptsz"),
        b"cuLaunchCooperativeKernel" => pick(
            b"cuLaunchCooperativeKernel",
            b"cuLaunchCooperativeKernel_ptsz",
        ),
        b"cuGraphLaunch" => pick(b"cuGraphLaunch", b"cuGraphLaunch_ptsz"),
        _ => None,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> i32 {
    if refusal().is_some() {
        return CUDA_ERROR_NOT_PERMITTED;
    }
    // SAFETY: the caller's argument, passed through.
    real::cuInit().map_or(CUDA_ERROR_NOT_FOUND, |f| unsafe { f(flags) })
}

/// Replaces the driver's answer with the shim's entry point where it has one.
unsafe fn substitute(
    r: i32,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> i32 {
    if r != SUCCESS || symbol.is_null() || pfn.is_null() {
        return r;
    }
    // SAFETY: non-null: the caller's NUL-terminated symbol and its out-pointer, which the
    // driver has just written.
    unsafe {
        if (*pfn).is_null() {
            return r;
        }
        if let Some(hook) = hook_for_request(CStr::from_ptr(symbol).to_bytes(), version, flags) {
            pfn.write(hook);
        }
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> i32 {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's arguments, passed through.
    let r = match (real::cuGetProcAddress_v2(), real::cuGetProcAddress()) {
        (Some(f), _) => unsafe { f(symbol, pfn, version, flags, status) },
        (None, Some(f)) => unsafe { f(symbol, pfn, version, flags) },
        (None, None) => CUDA_ERROR_NOT_FOUND,
    };
    // SAFETY: as `substitute` requires.
    unsafe { substitute(r, symbol, pfn, version, flags) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> i32 {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's arguments, passed through.
    let r = match (real::cuGetProcAddress(), real::cuGetProcAddress_v2()) {
        (Some(f), _) => unsafe { f(symbol, pfn, version, flags) },
        (None, Some(f)) => unsafe { f(symbol, pfn, version, flags, std::ptr::null_mut()) },
        (None, None) => CUDA_ERROR_NOT_FOUND,
    };
    // SAFETY: as `substitute` requires.
    unsafe { substitute(r, symbol, pfn, version, flags) }
}

/// `dlsym`: the shim's own entry point for the symbols it polices, glibc's answer for the
/// rest. (A lookup with `RTLD_NEXT` is answered as if made from the shim, which the agent
/// preloads first: it finds the first definition after the shim.)
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    if !symbol.is_null() {
        // SAFETY: the caller's NUL-terminated symbol name.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        if let Some(hook) = hook_for_symbol(name) {
            return hook;
        }
    }
    match real::dlsym() {
        // SAFETY: the caller's arguments, passed to glibc's dlsym.
        Some(f) => unsafe { f(handle, symbol) },
        None => std::ptr::null_mut(),
    }
}
