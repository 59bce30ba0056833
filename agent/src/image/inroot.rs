//! Files of an image read as data: a path is resolved inside the image's root as the
//! container would resolve it (absolute symbolic links and `..` lead back to the root,
//! never above it), and only a regular file is read, up to a size cap. Nothing an image
//! holds makes the agent (root) open a file of the host, a device or a FIFO.
//!
//! The kernel resolves the path (`openat2` with `RESOLVE_IN_ROOT`, Linux 5.6+); on a kernel
//! without it the same resolution is done here, one component at a time with `O_NOFOLLOW`,
//! each link read and resolved against the root.

use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{Mode, SFlag};

/// Most symbolic links followed while resolving one path (as the kernel's `ELOOP`).
const MAX_LINKS: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum InRootError {
    #[error("{path} in the image is not a regular file")]
    NotRegular { path: String },
    #[error("{path} in the image is larger than {max} bytes")]
    TooLarge { path: String, max: u64 },
    #[error("{path} in the image: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Reads the regular file `path` (as the container sees it) of the root file system at
/// `root`, at most `max` bytes of it. `None`: there is no such file inside the root (a
/// missing component, or a link leading to nothing there).
pub fn read(root: &Path, path: &str, max: u64) -> Result<Option<Vec<u8>>, InRootError> {
    let io = |source: std::io::Error| InRootError::Io {
        path: path.to_owned(),
        source,
    };
    let root_fd = open_dir(root).map_err(io)?;
    let found = match open_in_root(&root_fd, Path::new(path)) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
        Err(e) => return Err(io(e.into())),
    };
    let stat = nix::sys::stat::fstat(&found).map_err(|e| io(e.into()))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(InRootError::NotRegular {
            path: path.to_owned(),
        });
    }
    if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > max {
        return Err(InRootError::TooLarge {
            path: path.to_owned(),
            max,
        });
    }
    // Reopened for reading through the `O_PATH` descriptor: the very file checked.
    let file = std::fs::File::open(fd_path(&found)).map_err(io)?;
    let mut bytes = Vec::new();
    // The cap holds even for a file that grew since it was checked.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(InRootError::TooLarge {
            path: path.to_owned(),
            max,
        });
    }
    Ok(Some(bytes))
}

fn fd_path(fd: &OwnedFd) -> String {
    format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd())
    )
}

fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    Ok(nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// `path` opened (`O_PATH`) inside the root `root` is open on, its last component
/// followed too, never crossing a mount.
fn open_in_root(root: &OwnedFd, path: &Path) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_IN_ROOT
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    match nix::fcntl::openat2(root, path, how) {
        // No openat2 (before Linux 5.6, or a seccomp filter refusing it): resolve here.
        Err(Errno::ENOSYS | Errno::EPERM) => open_in_root_here(root, path),
        other => other,
    }
}

