//! Job logs: each attempt's combined output, written by the agent into `<data dir>/logs/`,
//! a directory no job can see or write (containers never mount it; it is the agent's own,
//! mode 0700). Logs are created and read without following symbolic links, and only as
//! regular files, so nothing a job does makes the agent read or write another file.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::LOG_TAIL_BYTES;

/// Where the logs live.
pub fn logs_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("logs")
}

/// The log of one attempt: `<data dir>/logs/<job id>.<attempt>.log`.
pub fn path(data_dir: &Path, job_id: &str, attempt: u32) -> PathBuf {
    logs_dir(data_dir).join(format!("{job_id}.{attempt}.log"))
}

/// A log whose attempt was seen to its end is read-only: one still writable is being
/// shipped, or was when an earlier run of the agent stopped.
const SHIPPED_MODE: u32 = 0o400;

/// Leftover logs older than this are not shipped again (their attempts are long gone).
const LEFTOVER_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Marks a log as delivered whole (see [`unshipped`]).
pub fn mark_shipped(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let f = open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(SHIPPED_MODE))
}

/// The logs in `dir` not marked as delivered whole, written in the last day: (job id,
/// attempt, path) of each. Names that are not `<job id>.<attempt>.log` are left alone.
pub fn unshipped(dir: &Path) -> Vec<(String, u32, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((job, attempt)) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.rsplit_once('.'))
            .and_then(|(job, a)| Some((job.to_owned(), a.parse::<u32>().ok()?)))
        else {
            continue;
        };
        // Not followed: a link or anything but a regular file is no log of ours.
        let Ok(meta) = e.path().symlink_metadata() else {
            continue;
        };
        let recent = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age < LEFTOVER_MAX_AGE);
        if meta.is_file()
            && meta.permissions().mode() & 0o200 != 0
            && recent
            && super::safe_name(&job)
        {
            out.push((job, attempt, e.path()));
        }
    }
    out.sort();
    out
}

/// Creates (or truncates) a log for writing, refusing a symbolic link or anything but a
/// regular file in its place.
pub fn create(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let open = || {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
    };
    let f = match open() {
        // A log of the same attempt marked delivered (the attempt is run again): writable
        // again, if it is a regular file of ours.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            use std::os::unix::fs::PermissionsExt;
            if !path.symlink_metadata()?.is_file() {
                return Err(e);
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            open()?
        }
        other => other?,
    };
    let f = regular(f, path)?;
    f.set_len(0)?;
    // Writable again: a log created anew is not yet delivered.
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(f)
}

/// Opens a log for reading, refusing a symbolic link or anything but a regular file.
pub fn open(path: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    regular(f, path)
}

/// `f`, if it is a regular file (not a FIFO, device or directory put in a log's place).
fn regular(f: File, path: &Path) -> std::io::Result<File> {
    if f.metadata()?.is_file() {
        Ok(f)
    } else {
        Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )))
    }
}

/// Frees the blocks of a log between its first `head` bytes and its last `tail` bytes (the
/// file keeps its length and offsets; the freed part reads as zeros, and is never shipped:
/// the control plane keeps less of the end than the node does). `freed_to` is where an
/// earlier call stopped; returns where this one did. Only whole blocks are freed.
pub fn drop_middle(path: &Path, head: u64, tail: u64, freed_to: u64) -> std::io::Result<u64> {
    use nix::fcntl::{FallocateFlags, fallocate};
    const BLOCK: u64 = 4096;
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    let f = regular(f, path)?;
    let len = f.metadata()?.len();
    let from = head.max(freed_to).next_multiple_of(BLOCK);
    let to = len.saturating_sub(tail) / BLOCK * BLOCK;
    if to <= from {
        return Ok(freed_to);
    }
    let off = |n: u64| libc::off_t::try_from(n).map_err(std::io::Error::other);
    fallocate(
        &f,
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        off(from)?,
        off(to - from)?,
    )
    .map_err(std::io::Error::from)?;
    Ok(to)
}

/// The last [`LOG_TAIL_BYTES`] of a log, as text (empty when there is none).
pub fn tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut buf = Vec::new();
        f.take(LOG_TAIL_BYTES).read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    read().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_in_place_of_a_log_is_neither_written_nor_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let secret = dir.path().join("node.key");
        std::fs::write(&secret, "SECRET").expect("write");
        let log = path(dir.path(), "j", 1);
        std::fs::create_dir_all(log.parent().expect("parent")).expect("mkdir");
        std::os::unix::fs::symlink(&secret, &log).expect("symlink");
        assert!(create(&log).is_err(), "a link is not opened for writing");
        assert_eq!(tail(&log), "", "a link is not read");
        assert_eq!(std::fs::read_to_string(&secret).expect("read"), "SECRET");
    }

    #[test]
    fn a_log_keeps_its_head_and_tail_on_disk_and_its_length() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let log = path(dir.path(), "j", 3);
        let mut f = create(&log).expect("create");
        let block = vec![b'x'; 1 << 20];
        for _ in 0..32 {
            std::io::Write::write_all(&mut f, &block).expect("write");
        }
        std::io::Write::write_all(&mut f, b"the end\n").expect("write");
        let before = std::fs::metadata(&log).expect("stat");
        let freed = drop_middle(&log, 1 << 20, 4 << 20, 0).expect("freed");
        let after = std::fs::metadata(&log).expect("stat");
        assert_eq!(after.len(), before.len(), "offsets stay");
        assert!(freed > 20 << 20, "{freed}");
        assert!(
            after.blocks() * 512 <= (6 << 20),
            "{} bytes on disk",
            after.blocks() * 512
        );
        assert!(tail(&log).ends_with("xxthe end\n"), "the tail is kept");
        let mut head = vec![0u8; 4];
        std::io::Read::read_exact(&mut open(&log).expect("open"), &mut head).expect("read");
        assert_eq!(&head, b"xxxx", "the head is kept");
        assert_eq!(
            drop_middle(&log, 1 << 20, 4 << 20, freed).expect("again"),
            freed,
            "nothing more to free"
        );
    }

    #[test]
    fn logs_not_seen_to_their_end_are_found_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        let done = path(dir.path(), "j1", 1);
        let cut = path(dir.path(), "j1", 2);
        drop(create(&done).expect("create"));
        drop(create(&cut).expect("create"));
        std::fs::write(logs_dir(dir.path()).join("notes.txt"), b"x").expect("write");
        std::os::unix::fs::symlink(&cut, path(dir.path(), "j2", 1)).expect("link");
        mark_shipped(&done).expect("marked");
        assert_eq!(
            unshipped(&logs_dir(dir.path())),
            vec![("j1".to_owned(), 2, cut.clone())]
        );
        // Created again for a new run of the same attempt: not shipped yet.
        drop(create(&done).expect("again"));
        assert_eq!(unshipped(&logs_dir(dir.path())).len(), 2);
    }

    #[test]
    fn the_tail_is_the_end_of_the_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = path(dir.path(), "j", 2);
        let mut f = create(&log).expect("create");
        std::io::Write::write_all(&mut f, b"hello\n").expect("write");
        assert_eq!(tail(&log), "hello\n");
        drop(create(&log).expect("again"));
        assert_eq!(tail(&log), "", "created again, it starts empty");
    }
}
