//! Running attempts' logs, shipped to the control plane as they grow so they can be
//! followed (`allot job logs -f`, the portal's job page). Every half second the shipper
//! reads what each attempt wrote since the last round and queues it with the status
//! reports, which are delivered in order: an attempt's last output (flushed when its
//! process ends) reaches the control plane before its end does.
//!
//! The log itself stays in the agent's data dir, which no job can see (see
//! [`runtime::joblog`]); only the agent reads it, and only as a regular file. What the node
//! keeps of it is bounded too: past its first [`HEAD_BYTES`] and its last
//! `keep_tail` bytes (`allot agent --job-log-tail`), the agent frees the log's blocks as it
//! grows ([`runtime::joblog::drop_middle`]), so a job that writes without end fills no disk.

use std::io::{Read, Seek, SeekFrom};
use std::sync::atomic::{AtomicU64, Ordering};

use allot_domain::joblog::{CHUNK_MAX_BYTES, HEAD_BYTES, TAIL_BYTES, chunks, next_range};
use allot_proto::v1::{JobLogChunk, JobLogs};

use super::*;

/// How often running attempts' new output is shipped.
pub(crate) const SHIP_EVERY: Duration = Duration::from_millis(500);

/// How much of one attempt's output goes in one round: a job writing faster than this
/// falls behind, and past [`TAIL_BYTES`] behind its oldest unshipped output (after the
/// head) is skipped.
const ROUND_BYTES: u64 = 4 * CHUNK_MAX_BYTES;

/// What is left to ship of an attempt that ended, at most: its head and its tail.
const REST_BYTES: u64 = HEAD_BYTES + TAIL_BYTES;

/// How much of the end of each attempt's log a node keeps by default (beside its head).
pub const DEFAULT_KEEP_TAIL: u64 = 64 * 1024 * 1024;

/// How much shipped output may wait for delivery (the control plane unreachable) before
/// the shipper stops reading more: the logs stay on disk meanwhile.
const QUEUED_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// The most bytes in one message (the gRPC limit is 4 MiB).
const MESSAGE_MAX_BYTES: u64 = 1024 * 1024;

/// One attempt's log, how much of it was shipped and how much of its middle was freed.
#[derive(Debug)]
pub(crate) struct LogCursor {
    job_id: String,
    attempt: u32,
    path: PathBuf,
    shipped: u64,
    /// The node keeps the log's head and this much of its end.
    keep_tail: u64,
    /// Where the freed middle of the log ends (0: nothing freed).
    freed_to: u64,
}

impl LogCursor {
    pub(crate) fn new(job_id: &str, attempt: u32, path: PathBuf, keep_tail: u64) -> Self {
        Self {
            job_id: job_id.to_owned(),
            attempt,
            path,
            shipped: 0,
            keep_tail: keep_tail.max(TAIL_BYTES),
            freed_to: 0,
        }
    }

    /// Frees what the node does not keep of the log (its middle, once shipped or skipped).
    fn bound(&mut self) {
        match runtime::joblog::drop_middle(&self.path, HEAD_BYTES, self.keep_tail, self.freed_to) {
            Ok(to) => self.freed_to = to,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(job = %self.job_id, error = %e, "job log's middle not freed");
            }
        }
    }

    /// What was written since the last call, at most `budget` bytes, in chunks (the head
    /// first, then what is kept of the end); a log not yet created (the attempt is still
    /// being set up) has nothing.
    fn take(&mut self, budget: u64) -> Vec<JobLogChunk> {
        let mut out = Vec::new();
        let mut f = match runtime::joblog::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
            Err(e) => {
                tracing::warn!(job = %self.job_id, error = %e, "job log unreadable; not shipped");
                return out;
            }
        };
        let mut read = |out: &mut Vec<JobLogChunk>| -> std::io::Result<()> {
            let len = f.metadata()?.len();
            let mut left = budget;
            while let Some(range) = next_range(self.shipped, len, left) {
                f.seek(SeekFrom::Start(range.start))?;
                for part in chunks(range) {
                    let mut data = Vec::new();
                    (&mut f)
                        .take(part.end - part.start)
                        .read_to_end(&mut data)?;
                    if data.is_empty() {
                        // Shorter than it was a moment ago: nothing more to read.
                        return Ok(());
                    }
                    let n = data.len() as u64;
                    out.push(JobLogChunk {
                        job_id: self.job_id.clone(),
                        attempt: self.attempt,
                        offset: part.start,
                        data,
                    });
                    self.shipped = part.start + n;
                    left = left.saturating_sub(n);
                }
            }
            Ok(())
        };
        if let Err(e) = read(&mut out) {
            tracing::warn!(job = %self.job_id, error = %e, "job log unreadable; not all shipped");
        }
        out
    }
}

