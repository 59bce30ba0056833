//! The CUDA driver, reached as applications reach it: `dlopen("libcuda.so.1")` and
//! `dlsym`, so a preloaded shim sees every call. Kernels are the fake driver's (a launch of
//! `gridDimX` runs that many microseconds): these workloads run on simulated GPUs only.
#![allow(unsafe_code)] // calling the driver's C entry points

use std::ffi::{CStr, c_int, c_uint, c_void};

type CuResult = c_int;
type Init = unsafe extern "C" fn(c_uint) -> CuResult;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> CuResult;
type PrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult;
type CtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> CuResult;
type LaunchKernel = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;

/// Device 0's primary context and the launch entry point.
pub struct Gpu {
    ctx: usize,
    set_current: CtxSetCurrent,
    launch: LaunchKernel,
}

fn sym<T: Copy>(lib: *mut c_void, name: &CStr) -> Result<T, String> {
    // SAFETY: `lib` is a handle from dlopen; `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("libcuda.so.1 has no {}", name.to_string_lossy()));
    }
    // SAFETY: `T` is the entry point's function pointer type, as cuda.h declares it.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn check(what: &str, r: CuResult) -> Result<(), String> {
    if r == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed: CUDA error {r}"))
    }
}

impl Gpu {
    /// Loads the driver, initialises it and retains device 0's primary context.
    pub fn open() -> Result<Self, String> {
        // SAFETY: a NUL-terminated name; the library stays loaded for the process's life.
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return Err("cannot load libcuda.so.1 (the CUDA driver)".into());
        }
        let init: Init = sym(lib, c"cuInit")?;
        let device_get: DeviceGet = sym(lib, c"cuDeviceGet")?;
        let retain: PrimaryCtxRetain = sym(lib, c"cuDevicePrimaryCtxRetain")?;
        let set_current: CtxSetCurrent = sym(lib, c"cuCtxSetCurrent")?;
        let launch: LaunchKernel = sym(lib, c"cuLaunchKernel")?;
        let mut dev: c_int = 0;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: the driver's entry points with valid out-pointers.
        unsafe {
            check("cuInit", init(0))?;
            check("cuDeviceGet", device_get(&mut dev, 0))?;
            check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
        }
        Ok(Gpu {
            ctx: ctx as usize,
            set_current,
            launch,
        })
    }

    /// Makes the context current on the calling thread (each launching thread does once).
    pub fn bind(&self) -> Result<(), String> {
        // SAFETY: a context the driver returned.
        check("cuCtxSetCurrent", unsafe {
            (self.set_current)(self.ctx as *mut c_void)
        })
    }

    /// Launches one kernel of `micros` and returns when it has run.
    pub fn kernel(&self, micros: u32) -> Result<(), String> {
        // SAFETY: the fake driver's kernel: no function or parameters are read.
        check("cuLaunchKernel", unsafe {
            (self.launch)(
                std::ptr::null_mut(),
                micros,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        })
    }
}
