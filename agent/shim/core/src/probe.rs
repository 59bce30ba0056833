//! The C probe (`agent/shim/probe/probe.c`): a program that reaches the CUDA driver in every
//! way applications do, used by the shim's tests and by `allot bench shim`. This builds it
//! with the system C compiler against a driver library, which it links under the names
//! programs load (`libcuda.so.1`, `libnvidia-ml.so.1`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The probe's source.
pub const SOURCE: &str = include_str!("../../probe/probe.c");

/// A directory holding the driver under its loadable names, and the probe built against it.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Put this on `LD_LIBRARY_PATH`.
    pub driver_dir: PathBuf,
    pub program: PathBuf,
}

fn replace_with_symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    let tmp = link.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link)
}

/// Makes `dir` hold `driver` (the fake driver, or a real `libcuda.so`) under the names
/// programs load it by (`libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1`): the directory to
/// put on `LD_LIBRARY_PATH`. Safe to run from several processes at once.
pub fn link_driver(driver: &Path, dir: &Path) -> Result<(), String> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    std::fs::create_dir_all(dir).map_err(|e| io("creating the driver directory", e))?;
    for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
        replace_with_symlink(driver, &dir.join(name)).map_err(|e| io("linking the driver", e))?;
    }
    Ok(())
}

/// Builds the probe in `dir` against `driver` (the fake driver, or a real `libcuda.so`).
/// Safe to run from several processes at once: every file is written under a temporary
/// name and renamed into place.
pub fn build(driver: &Path, dir: &Path) -> Result<Probe, String> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    link_driver(driver, dir)?;
    let tag = std::process::id();
    let source = dir.join(format!("probe.{tag}.c"));
    std::fs::write(&source, SOURCE).map_err(|e| io("writing probe.c", e))?;
    let tmp = dir.join(format!("probe.{tag}"));
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&tmp)
        .arg(&source)
        .arg(format!("-L{}", dir.display()))
        .args(["-lcuda", "-ldl"])
        .output()
        .map_err(|e| io("running cc (a C compiler builds the probe)", e))?;
    let _ = std::fs::remove_file(&source);
    if !out.status.success() {
        return Err(format!(
            "compiling probe.c failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let program = dir.join("probe");
    std::fs::rename(&tmp, &program).map_err(|e| io("installing the probe", e))?;
    Ok(Probe {
        driver_dir: dir.to_owned(),
        program,
    })
}