/// A running attempt's cursor, shared by the shipper and the attempt's own task (which
/// flushes it when the attempt ends). Chunks are queued while it is held, so they are
/// queued in the order of their offsets.
pub(crate) type SharedCursor = Arc<Mutex<LogCursor>>;

/// What the reporter delivers, in order.
#[derive(Debug)]
pub(crate) enum Outbound {
    Status(JobStatusReport),
    Logs(JobLogs),
    /// An attempt's log was delivered whole, and its end after it: marked so, so an agent
    /// starting again ships only the logs of attempts it did not see to their end.
    Shipped(PathBuf),
}

/// The bytes of log output queued and not yet delivered.
#[derive(Debug, Default)]
pub(crate) struct Queued(AtomicU64);

impl Queued {
    pub(crate) fn add(&self, logs: &JobLogs) {
        self.0.fetch_add(size(logs), Ordering::Relaxed);
    }

    pub(crate) fn done(&self, logs: &JobLogs) {
        let n = size(logs);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                Some(q.saturating_sub(n))
            });
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn size(logs: &JobLogs) -> u64 {
    logs.chunks.iter().map(|c| c.data.len() as u64).sum()
}

/// Groups chunks into messages of at most [`MESSAGE_MAX_BYTES`].
fn messages(chunks: Vec<JobLogChunk>) -> Vec<JobLogs> {
    let mut out: Vec<JobLogs> = Vec::new();
    let mut bytes = 0;
    for c in chunks {
        let n = c.data.len() as u64;
        match out.last_mut() {
            Some(m) if bytes + n <= MESSAGE_MAX_BYTES => {
                bytes += n;
                m.chunks.push(c);
            }
            _ => {
                bytes = n;
                out.push(JobLogs { chunks: vec![c] });
            }
        }
    }
    out
}

impl Agent {
    fn queue_logs(&self, chunks: Vec<JobLogChunk>) {
        for m in messages(chunks) {
            self.log_queued.add(&m);
            let _ = self.reports.send(Outbound::Logs(m));
        }
    }

