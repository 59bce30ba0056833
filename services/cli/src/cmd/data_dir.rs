//! The control plane's data directory (`allot server`, `allot dev`): its user's alone. It is
//! made 0700 (0711 under `allot dev --runtime oci`, whose containers pass through it to
//! their images without listing it), every directory in it 0700 and every file 0600
//! (the SQLite database and its WAL too: `allot_store` creates the database 0600 before
//! SQLite opens it), checked at every start: anything more open is tightened, each change
//! said on stderr, and a file that cannot be (another user's) refuses the start. The
//! embedded agents' directories (`nodes/`) are each agent's to keep.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use anyhow::Context;

/// Creates `dir` with `mode` (its parents as the umask says) and makes what is in it
/// private, as `descend` says of each entry (`|_| Descend::All`: all of it).
pub fn secure(
    dir: &Path,
    mode: u32,
    descend: &dyn Fn(&Path) -> allot_pki::Descend,
) -> anyhow::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating the data directory {}", dir.display()))?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("creating the data directory {}", dir.display()));
        }
    }
    let fixed = allot_pki::make_private(dir, mode, descend)
        .with_context(|| format!("making the data directory {} private", dir.display()))?;
    for t in fixed {
        eprintln!("data directory: {t} (readable only by its owner)");
    }
    Ok(())
}
