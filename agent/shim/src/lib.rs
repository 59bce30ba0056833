//! `liballot_shim.so`: preloaded (`LD_PRELOAD`) into jobs the agent places on shared GPUs,
//! it holds each job to its GPU-memory limit and compute share.
//!
//! - **Interception.** The shim exports the CUDA driver entry points it polices, so programs
//!   linked against `libcuda.so.1` reach it first; it exports `dlsym`, so programs that
//!   `dlopen` the driver and look entry points up get it too; and it wraps
//!   `cuGetProcAddress` (and `_v2`), through which CUDA 11.3+ runtimes and PyTorch obtain
//!   every driver function. See [`hooks::entry`].
//! - **Memory** ([`hooks::memory`]): every allocation entry point is charged to the job's
//!   budget *before* the driver allocates, and refused with `CUDA_ERROR_OUT_OF_MEMORY` past
//!   the limit; frees return the bytes; each process's CUDA context is charged once per GPU.
//!   `cuMemGetInfo`, `cuDeviceTotalMem` and NVML's memory info report the limit and the
//!   job's usage ([`hooks::info`]).
//! - **Compute** ([`hooks::launch`]): kernel and graph launches pass a pacer whose rate a
//!   feedback controller sets from the job's measured utilization (NVML), so that a job
//!   with a 30% share gets about 30% of the GPU. `strict` jobs are always paced, `elastic`
//!   ones only while another job on the GPU is launching work.
//! - **Limits** live in a region the agent creates and seals ([`allot_shim_core::region`]);
//!   nothing in the job's environment can raise them. When the region is missing or
//!   corrupt, the shim refuses GPU access: `cuInit` fails with `CUDA_ERROR_NOT_PERMITTED`
//!   and says why on stderr (fail closed, with no switch to fail open: the only place such a
//!   switch could live is the job's own environment).
#![allow(unsafe_code)] // the whole crate is a C ABI interposer
#![allow(clippy::missing_safety_doc)]

mod hooks;
mod real;
mod state;

pub(crate) const SUCCESS: i32 = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: i32 = 1;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
pub(crate) const CUDA_ERROR_NOT_FOUND: i32 = 500;
pub(crate) const CUDA_ERROR_NOT_PERMITTED: i32 = 800;