/// [`open_in_root`] without `openat2`: each component opened with `O_NOFOLLOW` in the
/// directory before it; a link is read and its target resolved in its place (an absolute
/// one from the root); `..` goes back one directory, never above the root.
pub(crate) fn open_in_root_here(root: &OwnedFd, path: &Path) -> Result<OwnedFd, Errno> {
    let root_dev = nix::sys::stat::fstat(root)?.st_dev;
    // The directories walked through, the root first: `..` pops one.
    let mut dirs: Vec<OwnedFd> = vec![root.try_clone().map_err(io_errno)?];
    let mut todo: Vec<OsString> = parts(path.as_os_str());
    todo.reverse();
    let mut links = 0;
    while let Some(part) = todo.pop() {
        if part == ".." {
            if dirs.len() > 1 {
                dirs.pop();
            }
            continue;
        }
        let here = dirs.last().ok_or(Errno::ENOENT)?;
        let fd = nix::fcntl::openat(
            here,
            part.as_os_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let stat = nix::sys::stat::fstat(&fd)?;
        if stat.st_dev != root_dev {
            return Err(Errno::EXDEV);
        }
        match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(Errno::ELOOP);
                }
                let target = nix::fcntl::readlinkat(&fd, "")?;
                if target.as_bytes().starts_with(b"/") {
                    dirs.truncate(1);
                }
                let mut next = parts(&target);
                next.reverse();
                todo.extend(next);
            }
            SFlag::S_IFDIR => dirs.push(fd),
            _ if todo.is_empty() => return Ok(fd),
            _ => return Err(Errno::ENOTDIR),
        }
    }
    // The path named a directory (or the root itself).
    dirs.pop().ok_or(Errno::ENOENT)
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// A path's components as resolution walks them: `.` and empty ones dropped, `..` kept.
fn parts(path: &OsStr) -> Vec<OsString> {
    Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A root with `etc/passwd`, a host file beside it (outside) and links of every kind.
    fn setup() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::fs::create_dir_all(root.join("lib")).expect("mkdir");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::fs::write(root.join("etc/real"), "inside").expect("write");
        std::fs::write(outside.join("host"), "HOST").expect("write");
        (dir, root, outside)
    }

    /// Both resolvers, the kernel's and this module's, answer every case alike.
    fn both(root: &Path, path: &str) -> [Result<Option<Vec<u8>>, String>; 2] {
        let kernel = read(root, path, 1 << 20).map_err(|e| e.to_string());
        let here = (|| {
            let fd = open_dir(root).map_err(|e| e.to_string())?;
            match open_in_root_here(&fd, Path::new(path)) {
                Ok(f) => {
                    let st = nix::sys::stat::fstat(&f).map_err(|e| e.to_string())?;
                    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
                        return Err(format!("{path} in the image is not a regular file"));
                    }
                    std::fs::read(fd_path(&f))
                        .map(Some)
                        .map_err(|e| e.to_string())
                }
                Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(None),
                Err(e) => Err(format!("{path} in the image: {}", std::io::Error::from(e))),
            }
        })();
        [kernel, here]
    }

    #[test]
    fn links_out_of_the_root_lead_back_into_it() {
        let (_d, root, outside) = setup();
        let host = outside.join("host").display().to_string();
        // An absolute link to a host file, a climbing one, and one to a host device.
        symlink(&host, root.join("etc/abs")).expect("link");
        symlink("../../../../../../outside/host", root.join("etc/rel")).expect("link");
        symlink("/dev/zero", root.join("etc/zero")).expect("link");
        symlink("/etc/real", root.join("lib/ok")).expect("link");
        symlink("../etc", root.join("lib/up")).expect("link");
        for path in ["etc/abs", "/etc/rel", "etc/zero", "nope/x"] {
            for r in both(&root, path) {
                assert_eq!(r, Ok(None), "{path}: nothing of the host is read");
            }
        }
        for path in [
            "lib/ok",
            "lib/up/real",
            "/etc/../etc/real",
            "../../etc/real",
        ] {
            for r in both(&root, path) {
                assert_eq!(r, Ok(Some(b"inside".to_vec())), "{path}");
            }
        }
        // The host file, placed where the absolute link points inside the root, is read
        // from there.
        let planted = root.join(host.trim_start_matches('/'));
        std::fs::create_dir_all(planted.parent().expect("parent")).expect("mkdir");
        std::fs::write(&planted, "planted").expect("write");
        for r in both(&root, "etc/abs") {
            assert_eq!(r, Ok(Some(b"planted".to_vec())));
        }
    }

    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        let (_d, root, _outside) = setup();
        std::fs::write(root.join("etc/big"), vec![b'x'; 4096]).expect("write");
        let r = read(&root, "etc/big", 4095);
        assert!(
            matches!(r, Err(InRootError::TooLarge { max: 4095, .. })),
            "{r:?}"
        );
        assert_eq!(
            read(&root, "etc/big", 4096).expect("read").map(|b| b.len()),
            Some(4096)
        );
        for r in both(&root, "etc") {
            assert!(r.expect_err("a directory").contains("not a regular file"));
        }
        nix::unistd::mkfifo(&root.join("etc/fifo"), Mode::from_bits_truncate(0o644)).expect("fifo");
        for r in both(&root, "etc/fifo") {
            assert!(
                r.expect_err("a FIFO, never opened for reading")
                    .contains("not a regular file")
            );
        }
    }

    #[test]
    fn a_link_loop_fails_instead_of_spinning() {
        let (_d, root, _outside) = setup();
        symlink("b", root.join("etc/a")).expect("link");
        symlink("a", root.join("etc/b")).expect("link");
        for r in both(&root, "etc/a") {
            let e = r.expect_err("a loop");
            assert!(e.contains("symbolic links"), "{e}");
        }
    }
}
