//! The training loop: kernels back to back, checkpoints on a period and on SIGTERM.
#![allow(unsafe_code)] // installing the SIGTERM handler

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::Args;
use crate::cuda::Gpu;

static TERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERM.store(true, Ordering::SeqCst);
}

/// The kernel-seconds a checkpoint holds (0 without one).
pub fn restore(dir: &Path) -> f64 {
    std::fs::read_to_string(dir.join("checkpoint"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .filter(|w: &f64| w.is_finite() && *w >= 0.0)
        .unwrap_or(0.0)
}

pub fn run(args: &Args) -> Result<(), String> {
    let progress_dir = PathBuf::from(
        args.text("progress-dir")
            .ok_or("--progress-dir is required")?,
    );
    let checkpoint_dir = std::env::var_os("ALLOT_CHECKPOINT_DIR")
        .map(PathBuf::from)
        .or_else(|| args.text("checkpoint-dir").map(PathBuf::from))
        .ok_or("no checkpoint directory: ALLOT_CHECKPOINT_DIR or --checkpoint-dir")?;
    let kernel_us: u32 = args.num("kernel-us", 2000)?;
    let every = Duration::from_secs_f64(args.num::<f64>("checkpoint-secs", 30.0)?.max(0.1));
    if kernel_us == 0 {
        return Err("--kernel-us must be at least 1".into());
    }
    std::fs::create_dir_all(&checkpoint_dir)
        .map_err(|e| format!("checkpoint directory {}: {e}", checkpoint_dir.display()))?;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
    }
    let job = std::env::var("ALLOT_JOB_ID").unwrap_or_else(|_| std::process::id().to_string());
    let attempt = std::env::var("ALLOT_ATTEMPT").unwrap_or_else(|_| "1".into());
    let progress = progress_dir.join(format!("{job}-{attempt}"));
    let restored = restore(&checkpoint_dir);
    let gpu = Gpu::open()?;
    gpu.bind()?;
    let kernel_s = f64::from(kernel_us) / 1e6;
    let (mut work, mut saved_at, mut reported_at) = (0.0, Instant::now(), Instant::now());
    let report = |work: f64| {
        crate::write_atomic(&progress, &format!("{work:.6} {restored:.6}\n"))
            .map_err(|e| format!("progress {}: {e}", progress.display()))
    };
    let save = |work: f64| {
        crate::write_atomic(
            &checkpoint_dir.join("checkpoint"),
            &format!("{:.6}\n", restored + work),
        )
        .map_err(|e| format!("checkpoint in {}: {e}", checkpoint_dir.display()))
    };
    report(work)?;
    while !TERM.load(Ordering::SeqCst) {
        gpu.kernel(kernel_us)?;
        work += kernel_s;
        if reported_at.elapsed() >= Duration::from_millis(200) {
            report(work)?;
            reported_at = Instant::now();
        }
        if saved_at.elapsed() >= every {
            save(work)?;
            saved_at = Instant::now();
        }
    }
    save(work)?;
    report(work)
}
