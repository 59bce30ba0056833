//! Allocation and free entry points. Every allocation is charged to the job's budget before
//! the driver sees it; past the limit the caller gets `CUDA_ERROR_OUT_OF_MEMORY`, the error
//! a full GPU gives, so frameworks handle it as an ordinary OOM.

use std::ffi::{c_int, c_uint, c_void};

use allot_shim_core::arrays;

use crate::real;
use crate::state::{NoGpu, Shim, shim};
use crate::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_OUT_OF_MEMORY, SUCCESS,
};

/// Which GPU an allocation lands on.
enum Target {
    /// The calling thread's current context's device.
    Current,
    /// A device ordinal given in the call (`cuMemCreate`'s location).
    Ordinal(c_int),
}

fn target_gpu(shim: &Shim, target: Target) -> Result<usize, i32> {
    match target {
        Target::Current => shim.current_gpu(),
        Target::Ordinal(o) => shim.gpu_of(o).ok_or(NoGpu::NotOurs),
    }
    .map_err(|e| match e {
        NoGpu::Driver(code) => code,
        // A GPU that is not the job's has no budget at all.
        NoGpu::NotOurs => CUDA_ERROR_OUT_OF_MEMORY,
    })
}

/// Charges `bytes`, runs the allocation, and keeps the charge only if it succeeded.
/// `handle` reads what the allocation returned (pointer or handle), to free it by later.
fn charged(
    target: Target,
    bytes: u64,
    allocate: impl FnOnce() -> Option<i32>,
    handle: impl FnOnce() -> u64,
) -> i32 {
    let Some(shim) = shim() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    let gpu = match target_gpu(shim, target) {
        Ok(g) => g,
        Err(code) => return code,
    };
    if shim.reserve(gpu, bytes).is_none() {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    match allocate() {
        Some(SUCCESS) => {
            shim.track(handle(), gpu, bytes);
            SUCCESS
        }
        other => {
            shim.release(gpu, bytes);
            other.unwrap_or(CUDA_ERROR_NOT_FOUND)
        }
    }
}

/// Forgets the allocation, frees it, and returns its bytes if the free succeeded.
fn freed(handle: u64, free: impl FnOnce() -> Option<i32>) -> i32 {
    let shim = shim();
    let held = shim.and_then(|s| s.untrack(handle));
    let r = free().unwrap_or(CUDA_ERROR_NOT_FOUND);
    if let (Some(s), Some((gpu, bytes))) = (shim, held) {
        if r == SUCCESS {
            s.release(gpu, bytes);
        } else {
            s.track(handle, gpu, bytes);
        }
    }
    r
}

/// Reads an out-pointer the driver has just written.
unsafe fn read<T: Copy + Default>(p: *const T) -> T {
    if p.is_null() {
        T::default()
    } else {
        // SAFETY: the caller's out-pointer, written by the driver on success.
        unsafe { p.read() }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> i32 {
    charged(
        Target::Current,
        size as u64,
        // SAFETY: the caller's arguments, passed through unchanged.
        || real::cuMemAlloc_v2().map(|f| unsafe { f(dptr, size) }),
        || unsafe { read(dptr) },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> i32 {
    charged(
        Target::Current,
        size as u64,
        // SAFETY: the caller's arguments, passed through unchanged.
        || real::cuMemAllocManaged().map(|f| unsafe { f(dptr, size, flags) }),
        || unsafe { read(dptr) },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> i32 {
    let rows = height.max(1) as u64;
    let estimate = arrays::pitch_estimate(width as u64).saturating_mul(rows);
    let r = charged(
        Target::Current,
        estimate,
        // SAFETY: the caller's arguments, passed through unchanged.
        || {
            real::cuMemAllocPitch_v2()
                .map(|f| unsafe { f(dptr, pitch, width, height, element_size) })
        },
        || unsafe { read(dptr) },
    );
    if r != SUCCESS {
        return r;
    }
    // Correct the charge to the pitch the driver chose.
    // SAFETY: written by the driver on success.
    let actual = (unsafe { read(pitch) } as u64).saturating_mul(rows);
    let (Some(shim), ptr) = (shim(), unsafe { read(dptr) }) else {
        return r;
    };
    let Some((gpu, _)) = shim.untrack(ptr) else {
        return r;
    };
    if actual > estimate && shim.reserve(gpu, actual - estimate).is_none() {
        shim.release(gpu, estimate);
        if let Some(free) = real::cuMemFree_v2() {
            // SAFETY: frees the allocation just made.
            unsafe { free(ptr) };
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if actual < estimate {
        shim.release(gpu, estimate - actual);
    }
    shim.track(ptr, gpu, actual);
    SUCCESS
}

macro_rules! async_allocations {
    ($alloc:ident, $pool_alloc:ident, $free:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $alloc(dptr: *mut u64, size: usize, stream: *mut c_void) -> i32 {
            charged(
                Target::Current,
                size as u64,
                // SAFETY: the caller's arguments, passed through unchanged.
                || real::$alloc().map(|f| unsafe { f(dptr, size, stream) }),
                || unsafe { read(dptr) },
            )
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $pool_alloc(
            dptr: *mut u64,
            size: usize,
            pool: *mut c_void,
            stream: *mut c_void,
        ) -> i32 {
            charged(
                Target::Current,
                size as u64,
                // SAFETY: the caller's arguments, passed through unchanged.
                || real::$pool_alloc().map(|f| unsafe { f(dptr, size, pool, stream) }),
                || unsafe { read(dptr) },
            )
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $free(dptr: u64, stream: *mut c_void) -> i32 {
            // SAFETY: the caller's arguments, passed through unchanged.
            freed(dptr, || real::$free().map(|f| unsafe { f(dptr, stream) }))
        }
    };
}
async_allocations!(cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync);
async_allocations!(
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync_ptsz
);

/// `cuMemCreate` (virtual memory management): charged to the device in the allocation's
/// location.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> i32 {
    if prop.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // CUmemAllocationProp begins: type, requestedHandleTypes, location { type, id }.
    // SAFETY: the caller passes a CUmemAllocationProp, which starts with four ints.
    let (location_type, ordinal) = unsafe {
        let ints = prop.cast::<c_int>();
        (ints.add(2).read(), ints.add(3).read())
    };
    // CU_MEM_LOCATION_TYPE_DEVICE = 1; other locations (host memory) are not GPU memory.
    let target = if location_type == 1 {
        Target::Ordinal(ordinal)
    } else {
        // SAFETY: the caller's arguments, passed through unchanged.
        return real::cuMemCreate().map_or(CUDA_ERROR_NOT_FOUND, |f| unsafe {
            f(handle, size, prop, flags)
        });
    };
    charged(
        target,
        size as u64,
        // SAFETY: the caller's arguments, passed through unchanged.
        || real::cuMemCreate().map(|f| unsafe { f(handle, size, prop, flags) }),
        || unsafe { read(handle) },
    )
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(array: *mut u64, desc: *const c_void) -> i32 {
    // SAFETY: the caller passes a CUDA_ARRAY_DESCRIPTOR (or null).
    let Some(d) = (unsafe { desc.cast::<ArrayDescriptor>().as_ref() }) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let bytes = arrays::array_bytes(d.width as u64, d.height as u64, 1, d.format, d.channels);
    charged(
        Target::Current,
        bytes,
        // SAFETY: the caller's arguments, passed through unchanged.
        || real::cuArrayCreate_v2().map(|f| unsafe { f(array, desc) }),
        || unsafe { read(array) },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(array: *mut u64, desc: *const c_void) -> i32 {
    // SAFETY: the caller passes a CUDA_ARRAY3D_DESCRIPTOR (or null).
    let Some(d) = (unsafe { desc.cast::<Array3dDescriptor>().as_ref() }) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let _ = d.flags;
    let bytes = arrays::array_bytes(
        d.width as u64,
        d.height as u64,
        d.depth as u64,
        d.format,
        d.channels,
    );
    charged(
        Target::Current,
        bytes,
        // SAFETY: the caller's arguments, passed through unchanged.
        || real::cuArray3DCreate_v2().map(|f| unsafe { f(array, desc) }),
        || unsafe { read(array) },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut u64,
    desc: *const c_void,
    levels: c_uint,
) -> i32 {
    // SAFETY: the caller passes a CUDA_ARRAY3D_DESCRIPTOR (or null).
    let Some(d) = (unsafe { desc.cast::<Array3dDescriptor>().as_ref() }) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let bytes = arrays::mipmapped_bytes(
        d.width as u64,
        d.height as u64,
        d.depth as u64,
        d.format,
        d.channels,
        levels,
    );
    charged(
        Target::Current,
        bytes,
        // SAFETY: the caller's arguments, passed through unchanged.
        || real::cuMipmappedArrayCreate().map(|f| unsafe { f(array, desc, levels) }),
        || unsafe { read(array) },
    )
}

macro_rules! frees {
    ($($name:ident),*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(handle: u64) -> i32 {
            // SAFETY: the caller's argument, passed through unchanged.
            freed(handle, || real::$name().map(|f| unsafe { f(handle) }))
        }
    )*};
}
frees!(
    cuMemFree_v2,
    cuMemRelease,
    cuArrayDestroy,
    cuMipmappedArrayDestroy
);
