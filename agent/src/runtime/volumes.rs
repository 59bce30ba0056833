//! A job's named volumes on this node: each is the tenant's own directory
//! `<host_path>/<tenant>` of a volume the control plane resolved (see
//! `allot_domain::volume`), made here on first use and owned by the tenant's host uid, so
//! the job can write it and no other tenant's job can.
//!
//! Everything below a tenant directory is the tenant's to shape, symlinks included, so the
//! agent (root) never follows a link there: it looks inside only through directories
//! opened one component at a time with `O_NOFOLLOW`.

use std::fs::File;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use allot_domain::VolumeMount;

/// A volume as a launch names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    pub volume: String,
    /// The volume's root on this node (empty: no longer declared).
    pub host_path: String,
    /// Where the job sees it.
    pub path: String,
    pub read_only: bool,
}

/// A volume ready to mount: the tenant's directory, and where the job sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub host_dir: PathBuf,
    pub path: String,
    pub read_only: bool,
}

/// Makes (or checks) the tenant's directory of each volume; `owner` is the host uid the
/// job's root maps to (none: the job runs as the agent's user).
pub fn prepare(
    volumes: &[VolumeSpec],
    tenant: &str,
    checkpoint_dir: Option<&str>,
    owner: Option<u32>,
) -> Result<Vec<Prepared>, String> {
    let mounts: Vec<VolumeMount> = volumes
        .iter()
        .map(|v| VolumeMount {
            volume: v.volume.clone(),
            path: v.path.clone(),
            read_only: v.read_only,
        })
        .collect();
    // The control plane checked these; a node checks again what it mounts as root.
    allot_domain::volume::check_mounts(&mounts, checkpoint_dir).map_err(|e| e.to_string())?;
    allot_domain::TenantName::parse("tenant", tenant).map_err(|e| e.to_string())?;
    volumes
        .iter()
        .map(|v| {
            if v.host_path.is_empty() {
                return Err(format!("volume `{}` is no longer declared", v.volume));
            }
            let root = Path::new(&v.host_path);
            if !root.is_dir() {
                return Err(format!(
                    "volume `{}`: {} is not a directory on this node",
                    v.volume, v.host_path
                ));
            }
            if owner.is_some() {
                // The container's user must pass through every directory to its own.
                let mut p = Some(root);
                while let Some(d) = p {
                    let searchable = std::fs::metadata(d)
                        .map(|m| {
                            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o001 != 0
                        })
                        .unwrap_or(false);
                    if !searchable {
                        return Err(format!(
                            "volume `{}`: jobs cannot reach {}: {} is not searchable by other \
                             users (chmod o+x)",
                            v.volume,
                            v.host_path,
                            d.display()
                        ));
                    }
                    p = d.parent();
                }
            }
            let dir = PathBuf::from(allot_domain::volume::tenant_dir(&v.host_path, tenant));
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.file_type().is_dir() => {
                    if let Some(uid) = owner
                        && m.uid() != uid
                    {
                        std::os::unix::fs::chown(&dir, Some(uid), Some(uid))
                            .map_err(|e| format!("volume `{}`: {e}", v.volume))?;
                    }
                }
                Ok(_) => {
                    return Err(format!(
                        "volume `{}`: {} is not a directory",
                        v.volume,
                        dir.display()
                    ));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let mut b = std::fs::DirBuilder::new();
                    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
                    match b.create(&dir) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(format!("volume `{}`: {e}", v.volume)),
                    }
                    if let Some(uid) = owner {
                        std::os::unix::fs::chown(&dir, Some(uid), Some(uid))
                            .map_err(|e| format!("volume `{}`: {e}", v.volume))?;
                    }
                }
                Err(e) => return Err(format!("volume `{}`: {e}", v.volume)),
            }
            Ok(Prepared {
                host_dir: dir,
                path: v.path.clone(),
                read_only: v.read_only,
            })
        })
        .collect()
}

/// The prepared volume holding container path `path`, and the components below it.
fn holder<'a>(prepared: &'a [Prepared], path: &str) -> Option<(&'a Prepared, Vec<String>)> {
    let p = prepared
        .iter()
        .find(|p| allot_domain::volume::within(path, &p.path))?;
    let rest = Path::new(path).strip_prefix(&p.path).ok()?;
    let parts = rest
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    Some((p, parts))
}

