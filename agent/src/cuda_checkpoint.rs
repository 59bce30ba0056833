//! Transparent CUDA checkpointing with NVIDIA's `cuda-checkpoint` utility, which suspends a
//! process's CUDA state into host memory so that a CPU-side checkpointer (CRIU, or the job's
//! own) can save it. It needs driver 550 or later and the utility itself, so the agent
//! detects both at start and never assumes them: where both are present, every job is told
//! the utility's path in `ALLOT_CUDA_CHECKPOINT`; elsewhere jobs checkpoint themselves into
//! their `checkpoint_dir` (and a later attempt restores from `ALLOT_RESTORE_FROM`) as before.

use std::path::{Path, PathBuf};

/// The oldest driver branch `cuda-checkpoint` works with.
pub const MIN_DRIVER_MAJOR: u32 = 550;

/// Whether a driver version string (`550.54.15`) is new enough.
pub fn driver_supports(version: &str) -> bool {
    version
        .split('.')
        .next()
        .and_then(|major| major.trim().parse::<u32>().ok())
        .is_some_and(|major| major >= MIN_DRIVER_MAJOR)
}

/// `cuda-checkpoint` on `path` (a `PATH`-style list), if it is there.
pub fn find_in(path: &std::ffi::OsStr) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join("cuda-checkpoint"))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The utility to offer jobs, or why there is none.
pub fn detect(driver_version: Option<&str>) -> Result<PathBuf, String> {
    let version = driver_version.ok_or("no NVIDIA driver")?;
    if !driver_supports(version) {
        return Err(format!("driver {version} is older than {MIN_DRIVER_MAJOR}"));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    find_in(&path).ok_or_else(|| "cuda-checkpoint is not on PATH".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_driver_550_and_later_qualify() {
        assert!(driver_supports("550.54.15"));
        assert!(driver_supports("570.86.10"));
        assert!(!driver_supports("535.183.01"));
        assert!(!driver_supports("garbage"));
        assert!(!driver_supports(""));
        assert_eq!(detect(None), Err("no NVIDIA driver".into()));
        assert!(detect(Some("535.1")).is_err_and(|e| e.contains("older than 550")));
    }

    #[test]
    fn the_utility_is_found_only_where_it_is_executable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let tool = dir.path().join("cuda-checkpoint");
        std::fs::write(&tool, "#!/bin/sh\n").expect("write");
        let path = std::env::join_paths([dir.path()]).expect("path");
        assert_eq!(find_in(&path), None, "not executable yet");
        std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        assert_eq!(find_in(&path), Some(tool));
        assert_eq!(find_in(std::ffi::OsStr::new("")), None);
    }
}
