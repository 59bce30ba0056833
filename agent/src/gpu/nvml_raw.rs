//! The NVML calls `nvml-wrapper` does not wrap (MIG GPU and compute instances, placements,
//! row remapping), made on the raw symbols it loaded. This is the agent's only unsafe code:
//! each function checks the symbol is present, passes pointers to locals or to buffers of
//! the length it passes, and turns the return code into a `Result` before reading anything
//! the call wrote.
//!
//! Instances are always created at an explicit placement. Nothing here (or anywhere in the
//! agent) changes clocks, power limits, persistence or MIG mode, or resets a GPU.
#![allow(unsafe_code)]

use std::os::raw::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlComputeInstance_t, nvmlComputeInstanceProfileInfo_t,
    nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_SUCCESS,
};

/// At most this many GPU instances of one profile on one GPU (7 one-slice instances).
const MAX_INSTANCES: usize = 8;

/// Row-remapping counters (A100 and later).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RemappedRows {
    pub corrected: u32,
    pub uncorrected: u32,
    /// A remapping waits for the GPU to be reset.
    pub pending: bool,
    /// A remapping failed: the GPU needs service.
    pub failed: bool,
}

pub fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corrected, mut uncorrected, mut pending, mut failed): (
        c_uint,
        c_uint,
        c_uint,
        c_uint,
    ) = (0, 0, 0, 0);
    // SAFETY: the handle comes from a live `Device` of this `Nvml`; the out-pointers are to
    // locals that outlive the call.
    unsafe {
        nvml_try(sym(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failed,
        ))?;
    }
    Ok(RemappedRows {
        corrected,
        uncorrected,
        pending: pending != 0,
        failed: failed != 0,
    })
}

/// A GPU-instance profile as the driver describes it on this GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GiProfile {
    /// The profile id (`nvidia-smi mig -lgip`), what creation takes.
    pub id: u32,
    pub memory_slices: u32,
    pub max_instances: u32,
    pub memory_mib: u64,
    pub multiprocessors: u32,
}