    /// Ships what every running attempt wrote since the last round, until `shutdown`.
    pub(crate) async fn ship_logs(self: Arc<Self>, shutdown: CancellationToken) {
        let mut every = tokio::time::interval(SHIP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = every.tick() => {}
            }
            if self.log_queued.get() > QUEUED_MAX_BYTES {
                continue;
            }
            let cursors: Vec<SharedCursor> = self
                .lock_jobs()
                .running
                .values()
                .map(|j| j.log.clone())
                .collect();
            for cursor in cursors {
                let mut c = cursor.lock().unwrap_or_else(|e| e.into_inner());
                let chunks = c.take(ROUND_BYTES);
                self.queue_logs(chunks);
                c.bound();
            }
        }
    }

    /// Ships what is kept of the logs of attempts an earlier run of this agent did not see
    /// to their end (it was killed, or the node lost power): what they wrote after the last
    /// delivery, and while the agent was down, reaches the control plane, which keeps each
    /// byte once. Done before registering, while the control plane still counts the attempts
    /// as this node's; bounded by `within`.
    pub(crate) async fn ship_leftover_logs(&self, within: Duration) {
        let logs_dir = runtime::joblog::logs_dir(&self.cfg.data_dir);
        let leftovers = runtime::joblog::unshipped(&logs_dir);
        if leftovers.is_empty() {
            return;
        }
        let ship = async {
            for (job_id, attempt, path) in &leftovers {
                let mut cursor =
                    LogCursor::new(job_id, *attempt, path.clone(), self.cfg.job_log_tail);
                for m in messages(cursor.take(REST_BYTES)) {
                    let delivered = crate::assignments::until_answered(&self.link, |mut c| {
                        let m = m.clone();
                        async move { c.append_job_logs(m).await }
                    })
                    .await;
                    if let Err(s) = delivered {
                        tracing::warn!(job = %job_id, attempt, error = %s.message(), "an earlier run's job log not taken");
                    }
                }
                if let Err(e) = runtime::joblog::mark_shipped(path) {
                    tracing::warn!(job = %job_id, error = %e, "job log not marked as shipped");
                }
                tracing::info!(job = %job_id, attempt, "shipped the log an earlier run of this agent left");
            }
        };
        if tokio::time::timeout(within, ship).await.is_err() {
            tracing::warn!(
                "the logs an earlier run of this agent left were not all shipped in time; \
                 they stay on this node"
            );
        }
    }

    /// Ships the rest of an attempt's log (its process ended): before its end is reported.
    pub(crate) fn flush_log(&self, cursor: &SharedCursor) {
        let mut c = cursor.lock().unwrap_or_else(|e| e.into_inner());
        let chunks = c.take(REST_BYTES);
        self.queue_logs(chunks);
        c.bound();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &std::path::Path, bytes: &[u8]) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .expect("open the log");
        f.write_all(bytes).expect("write the log");
    }

    #[test]
    fn a_cursor_ships_each_byte_once_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j.1.log");
        let mut c = LogCursor::new("j", 1, path.clone(), DEFAULT_KEEP_TAIL);
        assert!(c.take(ROUND_BYTES).is_empty(), "no log yet");
        write(&path, b"one\n");
        let first = c.take(ROUND_BYTES);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].offset, &first[0].data[..]), (0, &b"one\n"[..]));
        assert!(c.take(ROUND_BYTES).is_empty(), "nothing new");
        write(&path, b"two\n");
        let second = c.take(2);
        assert_eq!((second[0].offset, &second[0].data[..]), (4, &b"tw"[..]));
        let rest = c.take(ROUND_BYTES);
        assert_eq!((rest[0].offset, &rest[0].data[..]), (6, &b"o\n"[..]));
    }

    #[test]
    fn a_symbolic_link_in_a_logs_place_is_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("node-key");
        std::fs::write(&secret, b"private key").expect("write");
        let path = dir.path().join("j.1.log");
        std::os::unix::fs::symlink(&secret, &path).expect("symlink");
        let mut c = LogCursor::new("j", 1, path, DEFAULT_KEEP_TAIL);
        assert!(c.take(ROUND_BYTES).is_empty());
    }

    #[test]
    fn messages_stay_under_the_limit() {
        let chunk = |offset| JobLogChunk {
            job_id: "j".into(),
            attempt: 1,
            offset,
            data: vec![b'x'; usize::try_from(CHUNK_MAX_BYTES).expect("fits")],
        };
        let ms = messages((0..9).map(|i| chunk(i * CHUNK_MAX_BYTES)).collect());
        assert_eq!(ms.len(), 3);
        assert!(ms.iter().all(|m| size(m) <= MESSAGE_MAX_BYTES));
        assert_eq!(ms.iter().map(|m| m.chunks.len()).sum::<usize>(), 9);
    }
}
