//! `allot server` replicas as separate processes of the real binary, for the tests that
//! share one database among several of them, and the waiting such tests do.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::allot_bin;

/// One `allot server` process and where it listens; killed when dropped if still running.
pub struct Replica {
    pub name: String,
    pub http: String,
    pub grpc: String,
    pub metrics: String,
    pub child: Child,
}

/// A port nothing listens on just now, outside the range connections take theirs from
/// (replicas are started again on the same port).
pub fn free_port() -> u16 {
    allot_server::ports::stable_loopback_addr()
        .expect("a free port")
        .port()
}

/// Starts replica `name` on `url` with its data in `dir/server` (replicas started with one
/// `dir` share the node CA, the audit and secrets keys), its log in `dir/<name>.log`, and
/// `extra` arguments.
pub fn spawn_replica(
    name: &str,
    url: &str,
    dir: &Path,
    lease_secs: u64,
    extra: &[&str],
) -> Replica {
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log file");
    let child = Command::new(allot_bin())
        .args(["server", "--database-url", url, "--data-dir"])
        .arg(dir.join("server"))
        .args(["--listen", &format!("127.0.0.1:{http}")])
        .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(["--replica-name", name])
        .args(["--leader-lease-secs", &lease_secs.to_string()])
        .args(extra)
        .env("ALLOT_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log.try_clone().expect("log"))
        .spawn()
        .expect("allot server starts");
    Replica {
        name: name.to_owned(),
        http: format!("http://127.0.0.1:{http}"),
        grpc: format!("https://127.0.0.1:{grpc}"),
        metrics: format!("http://127.0.0.1:{metrics}/metrics"),
        child,
    }
}

impl Replica {
    /// The leader epoch this replica's metrics show (0: it follows), if it answers.
    pub async fn epoch(&self, http: &reqwest::Client) -> Option<i64> {
        let text = http
            .get(&self.metrics)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("allot_leader_epoch "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Whether the process is still the one started (it has not exited).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Ends the process (SIGTERM, then waits for it).
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// Starts replica `a` and waits until it leads (epoch 1), then replica `b` sharing its
/// data directory and waits until it follows: the pair most replica tests begin with.
pub async fn leader_and_follower(
    http: &reqwest::Client,
    url: &str,
    dir: &Path,
    lease_secs: u64,
    extra: &[&str],
) -> (Replica, Replica) {
    let a = spawn_replica("a", url, dir, lease_secs, extra);
    eventually("replica a leads", Duration::from_secs(120), async || {
        (a.epoch(http).await == Some(1)).then_some(())
    })
    .await;
    // b shares a's data directory: the node CA, the audit and secrets keys.
    let b = spawn_replica("b", url, dir, lease_secs, extra);
    eventually("replica b follows", Duration::from_secs(120), async || {
        (b.epoch(http).await == Some(0)).then_some(())
    })
    .await;
    (a, b)
}

/// A test that fails part-way leaves no server behind.
impl Drop for Replica {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `check` every 100 ms until it gives a value; panics naming `what` after `within`.
pub async fn eventually<T>(
    what: &str,
    within: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
