//! Unpacking an image layer (a tar stream) into a root file system, the way OCI image
//! layers are applied: in order, with whiteouts (`.wh.NAME` removes `NAME`, `.wh..wh..opq`
//! empties its directory), and with nothing written outside the root whatever the layer
//! holds:
//!
//! - an entry whose path has a `..` component is refused (the layer is malformed or
//!   hostile), and a leading `/` is taken as the root's;
//! - every directory an entry is written into is resolved inside the root: a symbolic link
//!   on the way is followed as the container would see it, with absolute targets and `..`
//!   taken relative to (and clamped at) the root, so a link pointing out leads back in;
//! - a hard link's target is resolved the same way and must be a file already in the root;
//! - the final component is never followed: an existing link there is replaced, not
//!   written through;
//! - device nodes are skipped, owners are not applied (the root belongs to the agent's
//!   user; the container sees it as unmapped and read-only), and set-user-ID and
//!   set-group-ID bits are dropped, so no file unpacked on the node is a way to root for
//!   anyone who can reach it.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("entry `{0}` leaves the image's root (a `..` component)")]
    Escapes(String),
    #[error("entry `{entry}`: {message}")]
    Entry { entry: String, message: String },
    #[error("reading the layer: {0}")]
    Read(#[from] std::io::Error),
}

/// Most symbolic links followed while resolving one path (as the kernel's `ELOOP`).
const MAX_LINKS: usize = 40;

/// The components of an entry's path, relative to the root; `..` is refused.
fn components(raw: &Path) -> Result<Vec<OsString>, UnpackError> {
    let mut out = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n.to_owned()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err(UnpackError::Escapes(raw.display().to_string())),
        }
    }
    Ok(out)
}

