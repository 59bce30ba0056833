//! Signed checkpoints of every audit log, at most every `interval` while entries arrive,
//! stored in the database and written to a sink outside it, so that rewriting or truncating
//! the database is detectable from the outside copy alone.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_audit::{Checkpoint, SigningKeys};
use allot_domain::{AuditContext, AuditEvent, SYSTEM_LOG};
use allot_store::{AuditRepo, Store, StoreError, StoredCheckpoint};
use base64::Engine;
use tokio_util::sync::CancellationToken;

/// Whether two signed checkpoint notes state the same log at the same size: the same
/// origin, size and root (their first three lines), whenever and by whichever replica they
/// were signed. A replica whose term ended as it signed may have put its note in the sink
/// first; the leader's note of that size says the same and the file stands.
fn same_statement(a: &str, b: &str) -> bool {
    fn head(note: &str) -> Vec<&str> {
        note.split('\n').take(3).collect()
    }
    let (a, b) = (head(a), head(b));
    a.len() == 3 && a == b
}

/// Where checkpoints go besides the database. The default writes files; an object store
/// with object lock, or a witness that cosigns, implements the same trait.
pub trait CheckpointSink: Send + Sync {
    /// Stores the signed note of `log` at `size`. Writing the same statement twice (the
    /// same origin, size and root, signed at another time) is fine and keeps the first; a
    /// note of an existing size with another root is an error (somebody forked the log).
    fn write(&self, log: &str, size: u64, note: &str) -> std::io::Result<()>;
}

/// `<dir>/<log>/<size, 20 digits>.checkpoint`, each file created once and never rewritten.
#[derive(Debug, Clone)]
pub struct DirSink {
    pub dir: PathBuf,
}

impl DirSink {
    pub fn path(&self, log: &str, size: u64) -> PathBuf {
        self.dir.join(log).join(format!("{size:020}.checkpoint"))
    }
}

/// The signed notes of `log` a [`DirSink`] holds, by size, from the sink's directory (or
/// one log's directory: an export's `checkpoints/` copy), oldest first.
pub fn read_dir_sink(dir: &std::path::Path, log: &str) -> std::io::Result<Vec<(u64, String)>> {
    let nested = dir.join(log);
    let dir = if nested.is_dir() {
        nested
    } else {
        dir.to_owned()
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let Some(size) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".checkpoint"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((size, std::fs::read_to_string(&path)?));
    }
    out.sort_by_key(|(s, _)| *s);
    Ok(out)
}

