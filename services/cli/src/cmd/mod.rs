//! One module per group of subcommands.

pub mod agent;
pub mod audit;
pub mod bench;
pub mod db;
pub mod dev;
pub mod job;
pub mod node;
pub mod server;
pub mod tenant;
pub mod token;

use std::path::Path;

use anyhow::Context;

/// Writes a secret to a file only its owner can read.
pub fn write_secret(path: &Path, secret: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    // The mode above applies only on creation; tighten a file that already existed.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    writeln!(f, "{secret}")?;
    Ok(())
}

/// Reads a secret file written by [`write_secret`], if present.
pub fn read_secret(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

pub fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}
