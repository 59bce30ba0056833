//! The real driver's entry points, resolved once each and cached.
//!
//! The shim itself exports `dlsym`, so it never calls it: the real one comes from
//! `dlvsym`, and every real CUDA or NVML function from the real `dlsym` on the driver
//! library's own handle, which searches that library and never the preload.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

pub type CuResult = c_int;
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static LIBCUDA: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static LIBNVML: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// glibc's `dlsym`, under each version it has been published with.
pub fn dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: dlvsym with NUL-terminated names; RTLD_NEXT finds the definition after
            // this library, i.e. libc's.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: a non-null result is glibc's dlsym, whose signature DlsymFn is.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

fn library(cache: &AtomicPtr<c_void>, name: &std::ffi::CStr) -> *mut c_void {
    let mut h = cache.load(Ordering::Acquire);
    if h.is_null() {
        // SAFETY: dlopen of a NUL-terminated library name; the handle is kept for the
        // process's life (never closed).
        h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        cache.store(h, Ordering::Release);
    }
    h
}

pub fn libcuda() -> *mut c_void {
    library(&LIBCUDA, c"libcuda.so.1")
}

pub fn libnvml() -> *mut c_void {
    library(&LIBNVML, c"libnvidia-ml.so.1")
}

/// The real definition of `name` in the library behind `handle`.
pub fn resolve(handle: *mut c_void, name: &std::ffi::CStr) -> *mut c_void {
    match dlsym() {
        // SAFETY: the real dlsym, with a handle from dlopen (or null, which it rejects) and a
        // NUL-terminated name.
        Some(f) if !handle.is_null() => unsafe { f(handle, name.as_ptr()) },
        _ => null_mut(),
    }
}

/// Declares accessors for real functions of one library: `real::cuMemAlloc_v2()` returns the
/// driver's function, or `None` where the driver has no such entry point.
macro_rules! real_functions {
    ($lib:ident; $($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {$(
        #[allow(non_snake_case)]
        pub fn $name() -> Option<unsafe extern "C" fn($($arg),*) -> $ret> {
            static PTR: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
            let mut p = PTR.load(Ordering::Acquire);
            if p.is_null() {
                p = resolve($lib(), {
                    const NAME: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
                        concat!(stringify!($name), "\0").as_bytes(),
                    ) {
                        Ok(n) => n,
                        Err(_) => panic!("a symbol name with a NUL in it"),
                    };
                    NAME
                });
                PTR.store(p, Ordering::Release);
            }
            // SAFETY: the symbol is the driver's function of this name, whose C signature
            // is the one declared here (from cuda.h / nvml.h).
            (!p.is_null()).then(|| unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p)
            })
        }
    )*};
}

real_functions! { libcuda;
    cuInit: fn(c_uint) -> CuResult;
    cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;
    cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;
    cuCtxGetDevice: fn(*mut c_int) -> CuResult;
    cuDeviceGetUuid_v2: fn(*mut [u8; 16], c_int) -> CuResult;
    cuDeviceGetUuid: fn(*mut [u8; 16], c_int) -> CuResult;
    cuMemAlloc_v2: fn(*mut u64, usize) -> CuResult;
    cuMemAllocPitch_v2: fn(*mut u64, *mut usize, usize, usize, c_uint) -> CuResult;
    cuMemAllocManaged: fn(*mut u64, usize, c_uint) -> CuResult;
    cuMemAllocAsync: fn(*mut u64, usize, *mut c_void) -> CuResult;
    cuMemAllocAsync_ptsz: fn(*mut u64, usize, *mut c_void) -> CuResult;
    cuMemAllocFromPoolAsync: fn(*mut u64, usize, *mut c_void, *mut c_void) -> CuResult;
    cuMemAllocFromPoolAsync_ptsz: fn(*mut u64, usize, *mut c_void, *mut c_void) -> CuResult;
    cuMemCreate: fn(*mut u64, usize, *const c_void, u64) -> CuResult;
    cuArrayCreate_v2: fn(*mut u64, *const c_void) -> CuResult;
    cuArray3DCreate_v2: fn(*mut u64, *const c_void) -> CuResult;
    cuMipmappedArrayCreate: fn(*mut u64, *const c_void, c_uint) -> CuResult;
    cuMemFree_v2: fn(u64) -> CuResult;
    cuMemFreeAsync: fn(u64, *mut c_void) -> CuResult;
    cuMemFreeAsync_ptsz: fn(u64, *mut c_void) -> CuResult;
    cuMemRelease: fn(u64) -> CuResult;
    cuArrayDestroy: fn(u64) -> CuResult;
    cuMipmappedArrayDestroy: fn(u64) -> CuResult;
    cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> CuResult;
    cuDeviceTotalMem_v2: fn(*mut usize, c_int) -> CuResult;
    cuLaunchKernel: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> CuResult;
    cuLaunchKernel_ptsz: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> CuResult;
    cuLaunchKernelEx: fn(*const c_void, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> CuResult;
    cuLaunchKernelEx_ptsz: fn(*const c_void, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> CuResult;
    cuLaunchCooperativeKernel: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void) -> CuResult;
    cuLaunchCooperativeKernel_ptsz: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void) -> CuResult;
    cuGraphLaunch: fn(*mut c_void, *mut c_void) -> CuResult;
    cuGraphLaunch_ptsz: fn(*mut c_void, *mut c_void) -> CuResult;
}

real_functions! { libnvml;
    nvmlInit_v2: fn() -> c_int;
    nvmlDeviceGetHandleByUUID: fn(*const c_char, *mut *mut c_void) -> c_int;
    nvmlDeviceGetUUID: fn(*mut c_void, *mut c_char, c_uint) -> c_int;
    nvmlDeviceGetMemoryInfo: fn(*mut c_void, *mut c_void) -> c_int;
    nvmlDeviceGetMemoryInfo_v2: fn(*mut c_void, *mut c_void) -> c_int;
    nvmlDeviceGetProcessUtilization: fn(*mut c_void, *mut c_void, *mut c_uint, u64) -> c_int;
}