impl CheckpointSink for DirSink {
    fn write(&self, log: &str, size: u64, note: &str) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let path = self.path(log, size);
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
        // The control plane's files are its user's alone (publish copies of them).
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(note.as_bytes())?;
                f.sync_all()
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if same_statement(&std::fs::read_to_string(&path)?, note) {
                    Ok(())
                } else {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!("{} holds a different checkpoint", path.display()),
                    ))
                }
            }
            Err(e) => Err(e),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("signing: {0}")]
    Sign(#[from] allot_audit::NoteError),
    #[error("checkpoint sink: {0}")]
    Sink(#[from] std::io::Error),
}

pub struct Checkpointer {
    pub store: Store,
    /// The key in force at signing time signs; its validity period is checked offline.
    pub keys: Arc<SigningKeys>,
    /// Prefix of every checkpoint's origin line: `<origin>/<log>`.
    pub origin: String,
    pub sink: Option<Arc<dyn CheckpointSink>>,
}

impl Checkpointer {
    /// Checkpoints every log that grew since its last checkpoint; returns how many.
    pub async fn tick(&self) -> Result<usize, CheckpointError> {
        let mut made = 0;
        let signed = self.store.checkpointed_sizes().await?;
        for head in self.store.audit_heads().await? {
            if head.size == 0 || signed.get(&head.log).is_some_and(|&s| s >= head.size) {
                continue;
            }
            let now = self.store.clock().now();
            let cp = Checkpoint {
                origin: format!("{}/{}", self.origin, head.log),
                size: head.size,
                root: head.root,
                extensions: Vec::new(),
            }
            .at(now);
            let note = self.keys.active(now)?.sign_note(&cp.body())?;
            // Outside first: an outside checkpoint without its database twin is still a true
            // statement about the log; the reverse would be a gap the sink cannot vouch for.
            if let Some(sink) = &self.sink {
                sink.write(&head.log, head.size, &note)?;
            }
            match self
                .store
                .insert_checkpoint(StoredCheckpoint {
                    log: head.log.clone(),
                    size: head.size,
                    root: head.root,
                    note,
                })
                .await
            {
                Ok(()) => made += 1,
                // Another control plane replica checkpointed this size first.
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
            if head.log != SYSTEM_LOG {
                let root = base64::engine::general_purpose::STANDARD.encode(head.root);
                let event = AuditEvent::success(
                    SYSTEM_LOG,
                    "audit.checkpoint",
                    format!("audit-log/{}", head.log),
                )
                .after(serde_json::json!({ "size": head.size, "root": root }));
                self.store
                    .record_event(&AuditContext::system("checkpointer"), event)
                    .await?;
            }
        }
        Ok(made)
    }

    /// Checkpoints every `interval` until `stop`, then once more; applies `retention` (see
    /// [`Retention`]), when given, once an hour.
    pub async fn run(
        self,
        interval: Duration,
        retention: Option<Retention>,
        stop: CancellationToken,
    ) {
        let mut last_retention: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(interval) => {}
            }
            if let Err(e) = self.tick().await {
                log_failure(&e, "audit checkpoint", "; retrying");
            }
            if let Some(r) = &retention
                && last_retention.is_none_or(|t| t.elapsed() >= RETENTION_EVERY)
            {
                last_retention = Some(tokio::time::Instant::now());
                match r.tick().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(pruned = n, "audit retention pruned entries"),
                    Err(e) => tracing::error!(error = %e, "audit retention failed"),
                }
            }
        }
        // One last checkpoint so a clean shutdown leaves nothing unsigned.
        if let Err(e) = self.tick().await {
            log_failure(&e, "final audit checkpoint", "");
        }
    }
}

/// Logs a failed checkpoint (`what`, then `then` after "failed"): one refused by the fence
/// (this replica's term has ended) is a warning, since the new leader signs it.
fn log_failure(e: &CheckpointError, what: &str, then: &str) {
    match e {
        CheckpointError::Store(StoreError::Fenced(e)) => {
            tracing::warn!(error = %e, "{what} left to the new leader");
        }
        e => tracing::error!(error = %e, "{what} failed{then}"),
    }
}

const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// The retention policy: entries older than `keep` lose their payload (their leaf hashes
/// stay), except in logs under legal hold. Each pruning is recorded in the system log.
pub struct Retention {
    pub store: Store,
    pub keep: chrono::Duration,
}

impl Retention {
    /// Prunes every log that is not held; returns how many entries were pruned.
    pub async fn tick(&self) -> Result<u64, StoreError> {
        let before = self.store.clock().now() - self.keep;
        let ctx = AuditContext::system("retention");
        let mut total = 0;
        for head in self.store.audit_heads().await? {
            match self.store.prune_audit(&ctx, &head.log, before).await {
                Ok(n) => total += n,
                // The log is under legal hold: the store refused, as it should.
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(root: &str, time: &str) -> String {
        format!("allot.test/t\n7\n{root}\nallot-time {time}\n\n— allot.test sig{time}\n")
    }

    #[test]
    fn the_sink_keeps_the_first_note_of_a_statement_and_refuses_a_fork() {
        let dir = std::env::temp_dir().join(format!("allot-sink-{}", std::process::id()));
        let sink = DirSink { dir: dir.clone() };
        let first = note("cm9vdA==", "2026-12-03T00:00:00Z");
        sink.write("t", 7, &first).expect("first write");
        sink.write("t", 7, &first).expect("the same note again");
        // Signed again, later (a deposed leader got there first): the same statement.
        sink.write("t", 7, &note("cm9vdA==", "2026-12-03T00:00:05Z"))
            .expect("the same statement signed at another time");
        let kept = std::fs::read_to_string(sink.path("t", 7)).expect("read");
        // Another root at the same size: a fork, refused, and the file untouched.
        let fork = sink.write("t", 7, &note("b3RoZXI=", "2026-12-03T00:00:09Z"));
        let after = std::fs::read_to_string(sink.path("t", 7)).expect("read");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(kept, first);
        assert!(fork.is_err(), "a fork was accepted");
        assert_eq!(after, first);
    }
}
