//! Kernel and graph launches: each passes the job's pacer for its GPU before it reaches the
//! driver, and a controller thread keeps the pacer's rate at the job's compute share.

use std::ffi::{c_uint, c_void};
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

use allot_shim_core::{MAX_GPUS, controller, monotonic_coarse_ns, monotonic_ns, pacer};

use crate::real;
use crate::state::{NoGpu, Shim, shim};
use crate::{CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY};

/// Lets a launch through when its turn comes. `Err`: refused (no limits, or a GPU that is
/// not the job's).
fn admit() -> Result<(), i32> {
    let Some(shim) = shim() else {
        return Err(CUDA_ERROR_NOT_PERMITTED);
    };
    let gpu = match shim.current_gpu() {
        Ok(g) => g,
        Err(NoGpu::NotOurs) => return Err(CUDA_ERROR_NOT_PERMITTED),
        // No context: the driver will say so itself.
        Err(NoGpu::Driver(_)) => return Ok(()),
    };
    let (Some(limits), Some(usage)) = (shim.region.limits(gpu), shim.region.usage(gpu)) else {
        return Ok(());
    };
    // A process that launches work holds a context on the GPU, and is one of the job's
    // processes whose utilization the controller adds up.
    match shim.slot() {
        Some(slot) if shim.ensure_context(gpu, slot) => {}
        _ => return Err(CUDA_ERROR_OUT_OF_MEMORY),
    }
    CONTROLLER.call_once(|| start_controller(shim));
    if !limits.throttled() {
        pacer::record_launch(usage, monotonic_coarse_ns());
        return Ok(());
    }
    let now = monotonic_ns();
    pacer::record_launch(usage, now);
    let wait = pacer::pace(usage, now);
    if wait > 0 {
        usage.held_back_ns.fetch_add(wait, Ordering::AcqRel);
        std::thread::sleep(Duration::from_nanos(wait));
    }
    Ok(())
}

static CONTROLLER: Once = Once::new();

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessSample {
    pid: c_uint,
    time_stamp: u64,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

const NVML_SUCCESS: i32 = 0;

/// NVML device handles of the job's GPUs, looked up by UUID once.
static NVML_HANDLES: [AtomicPtr<c_void>; MAX_GPUS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_GPUS];

fn nvml_handle(shim: &Shim, gpu: usize) -> Option<*mut c_void> {
    let cached = NVML_HANDLES.get(gpu)?.load(Ordering::Acquire);
    if !cached.is_null() {
        return Some(cached);
    }
    let uuid = std::ffi::CString::new(shim.region.limits(gpu)?.uuid()).ok()?;
    let mut handle = std::ptr::null_mut();
    let by_uuid = real::nvmlDeviceGetHandleByUUID()?;
    // SAFETY: NVML writes the handle; the UUID is NUL-terminated.
    if unsafe { by_uuid(uuid.as_ptr(), &mut handle) } != NVML_SUCCESS || handle.is_null() {
        return None;
    }
    NVML_HANDLES[gpu].store(handle, Ordering::Release);
    Some(handle)
}

/// The job's utilization of `gpu` since `since_us` (NVML timestamps): the sum over its
/// processes of each one's mean SM utilization in the samples, and the newest timestamp.
fn measure(shim: &Shim, gpu: usize, since_us: u64) -> Option<(f64, u64)> {
    let handle = nvml_handle(shim, gpu)?;
    let get = real::nvmlDeviceGetProcessUtilization()?;
    let mut samples = vec![ProcessSample::default(); 512];
    let mut count = samples.len() as c_uint;
    // SAFETY: NVML fills at most `count` samples of the buffer and says how many.
    let r = unsafe { get(handle, samples.as_mut_ptr().cast(), &mut count, since_us) };
    if r != NVML_SUCCESS {
        return None;
    }
    let samples = &samples[..(count as usize).min(samples.len())];
    let pids = shim.region.pids();
    let mut per_pid: Vec<(u32, u64, u64)> = Vec::new();
    for s in samples.iter().filter(|s| pids.contains(&s.pid)) {
        match per_pid.iter_mut().find(|(p, _, _)| *p == s.pid) {
            Some((_, total, n)) => {
                *total += u64::from(s.sm_util);
                *n += 1;
            }
            None => per_pid.push((s.pid, u64::from(s.sm_util), 1)),
        }
    }
    let utilization: f64 = per_pid
        .iter()
        .map(|(_, total, n)| *total as f64 / *n as f64 / 100.0)
        .sum();
    let seen = samples
        .iter()
        .map(|s| s.time_stamp)
        .max()
        .unwrap_or(since_us);
    Some((utilization.min(1.0), seen))
}

/// One thread per process runs the control step of each GPU whose share is below 1000;
/// the shared gate in the region lets one process of the job act per period.
fn start_controller(shim: &'static Shim) {
    let spawned = std::thread::Builder::new()
        .name("allot-shim-ctl".into())
        .spawn(move || {
            if let Some(init) = real::nvmlInit_v2() {
                // SAFETY: nvmlInit_v2 takes no arguments; calling it again is harmless.
                unsafe { init() };
            }
            loop {
                std::thread::sleep(Duration::from_nanos(controller::PERIOD_NS / 4));
                for gpu in 0..shim.region.gpu_count() {
                    let (Some(limits), Some(usage)) =
                        (shim.region.limits(gpu), shim.region.usage(gpu))
                    else {
                        continue;
                    };
                    if limits.compute_milli() >= 1000 {
                        continue;
                    }
                    controller::tick(limits, usage, monotonic_ns(), |since| {
                        measure(shim, gpu, since)
                    });
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("allot-shim: cannot start the compute controller: {e}");
    }
}

macro_rules! launch_hooks {
    ($launch:ident, $launch_ex:ident, $cooperative:ident, $graph:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $launch(
            f: *mut c_void,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> i32 {
            if let Err(e) = admit() {
                return e;
            }
            // SAFETY: the caller's arguments, passed through unchanged.
            real::$launch().map_or(CUDA_ERROR_NOT_FOUND, |real| unsafe {
                real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
            })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $launch_ex(
            config: *const c_void,
            f: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> i32 {
            if let Err(e) = admit() {
                return e;
            }
            // SAFETY: the caller's arguments, passed through unchanged.
            real::$launch_ex().map_or(CUDA_ERROR_NOT_FOUND, |real| unsafe {
                real(config, f, params, extra)
            })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $cooperative(
            f: *mut c_void,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: *mut c_void,
            params: *mut *mut c_void,
        ) -> i32 {
            if let Err(e) = admit() {
                return e;
            }
            // SAFETY: the caller's arguments, passed through unchanged.
            real::$cooperative().map_or(CUDA_ERROR_NOT_FOUND, |real| unsafe {
                real(f, gx, gy, gz, bx, by, bz, shared, stream, params)
            })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $graph(exec: *mut c_void, stream: *mut c_void) -> i32 {
            if let Err(e) = admit() {
                return e;
            }
            // SAFETY: the caller's arguments, passed through unchanged.
            real::$graph().map_or(CUDA_ERROR_NOT_FOUND, |real| unsafe { real(exec, stream) })
        }
    };
}
launch_hooks!(
    cuLaunchKernel,
    cuLaunchKernelEx,
    cuLaunchCooperativeKernel,
    cuGraphLaunch
);
launch_hooks!(
    cuLaunchKernel_ptsz,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel_ptsz,
    cuGraphLaunch_ptsz
);
