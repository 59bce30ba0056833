//! Each container's own root file system: an overlay of its image's cached root (the
//! lower layer: shared by every container of that digest, whichever tenant's, and never
//! written) with an upper layer of the container's own. What the runtime mounts over (the
//! mount targets of volumes, secrets, the init, the shim, device nodes) must exist before
//! it starts; the agent creates them here, in the upper layer, so none ever appears in the
//! cached image another container of the same digest runs. The container still sees its
//! root read-only.
//!
//! `<data dir>/oci/roots/<container id>/` holds `rootfs/` (the overlay's mount point),
//! `upper/` and `work/` (overlayfs's). It belongs to the container's root (the first host
//! uid of its tenant's range) with mode 0700: the container's user namespace must pass
//! through it to its root (the runtime sets the root up from inside), and nothing else but
//! the agent can, neither another user of the host nor another tenant's container. The
//! image cache itself stays 0700 root: overlayfs reads the lower layer with the agent's
//! credentials.
//!
//! `/.allot` is the runtime's: whatever the image has there (a file, a link elsewhere, a
//! directory of its own) is replaced by an empty directory holding the init's mount point,
//! so the init mounted at `/.allot/init` is the node's whatever the image and volumes do.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use oci_spec::runtime::Spec;

use crate::image::unpack::{ensure_within, remove};

/// The runtime's own directory in every container (see `allot_domain::volume`).
pub const RUNTIME_DIR: &str = allot_domain::volume::RUNTIME_DIR;

/// Characters overlayfs's mount options cannot hold in a path.
const OPTION_CHARS: &[char] = &[',', ':', '\\', '='];

/// A container's root, mounted.
#[derive(Debug, Clone)]
pub struct ContainerRoot {
    dir: PathBuf,
}

fn mkdir(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(mode).create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Why `path` cannot be named in overlayfs's options, if it cannot.
pub fn unfit_path(path: &Path) -> Option<String> {
    let text = path.to_str()?;
    text.contains(OPTION_CHARS).then(|| {
        format!(
            "{text}: overlayfs cannot name a path holding any of {}",
            OPTION_CHARS.iter().collect::<String>()
        )
    })
}

fn overlay(lower: &Path, dir: &Path) -> Result<(), String> {
    for p in [lower, dir] {
        if let Some(why) = unfit_path(p) {
            return Err(why);
        }
    }
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        dir.join("upper").display(),
        dir.join("work").display()
    );
    nix::mount::mount(
        Some("overlay"),
        &dir.join("rootfs"),
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| {
        format!(
            "cannot mount the container's root (overlayfs on {}): {e}",
            dir.display()
        )
    })
}

/// Whether `path` is the root of a mount: its device differs from its parent's (an
/// overlay's does), or the mount table lists it (a bind mount of the same file system).
fn is_mount_point(path: &Path) -> bool {
    let (Ok(here), Some(Ok(parent))) = (
        std::fs::symlink_metadata(path),
        path.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    if here.dev() != parent.dev() {
        return true;
    }
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    mount_points(&table).any(|m| Path::new(&m) == path)
}

/// The mount points `/proc/self/mountinfo` lists (its fifth field, octal escapes undone).
fn mount_points(table: &str) -> impl Iterator<Item = String> + '_ {
    table.lines().filter_map(|line| {
        let field = line.split(' ').nth(4)?;
        let mut out = Vec::with_capacity(field.len());
        let bytes = field.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let octal = bytes.get(i + 1..i + 4).filter(|_| bytes[i] == b'\\');
            match octal.and_then(|o| u8::from_str_radix(std::str::from_utf8(o).ok()?, 8).ok()) {
                Some(b) => {
                    out.push(b);
                    i += 4;
                }
                None => {
                    out.push(bytes[i]);
                    i += 1;
                }
            }
        }
        String::from_utf8(out).ok()
    })
}