/// Where container path `path` is on the host, by its name alone (no link is checked):
/// for a job that runs as a process on the node, which sees host paths.
pub fn host_path(prepared: &[Prepared], path: &str) -> Option<PathBuf> {
    let (p, parts) = holder(prepared, path)?;
    Some(parts.iter().fold(p.host_dir.clone(), |d, c| d.join(c)))
}

/// Opens directory `name` in the directory `dir` is open on, following no link.
fn open_dir_in(dir: &File, name: &str) -> std::io::Result<File> {
    // `/proc/self/fd/N` is the directory itself: `name` resolves inside it, and
    // `O_NOFOLLOW` refuses it being a link.
    let fd = std::os::fd::AsRawFd::as_raw_fd(dir);
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(format!("/proc/self/fd/{fd}/{name}"))
}

/// The directory container path `path` names in the job's volumes, opened one component
/// at a time below the tenant's directory so that no link there is followed.
fn open_beneath(prepared: &[Prepared], path: &str) -> Option<File> {
    let (p, parts) = holder(prepared, path)?;
    let mut dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(&p.host_dir)
        .ok()?;
    for part in &parts {
        dir = open_dir_in(&dir, part).ok()?;
    }
    Some(dir)
}

/// The newest entry of checkpoint directory `path` (a container path), as the job sees it;
/// none when a component of it below the tenant's directory is a link.
pub fn latest_checkpoint(prepared: &[Prepared], path: &str) -> Option<String> {
    let dir = open_beneath(prepared, path)?;
    // Read through the open descriptor: the very directory checked.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&dir);
    let newest = std::fs::read_dir(format!("/proc/self/fd/{fd}"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let m = e.path().symlink_metadata().ok()?;
            Some((m.modified().ok()?, e.file_name()))
        })
        .max()
        .map(|(_, name)| name)?;
    Some(format!(
        "{}/{}",
        path.trim_end_matches('/'),
        newest.to_string_lossy()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(root: &Path) -> Vec<VolumeSpec> {
        vec![VolumeSpec {
            volume: "ckpt".into(),
            host_path: root.display().to_string(),
            path: "/ckpt".into(),
            read_only: false,
        }]
    }

    #[test]
    fn each_tenant_gets_its_own_directory_and_links_are_not_followed() {
        let root = tempfile::tempdir().expect("dir");
        let p = prepare(&spec(root.path()), "team-a", Some("/ckpt/run"), None).expect("prepared");
        assert_eq!(p[0].host_dir, root.path().join("team-a"));
        let run = root.path().join("team-a/run");
        std::fs::create_dir(&run).expect("run");
        std::fs::write(run.join("step-1"), b"1").expect("write");
        assert_eq!(host_path(&p, "/ckpt/run/1"), Some(run.join("1")));
        assert_eq!(host_path(&p, "/other"), None);
        assert_eq!(
            latest_checkpoint(&p, "/ckpt/run").as_deref(),
            Some("/ckpt/run/step-1")
        );
        // The tenant turns its checkpoint directory into a link to a node directory.
        std::fs::remove_dir_all(&run).expect("rm");
        std::os::unix::fs::symlink("/etc", &run).expect("link");
        assert_eq!(latest_checkpoint(&p, "/ckpt/run"), None);
        // A tenant directory that is a link is refused outright.
        std::os::unix::fs::symlink("/etc", root.path().join("team-b")).expect("link");
        assert!(prepare(&spec(root.path()), "team-b", None, None).is_err());
    }

    #[test]
    fn an_undeclared_or_absent_volume_fails_the_launch() {
        let mut s = spec(Path::new("/nonexistent-volume-root"));
        let err = prepare(&s, "team-a", None, None).expect_err("absent");
        assert!(err.contains("not a directory on this node"), "{err}");
        s[0].host_path.clear();
        let err = prepare(&s, "team-a", None, None).expect_err("undeclared");
        assert!(err.contains("no longer declared"), "{err}");
    }
}