/// The GPU-instance profiles this GPU supports (empty when it has no MIG).
pub fn gi_profiles(nvml: &Nvml, device: &Device<'_>) -> Result<Vec<GiProfile>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceProfileInfo.as_ref())?;
    let mut out = Vec::new();
    for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: a zeroed plain-C struct is a valid value to be overwritten.
        let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: live device handle; `info` is a local of the type the call fills.
        match nvml_try(unsafe { sym(device.handle(), index, &mut info) }) {
            Ok(()) => out.push(GiProfile {
                id: info.id,
                memory_slices: info.sliceCount,
                max_instances: info.instanceCount,
                memory_mib: info.memorySizeMB,
                multiprocessors: info.multiprocessorCount,
            }),
            // Profiles this board or MIG mode does not have.
            Err(NvmlError::NotSupported | NvmlError::InvalidArg | NvmlError::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Where an instance of `profile_id` may be placed now (free slices only): (start, size).
/// (`nvml-wrapper`'s `possible_placements` returns nothing, so the raw call.)
pub fn possible_placements(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let mut buf = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; MAX_INSTANCES];
    let mut count = MAX_INSTANCES as c_uint;
    // SAFETY: `buf` holds `count` placements, the length the call is told.
    let code = unsafe { sym(device.handle(), profile_id, buf.as_mut_ptr(), &mut count) };
    if code != nvmlReturn_enum_NVML_SUCCESS && code != nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
    {
        nvml_try(code)?;
    }
    let n = (count as usize).min(MAX_INSTANCES);
    Ok(buf[..n].iter().map(|p| (p.start, p.size)).collect())
}

/// A GPU instance that exists.
#[derive(Debug, Clone, Copy)]
pub struct GpuInstance {
    handle: nvmlGpuInstance_t,
    /// The GPU instance id (what MIG devices and processes name).
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
}

/// The GPU instances of `profile_id` on this GPU.
pub fn gpu_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<GpuInstance>, NvmlError> {
    let list = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
    let info = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let mut handles: [nvmlGpuInstance_t; MAX_INSTANCES] = [std::ptr::null_mut(); MAX_INSTANCES];
    let mut count: c_uint = 0;
    // SAFETY: `handles` has room for MAX_INSTANCES, the most one profile can have; the
    // driver writes `count` of them.
    nvml_try(unsafe {
        list(
            device.handle(),
            profile_id,
            handles.as_mut_ptr(),
            &mut count,
        )
    })?;
    let mut out = Vec::new();
    for &handle in &handles[..(count as usize).min(MAX_INSTANCES)] {
        // SAFETY: a zeroed plain-C struct (with a null device pointer) is overwritten.
        let mut i: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `handle` was just returned by the driver for this device.
        nvml_try(unsafe { info(handle, &mut i) })?;
        out.push(GpuInstance {
            handle,
            id: i.id,
            profile_id: i.profileId,
            start: i.placement.start,
        });
    }
    Ok(out)
}

/// The compute-instance profile that spans a whole GPU instance of `compute_slices`.
fn full_compute_profile(compute_slices: u32) -> Option<c_uint> {
    Some(match compute_slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7 => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    })
}

/// Creates a GPU instance of `profile_id` at exactly `start` (of `size` memory slices), and
/// one compute instance spanning its `compute_slices`. Returns the GPU instance id. If the
/// compute instance cannot be made, the GPU instance is destroyed again.
pub fn create_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    start: u32,
    size: u32,
    compute_slices: u32,
) -> Result<u32, NvmlError> {
    let create_gi = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let ci_info = nvml_sym(
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref(),
    )?;
    let create_ci = nvml_sym(nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let destroy_gi = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    let gi_info = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let ci_profile = full_compute_profile(compute_slices).ok_or(NvmlError::InvalidArg)?;
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: live device handle; `placement` and `gi` are locals.
    nvml_try(unsafe { create_gi(device.handle(), profile_id, &placement, &mut gi) })?;
    let made = (|| {
        // SAFETY: zeroed plain-C structs, overwritten by the calls; `gi` was just created.
        let mut ci: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        nvml_try(unsafe {
            ci_info(
                gi,
                ci_profile,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut ci,
            )
        })?;
        let mut handle: nvmlComputeInstance_t = std::ptr::null_mut();
        nvml_try(unsafe { create_ci(gi, ci.id, &mut handle) })?;
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        nvml_try(unsafe { gi_info(gi, &mut info) })?;
        Ok(info.id)
    })();
    if made.is_err() {
        // SAFETY: `gi` is the instance created above, with no compute instance.
        let _ = nvml_try(unsafe { destroy_gi(gi) });
    }
    made
}

/// Destroys `instance`: its compute instances first, then the GPU instance. The driver
/// refuses (`InUse`) while processes run on it.
pub fn destroy_instance(nvml: &Nvml, instance: &GpuInstance) -> Result<(), NvmlError> {
    let list_ci = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let ci_info = nvml_sym(
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref(),
    )?;
    let destroy_ci = nvml_sym(nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
    let destroy_gi = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    for ci_profile in [
        NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    ] {
        // SAFETY: zeroed plain-C struct overwritten by the call; the handle is the driver's.
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        let found = nvml_try(unsafe {
            ci_info(
                instance.handle,
                ci_profile,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        });
        if found.is_err() {
            // A compute profile this GPU instance cannot have.
            continue;
        }
        let mut handles: [nvmlComputeInstance_t; MAX_INSTANCES] =
            [std::ptr::null_mut(); MAX_INSTANCES];
        let mut count: c_uint = 0;
        // SAFETY: `handles` has room for MAX_INSTANCES (a GPU instance has at most 7
        // compute slices, so at most 7 compute instances).
        nvml_try(unsafe { list_ci(instance.handle, info.id, handles.as_mut_ptr(), &mut count) })?;
        for &ci in &handles[..(count as usize).min(MAX_INSTANCES)] {
            // SAFETY: `ci` was just listed by the driver.
            nvml_try(unsafe { destroy_ci(ci) })?;
        }
    }
    // SAFETY: the driver's handle, now without compute instances.
    nvml_try(unsafe { destroy_gi(instance.handle) })
}

/// The GPU instance id a MIG device handle belongs to.
pub fn gpu_instance_id(nvml: &Nvml, mig_device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id: c_uint = 0;
    // SAFETY: live (MIG) device handle; `id` is a local.
    nvml_try(unsafe { sym(mig_device.handle(), &mut id) })?;
    Ok(id)
}
