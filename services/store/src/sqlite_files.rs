//! The SQLite database's files readable by their owner only. The database file is created
//! 0600 before SQLite opens it: SQLite gives the write-ahead log (`-wal`) and the
//! shared-memory index (`-shm`) it creates the database file's mode, so those are 0600 too.
//! A database (or either of its files) found readable by others, as one made before this
//! was, is tightened at connect, saying so.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::StoreError;

/// The database file a `sqlite:` URL names, and whether SQLite may create it (`mode=rwc`);
/// `None` for an in-memory database.
fn database_file(url: &str) -> Option<(PathBuf, bool)> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let params: Vec<&str> = query.split('&').collect();
    if path.is_empty() || path == ":memory:" || params.contains(&"mode=memory") {
        return None;
    }
    Some((PathBuf::from(path), params.contains(&"mode=rwc")))
}

/// Creates the database file of `url` 0600 when SQLite would create it, and tightens the
/// database's files that are readable (or writable) by anyone but their owner.
pub(crate) fn make_private(url: &str) -> Result<(), StoreError> {
    let Some((db, create)) = database_file(url) else {
        return Ok(());
    };
    let refused = |path: &Path, e: std::io::Error| {
        StoreError::Refused(format!(
            "the database file {} must be its owner's alone: {e}",
            path.display()
        ))
    };
    if create {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&db)
        {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            // SQLite says what is wrong with the path (a missing directory) when it opens it.
            Err(_) => return Ok(()),
        }
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = db.clone().into_os_string();
        name.push(suffix);
        let path = PathBuf::from(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_file() && mode & 0o7177 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| refused(&path, e))?;
            tracing::warn!(
                file = %path.display(),
                "the database file was {mode:04o}, readable by others: now 0600"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(
            database_file("sqlite:///var/lib/allot/allot.db?mode=rwc"),
            Some((PathBuf::from("/var/lib/allot/allot.db"), true))
        );
        assert_eq!(
            database_file("sqlite:data/allot.db"),
            Some((PathBuf::from("data/allot.db"), false))
        );
        assert_eq!(database_file("sqlite::memory:"), None);
        assert_eq!(database_file("sqlite://x.db?mode=memory"), None);
        assert_eq!(database_file("postgres://localhost/allot"), None);
    }

    #[test]
    fn the_database_is_created_private_and_tightened() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("allot.db");
        let url = format!("sqlite://{}?mode=rwc", db.display());
        make_private(&url).expect("created");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&db), 0o600);
        let wal = dir.path().join("allot.db-wal");
        std::fs::write(&wal, b"").expect("write");
        for p in [&db, &wal] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        make_private(&url).expect("tightened");
        assert_eq!((mode(&db), mode(&wal)), (0o600, 0o600));
    }
}
