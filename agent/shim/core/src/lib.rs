//! What the GPU-sharing shim (`liballot_shim.so`, preloaded into jobs on shared GPUs) and
//! the node agent agree on.
//!
//! - [`region`]: the two shared-memory objects the agent creates for each job. The *limits*
//!   page (memory limit, compute share and mode per GPU) is sealed against writes by anyone
//!   but the agent's own mapping, so a job can read its limits and never raise them; the
//!   *usage* page holds what the job's processes have allocated and their launch pacing,
//!   shared by all of them.
//! - [`pacer`]: the launch pacer every kernel launch passes (one compare-and-swap).
//! - [`controller`]: the feedback loop that sets the pacer's rate from measured utilization.
//! - [`arrays`]: how many bytes a CUDA array asks for, from its descriptor.
//!
//! Nothing here calls CUDA; the controller and the size arithmetic are pure.

pub mod arrays;
pub mod controller;
pub mod pacer;
#[cfg(feature = "probe")]
pub mod probe;
pub mod region;

pub use region::{
    AttachedRegion, ComputeMode, GpuGrant, JobRegion, LIMITS_FD_ENV, MAX_GPUS, MAX_PROCS,
    RegionError, RegionView, USAGE_FD_ENV, process_alive,
};

#[allow(unsafe_code)]
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into `ts`, which outlives the call.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the machine, so the
/// processes of a job and the agent compare launch times directly.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The same clock at tick resolution (a few milliseconds), several times cheaper to read:
/// for stamps that only need to say "recently".
pub fn monotonic_coarse_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}
