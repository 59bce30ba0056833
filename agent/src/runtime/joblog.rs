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

/// Creates (or truncates) a log for writing, refusing a symbolic link or anything but a
/// regular file in its place.
pub fn create(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    let f = regular(f, path)?;
    f.set_len(0)?;
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
