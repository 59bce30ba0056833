//! Files only their owner reads: the one piece of IO of this crate, shared by whoever keeps
//! keys or other secrets on disk (the control plane's data dir, its database, the agents'
//! identities). A secret is written 0600; a directory of them is checked at start, and
//! anything group or other users could read or enter is tightened, saying what.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Writes `contents` to `path`, readable by its owner only (a file that existed is
/// truncated and tightened).
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path)?;
    // The mode above applies only on creation.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()
}

/// What [`make_private`] does below one entry of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Descend {
    /// Tighten it, and everything in it.
    All,
    /// Tighten the directory itself, not what is in it (someone else's to keep: a job's
    /// working directory, an image cache).
    Itself,
    /// Leave it as it is (its mode is set by whoever owns it, on purpose).
    Leave,
}

/// A mode that was too open, and what it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tightened {
    pub path: PathBuf,
    pub was: u32,
    pub now: u32,
}

impl fmt::Display for Tightened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} was {:04o}, now {:04o}",
            self.path.display(),
            self.was,
            self.now
        )
    }
}

/// Makes the tree at `root` its owner's alone: `root` itself gets `root_mode` (0700, or
/// 0711 where others must pass through it without listing it), every directory below 0700
/// and every regular file its owner's bits only (0600, 0700 for a program), as `descend`
/// says of each entry. Links are not followed; device nodes, sockets and pipes keep their
/// modes (who may open them is what they are for). Returns what was tightened; a mode that cannot be
/// changed (someone else's file) is an error naming the path.
pub fn make_private(
    root: &Path,
    root_mode: u32,
    descend: &dyn Fn(&Path) -> Descend,
) -> std::io::Result<Vec<Tightened>> {
    let mut done = Vec::new();
    set_mode(root, root_mode, &mut done)?;
    walk(root, descend, &mut done)?;
    Ok(done)
}

fn walk(
    dir: &Path,
    descend: &dyn Fn(&Path) -> Descend,
    done: &mut Vec<Tightened>,
) -> std::io::Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| named(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| named(dir, e))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| named(&path, e))?;
        let mode = meta.permissions().mode() & 0o7777;
        if meta.file_type().is_symlink() {
            continue;
        }
        let how = descend(&path);
        if how == Descend::Leave {
            continue;
        }
        if meta.is_dir() {
            set_mode(&path, 0o700, done)?;
            if how == Descend::All {
                walk(&path, descend, done)?;
            }
        } else if meta.is_file() && mode & 0o7077 != 0 {
            set_mode(&path, mode & 0o700, done)?;
        }
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32, done: &mut Vec<Tightened>) -> std::io::Result<()> {
    let was = std::fs::symlink_metadata(path)
        .map_err(|e| named(path, e))?
        .permissions()
        .mode()
        & 0o7777;
    if was == mode {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "{} is {was:04o} and cannot be made {mode:04o} ({e}): make it this user's, \
                 or readable by its owner only",
                path.display()
            ),
        )
    })?;
    done.push(Tightened {
        path: path.to_owned(),
        was,
        now: mode,
    });
    Ok(())
}

fn named(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn a_tree_is_made_its_owners_alone() {
        let top = tempfile::tempdir().expect("temp dir");
        let root = top.path().join("data");
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
        };
        std::fs::create_dir_all(root.join("pki")).expect("mkdir");
        std::fs::create_dir_all(root.join("jobs/j1")).expect("mkdir");
        std::fs::create_dir_all(root.join("images")).expect("mkdir");
        for (f, m) in [
            ("allot.db", 0o644),
            ("allot.db-wal", 0o664),
            ("secrets.key", 0o600),
            ("pki/ca.pem", 0o644),
            ("run.sh", 0o755),
            ("jobs/j1/out.txt", 0o644),
            ("images/layer", 0o644),
        ] {
            std::fs::write(root.join(f), "x").expect("write");
            set(&root.join(f), m);
        }
        set(&root.join("jobs/j1"), 0o755);
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).expect("link");
        let descend = |p: &Path| {
            if p.ends_with("jobs/j1") {
                Descend::Itself
            } else if p.ends_with("images") {
                Descend::Leave
            } else {
                Descend::All
            }
        };
        let done = make_private(&root, 0o700, &descend).expect("private");
        let mut fixed: Vec<String> = done
            .iter()
            .map(|t| {
                let rel = t.path.strip_prefix(&root).expect("below the root");
                format!("{} {:o}>{:o}", rel.display(), t.was, t.now)
            })
            .collect();
        fixed.sort();
        assert_eq!(
            fixed,
            [
                " 755>700",
                "allot.db 644>600",
                "allot.db-wal 664>600",
                "jobs 755>700",
                "jobs/j1 755>700",
                "pki 755>700",
                "pki/ca.pem 644>600",
                "run.sh 755>700",
            ]
        );
        assert_eq!(mode(&root.join("jobs/j1/out.txt")), 0o644, "the job's own");
        assert_eq!(mode(&root.join("images/layer")), 0o644, "left alone");
        assert_eq!(mode(Path::new("/etc/passwd")), 0o644, "links not followed");
        assert!(
            make_private(&root, 0o700, &descend)
                .expect("again")
                .is_empty(),
            "a private tree is left as it is"
        );
        // Passed through, not listed.
        let done = make_private(&root, 0o711, &descend).expect("0711");
        assert_eq!(done.len(), 1);
        assert_eq!(mode(&root), 0o711);
    }
}