impl ContainerRoot {
    /// Makes `dir` (a container's, under the roots directory) and mounts there an overlay
    /// of the cached root `image`, the directory owned by `owner` (the container's root on
    /// the host). Blocks.
    pub fn mount(dir: &Path, image: &Path, owner: u32) -> Result<Self, String> {
        let io = |e: std::io::Error| format!("{}: {e}", dir.display());
        Self::remove(dir);
        mkdir(dir, 0o700).map_err(io)?;
        let root = ContainerRoot {
            dir: dir.to_owned(),
        };
        let made = (|| {
            // The merged root takes the upper layer's owner and mode: the image's own.
            let lower = std::fs::metadata(image).map_err(io)?;
            mkdir(&dir.join("upper"), lower.mode() & 0o7777).map_err(io)?;
            mkdir(&dir.join("work"), 0o700).map_err(io)?;
            mkdir(&dir.join("rootfs"), 0o755).map_err(io)?;
            overlay(image, dir)?;
            std::os::unix::fs::chown(dir, Some(owner), Some(owner)).map_err(io)
        })();
        match made {
            Ok(()) => Ok(root),
            Err(e) => {
                Self::remove(dir);
                Err(e)
            }
        }
    }

    /// The root file system the runtime is given.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes what `spec` mounts over exist in this root (in its upper layer), and
    /// `/.allot` the runtime's. Blocks.
    pub fn prepare(&self, spec: &Spec) -> Result<(), String> {
        let root = self.rootfs();
        let fail = |e: &dyn std::fmt::Display| format!("the image's root: {e}");
        let runtime_dir = root.join(RUNTIME_DIR.trim_start_matches('/'));
        remove(&runtime_dir).map_err(|e| fail(&e))?;
        mkdir(&runtime_dir, 0o755).map_err(|e| fail(&e))?;
        let mut seen = std::collections::HashSet::new();
        for m in spec.mounts().iter().flatten() {
            let dest = m.destination().display().to_string();
            if !seen.insert(dest.clone()) || dest == "/dev" || dest.starts_with("/dev/") {
                continue;
            }
            let is_dir = m.typ().as_deref() != Some("bind")
                || m.source().as_ref().is_some_and(|s| s.is_dir());
            ensure_within(&root, &dest, is_dir).map_err(|e| fail(&e))?;
        }
        if let Some(cwd) = spec.process().as_ref().map(|p| p.cwd()) {
            ensure_within(&root, &cwd.display().to_string(), true).map_err(|e| fail(&e))?;
        }
        Ok(())
    }

    /// Unmounts and removes a container's root directory (whatever is left of one: it may
    /// be half made, or not mounted). Blocks.
    pub fn remove(dir: &Path) {
        let rootfs = dir.join("rootfs");
        if is_mount_point(&rootfs)
            && let Err(e) = nix::mount::umount2(&rootfs, MntFlags::MNT_DETACH)
        {
            tracing::warn!(root = %rootfs.display(), error = %e, "cannot unmount a container's root");
        }
        // Never removed through a mount: the cached image below it is shared.
        if is_mount_point(&rootfs) {
            tracing::warn!(root = %rootfs.display(), "a container's root is still mounted: left in place");
            return;
        }
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a container's root")
            }
        }
    }

    /// Checks at start that overlays can be mounted in `roots` (the kernel has overlayfs
    /// and the data dir's file system can hold an upper layer). Blocks.
    pub fn probe(roots: &Path) -> Result<(), String> {
        let dir = roots.join(".probe");
        let lower = roots.join(".probe-lower");
        Self::remove(&dir);
        let _ = std::fs::remove_dir_all(&lower);
        mkdir(&lower, 0o755).map_err(|e| format!("{}: {e}", lower.display()))?;
        let mounted = Self::mount(&dir, &lower, 0);
        Self::remove(&dir);
        let _ = std::fs::remove_dir_all(&lower);
        mounted.map(|_| ()).map_err(|e| {
            format!(
                "{e}: --runtime oci gives each container an overlay of its image (overlayfs, \
                 with its upper layer on the data dir's file system)"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_from_the_mount_table() {
        let table = "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
                     90 22 254:0 /img /data/a\\040b/oci/roots/x/rootfs rw - ext4 /dev/vda rw\n";
        let points: Vec<String> = mount_points(table).collect();
        assert_eq!(points, ["/", "/data/a b/oci/roots/x/rootfs"]);
        assert!(is_mount_point(Path::new("/proc")));
        let dir = tempfile::tempdir().expect("dir");
        assert!(!is_mount_point(dir.path()));
    }

    #[test]
    fn overlay_options_hold_no_separator() {
        assert!(unfit_path(Path::new("/var/lib/allot-agent/oci/roots")).is_none());
        for bad in ["/data,x", "/a:b", "/a\\b", "/a=b"] {
            assert!(unfit_path(Path::new(bad)).is_some(), "{bad}");
        }
    }
}