/// Resolves the directory `dirs` (components below `root`) inside `root`, following
/// symbolic links as seen from inside the root and creating missing directories. Returns
/// the directory's resolved components.
fn resolve_dir(root: &Path, dirs: &[OsString], entry: &str) -> Result<Vec<OsString>, UnpackError> {
    let err = |message: String| UnpackError::Entry {
        entry: entry.to_owned(),
        message,
    };
    let mut resolved: Vec<OsString> = Vec::new();
    let mut todo: std::collections::VecDeque<OsString> = dirs.iter().cloned().collect();
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            resolved.pop();
            continue;
        }
        if c == "." || c.is_empty() {
            continue;
        }
        let here: PathBuf = root.join(resolved.iter().collect::<PathBuf>()).join(&c);
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(err("too many symbolic links".into()));
                }
                let target = std::fs::read_link(&here)?;
                if target.is_absolute() {
                    resolved.clear();
                }
                let mut next: Vec<OsString> = target
                    .components()
                    .filter_map(|t| match t {
                        Component::Normal(n) => Some(n.to_owned()),
                        Component::ParentDir => Some(OsString::from("..")),
                        _ => None,
                    })
                    .collect();
                next.extend(todo.drain(..));
                todo = next.into();
            }
            Ok(m) if m.is_dir() => resolved.push(c),
            Ok(_) => {
                return Err(err(format!(
                    "`{}` is not a directory",
                    PathBuf::from(&c).display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().mode(0o755).create(&here)?;
                resolved.push(c);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(resolved)
}

/// Where an entry goes: its resolved directory joined with its own (unfollowed) name.
fn target(root: &Path, comps: &[OsString], entry: &str) -> Result<PathBuf, UnpackError> {
    let (name, dirs) = comps.split_last().ok_or_else(|| UnpackError::Entry {
        entry: entry.to_owned(),
        message: "empty name".into(),
    })?;
    let dir = resolve_dir(root, dirs, entry)?;
    Ok(root.join(dir.iter().collect::<PathBuf>()).join(name))
}

/// Makes sure `path` (absolute, as seen from inside the root) exists in `root` as a
/// directory (`dir`) or an empty file, resolving it as [`apply_layer`] does, so nothing
/// outside the root is created. Returns where it is on the host. What an OCI runtime
/// mounts over must exist before it starts, and a container cannot create it in its
/// read-only root.
pub fn ensure_within(root: &Path, path: &str, dir: bool) -> Result<PathBuf, UnpackError> {
    let comps = components(Path::new(path))?;
    if comps.is_empty() {
        return Ok(root.to_owned());
    }
    if dir {
        let resolved = resolve_dir(root, &comps, path)?;
        return Ok(root.join(resolved.iter().collect::<PathBuf>()));
    }
    let at = target(root, &comps, path)?;
    match std::fs::symlink_metadata(&at) {
        // A link there is the runtime's to resolve, inside the root.
        Ok(_) => Ok(at),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&at)?;
            Ok(at)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes whatever is at `path` without following it.
fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A mode as applied: permission bits and sticky, never set-user-ID or set-group-ID.
fn safe_mode(mode: u32) -> u32 {
    mode & 0o1777
}

/// Applies one layer (an uncompressed tar stream) to `root`. Returns the bytes of the
/// regular files it wrote.
pub fn apply_layer(root: &Path, layer: impl Read) -> Result<u64, UnpackError> {
    let mut archive = tar::Archive::new(layer);
    let mut written = 0u64;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let shown = raw.display().to_string();
        let comps = components(&raw)?;
        let Some(name) = comps.last().cloned() else {
            continue; // the root itself
        };
        let name_str = name.to_string_lossy().into_owned();
        let fail = |message: String| UnpackError::Entry {
            entry: shown.clone(),
            message,
        };
        // Whiteouts.
        if name_str == ".wh..wh..opq" {
            let dir = resolve_dir(root, &comps[..comps.len() - 1], &shown)?;
            let dir = root.join(dir.iter().collect::<PathBuf>());
            for child in std::fs::read_dir(&dir)?.flatten() {
                remove(&child.path())?;
            }
            continue;
        }
        if let Some(hidden) = name_str.strip_prefix(".wh.") {
            let mut victim = comps.clone();
            victim.pop();
            victim.push(OsString::from(hidden));
            let path = target(root, &victim, &shown)?;
            remove(&path)?;
            continue;
        }
        let path = target(root, &comps, &shown)?;
        let mode = entry.header().mode().unwrap_or(0o644);
        let kind = entry.header().entry_type();
        let existing = std::fs::symlink_metadata(&path).ok();
        // A directory over a directory keeps its contents; anything else replaces.
        if !(kind.is_dir() && existing.as_ref().is_some_and(|m| m.is_dir())) && existing.is_some() {
            remove(&path)?;
        }
        if kind.is_dir() {
            if existing.as_ref().is_none_or(|m| !m.is_dir()) {
                std::fs::DirBuilder::new().mode(0o755).create(&path)?;
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(safe_mode(mode)))?;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)?;
            written += std::io::copy(&mut entry, &mut f)?;
            f.set_permissions(std::fs::Permissions::from_mode(safe_mode(mode)))?;
        } else if kind.is_symlink() {
            let link = entry
                .link_name()?
                .ok_or_else(|| fail("a symbolic link without a target".into()))?;
            // Stored as it is: only the container resolves it, inside its own root.
            std::os::unix::fs::symlink(link.as_ref(), &path)?;
        } else if kind.is_hard_link() {
            let link = entry
                .link_name()?
                .ok_or_else(|| fail("a hard link without a target".into()))?;
            let source = target(root, &components(&link)?, &shown)?;
            match std::fs::symlink_metadata(&source) {
                Ok(m) if !m.is_dir() => std::fs::hard_link(&source, &path)?,
                Ok(_) => return Err(fail("a hard link to a directory".into())),
                Err(_) => {
                    return Err(fail(format!(
                        "a hard link to `{}`, which is not in the image",
                        link.display()
                    )));
                }
            }
        }
        // Device nodes, FIFOs and the rest are skipped: a container gets its devices from
        // the node (CDI), never from its image.
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().expect("tar")
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_entry_type(tar::EntryType::Regular);
        // set_path refuses `..`: write the raw name, as a hostile layer would.
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, data).expect("append");
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o777);
        h.set_entry_type(kind);
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        b.append(&h, &[][..]).expect("append");
    }

    fn outside_is_untouched(outside: &Path) {
        let entries: Vec<_> = std::fs::read_dir(outside)
            .expect("read")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(entries, ["keep"], "nothing was written outside the root");
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).expect("read"),
            "original"
        );
    }

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("rootfs");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).expect("mkdir");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), "original").expect("write");
        (dir, root, outside)
    }

    #[test]
    fn dot_dot_entries_are_refused() {
        let (_d, root, outside) = setup();
        let l = layer(|b| file(b, "../outside/keep", b"pwned", 0o644));
        assert!(matches!(
            apply_layer(&root, &l[..]),
            Err(UnpackError::Escapes(_))
        ));
        let l = layer(|b| file(b, "a/../../outside/new", b"pwned", 0o644));
        assert!(apply_layer(&root, &l[..]).is_err());
        outside_is_untouched(&outside);
    }

    #[test]
    fn links_pointing_out_lead_back_into_the_root() {
        let (_d, root, outside) = setup();
        let abs = outside.display().to_string();
        let l = layer(|b| {
            // An absolute link out, a relative one climbing out, then files through them.
            link(b, tar::EntryType::Symlink, "abs", &abs);
            link(
                b,
                tar::EntryType::Symlink,
                "rel",
                "../../../../../../outside",
            );
            file(b, "abs/keep", b"pwned", 0o644);
            file(b, "rel/new", b"pwned", 0o644);
            // Replacing a link does not write through it.
            link(b, tar::EntryType::Symlink, "direct", &format!("{abs}/keep"));
            file(b, "direct", b"pwned", 0o644);
        });
        apply_layer(&root, &l[..]).expect("contained");
        outside_is_untouched(&outside);
        // What went through the links landed inside.
        assert_eq!(
            std::fs::read_to_string(root.join(abs.trim_start_matches('/')).join("keep"))
                .expect("inside"),
            "pwned"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("outside/new")).expect("inside"),
            "pwned"
        );
        assert!(
            std::fs::symlink_metadata(root.join("direct"))
                .expect("direct")
                .is_file()
        );
    }

    #[test]
    fn hard_links_reach_only_files_in_the_root() {
        let (_d, root, outside) = setup();
        let abs = outside.join("keep").display().to_string();
        let l = layer(|b| link(b, tar::EntryType::Link, "stolen", &abs));
        assert!(
            apply_layer(&root, &l[..]).is_err(),
            "no such file in the root"
        );
        let l = layer(|b| link(b, tar::EntryType::Link, "stolen", "../outside/keep"));
        assert!(apply_layer(&root, &l[..]).is_err());
        outside_is_untouched(&outside);
        let l = layer(|b| {
            file(b, "bin/tool", b"x", 0o755);
            link(b, tar::EntryType::Link, "bin/alias", "bin/tool");
        });
        apply_layer(&root, &l[..]).expect("an ordinary hard link");
        assert_eq!(std::fs::read(root.join("bin/alias")).expect("read"), b"x");
    }

    #[test]
    fn whiteouts_and_set_user_id_bits() {
        let (_d, root, _outside) = setup();
        let l = layer(|b| {
            file(b, "etc/a", b"1", 0o644);
            file(b, "etc/b", b"2", 0o644);
            file(b, "opt/x/y", b"3", 0o644);
            file(b, "bin/su", b"#!", 0o4755);
        });
        apply_layer(&root, &l[..]).expect("first");
        let mode = std::fs::metadata(root.join("bin/su"))
            .expect("su")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755, "set-user-ID is dropped");
        let l = layer(|b| {
            file(b, "etc/.wh.a", b"", 0o644);
            file(b, "opt/x/.wh..wh..opq", b"", 0o644);
        });
        apply_layer(&root, &l[..]).expect("second");
        assert!(!root.join("etc/a").exists());
        assert!(root.join("etc/b").exists());
        assert!(root.join("opt/x").is_dir());
        assert!(!root.join("opt/x/y").exists());
    }
}
