//! The processes a benchmark starts: `allot server` replicas it can kill, freeze and start
//! again on the same addresses, `allot agent` processes, and what `/proc` says of the jobs
//! they run.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allot_client::Client;
use anyhow::bail;
use serde_json::Value;

/// How this benchmark's `allot agent` processes are started (shared with `allot bench crash`).
#[derive(Clone)]
pub(crate) struct Agents {
    pub(crate) exe: PathBuf,
    /// The control plane's node CA certificate.
    pub(crate) ca_cert: PathBuf,
    pub(crate) sim_gpus: String,
    pub(crate) runtime: crate::RuntimeKind,
    /// The loopback registry the `oci` runtime pulls from.
    pub(crate) registry: Option<String>,
    /// More `allot agent` arguments (say, the shim to preload into shared jobs).
    pub(crate) extra_args: Vec<String>,
}

impl Agents {
    /// Starts the agent `name` keeping its state in `data_dir` (its log beside it, as
    /// `<data_dir>.log`), reaching the control plane's gRPC ports at `servers` (each
    /// replica's).
    pub(crate) fn spawn_at(
        &self,
        name: &str,
        data_dir: &std::path::Path,
        bootstrap_token: &str,
        servers: &[SocketAddr],
    ) -> anyhow::Result<tokio::process::Child> {
        let servers: Vec<String> = servers.iter().map(|s| format!("https://{s}")).collect();
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.arg("agent")
            .args(["--server", &servers.join(",")])
            .arg("--ca-cert")
            .arg(&self.ca_cert)
            // Used by the first start only: later ones present the saved certificate.
            .args(["--bootstrap-token", bootstrap_token])
            .args(["--name", name])
            .args(["--sim-gpus", &self.sim_gpus])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--stop-grace-secs", "1"])
            .args(match self.runtime {
                crate::RuntimeKind::Process => vec!["--runtime", "process"],
                crate::RuntimeKind::Oci => vec!["--runtime", "oci"],
            })
            .args(
                self.registry
                    .iter()
                    .flat_map(|r| ["--insecure-registry".to_owned(), r.clone()]),
            )
            .args(&self.extra_args);
        crate::harness::spawn_logged(&mut cmd, &data_dir.with_extension("log"))
    }
}

/// Live attempts of each job of this run (by `ALLOT_JOB_ID`), each named by its node and
/// attempt (`ALLOT_NODE`, `ALLOT_ATTEMPT`: a container's init and its job's processes are one
/// attempt), read from `/proc`. A process is this run's when its environment has `marker`.
/// `foreign` remembers processes (by pid and start time) that are not this run's jobs, so
/// each environment is read once.
pub(crate) fn live_job_processes(
    marker: &str,
    foreign: &mut HashSet<(u32, String)>,
) -> HashMap<String, HashSet<(String, String)>> {
    let mut seen: HashMap<String, HashSet<(String, String)>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return seen;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // state is the first field after the name; starttime the 20th.
        if fields.first() == Some(&"Z") {
            continue;
        }
        // The name too: a process that execs keeps its pid and start time but changes its
        // environment (a container's init is the runtime's process until it execs).
        let name = head.split_once('(').map_or("", |(_, n)| n);
        let key = (
            pid,
            format!("{} {name}", fields.get(19).copied().unwrap_or_default()),
        );
        if foreign.contains(&key) {
            continue;
        }
        let Ok(environ) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        if !vars.iter().any(|v| v.starts_with(marker.as_bytes())) {
            foreign.insert(key);
            continue;
        }
        let var = |name: &str| {
            let prefix = format!("{name}=");
            vars.iter()
                .find_map(|v| v.strip_prefix(prefix.as_bytes()))
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        if let Some(id) = var("ALLOT_JOB_ID") {
            let attempt = (
                var("ALLOT_NODE").unwrap_or_default(),
                var("ALLOT_ATTEMPT").unwrap_or_else(|| pid.to_string()),
            );
            seen.entry(id).or_default().insert(attempt);
        }
    }
    seen
}

pub(crate) async fn all_jobs(client: &Client) -> anyhow::Result<Vec<Value>> {
    let mut jobs = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut query = vec![("limit", "500".to_owned())];
        if let Some(t) = &token {
            query.push(("page_token", t.clone()));
        }
        let page: Value = client.get("/api/v1/jobs", &query).await?;
        jobs.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_owned()),
            None => return Ok(jobs),
        }
    }
}

/// Waits (up to a minute) until `count` nodes are ready, and returns them.
pub(crate) async fn ready_nodes(client: &Client, count: usize) -> anyhow::Result<Vec<Value>> {
    let started = Instant::now();
    loop {
        let list: Vec<Value> = client.get("/api/v1/nodes", &[]).await?;
        let ready: Vec<Value> = list
            .into_iter()
            .filter(|n| n["status"] == "ready")
            .collect();
        if ready.len() == count {
            return Ok(ready);
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "only {} of {count} agents registered within 60 s",
                ready.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A one-time bootstrap token for the node `name`, good for an hour (issued straight into
/// the store of a control plane running in this process).
pub(crate) async fn bootstrap_token(
    server: &allot_server::RunningServer,
    name: &str,
) -> anyhow::Result<String> {
    let (token, _) = allot_api::issue_bootstrap_token(
        &server.store,
        &allot_domain::AuditContext::system("bench"),
        name,
        allot_api::TokenFor {
            node_name: name,
            replace: false,
        },
        Duration::from_secs(3600),
    )
    .await?;
    Ok(token)
}

/// Asks a child process (an agent, or `allot bench crash`'s server) to stop: SIGTERM.
pub(crate) fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

/// A free loopback port the server binds again at each start, outside the range that
/// connections opened meanwhile take theirs from.
pub(crate) fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(allot_server::ports::stable_loopback_addr()?)
}

/// The `allot server` child process, started again on the same addresses and database.
pub(crate) struct Server {
    pub(crate) exe: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) log: PathBuf,
    pub(crate) http: SocketAddr,
    pub(crate) grpc: SocketAddr,
    pub(crate) metrics: SocketAddr,
    pub(crate) child: Option<tokio::process::Child>,
    /// Its leader work writes without the fence (the negative control; needs an `allot`
    /// built with the `unfenced-for-testing` feature, as the workspace's is).
    pub(crate) unfenced: bool,
}

impl Server {
    /// `allot server` on free loopback ports with its data in `data_dir`, logging to
    /// `log`, given `extra` arguments too; not started yet.
    pub(crate) fn new(
        exe: &Path,
        data_dir: &Path,
        log: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let (http, grpc, metrics) = (free_port()?, free_port()?, free_port()?);
        let mut args: Vec<String> = vec![
            "server".into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--listen".into(),
            http.to_string(),
            "--grpc-listen".into(),
            grpc.to_string(),
            "--metrics-listen".into(),
            metrics.to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Ok(Self {
            exe: exe.to_owned(),
            args,
            log: log.to_owned(),
            http,
            grpc,
            metrics,
            child: None,
            unfenced: false,
        })
    }

    pub(crate) fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.metrics)
    }

    /// The running process's id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    /// Sends `signal` (SIGSTOP, SIGCONT) to the running process.
    pub(crate) fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self
            .child
            .as_ref()
            .and_then(tokio::process::Child::id)
            .and_then(|p| i32::try_from(p).ok())
        {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// The leader epoch its metrics show (0 while it follows), if it answers.
    pub(crate) async fn epoch(&self, http: &reqwest::Client) -> Option<i64> {
        let url = format!("http://{}/metrics", self.metrics);
        let text = http.get(url).send().await.ok()?.text().await.ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("allot_leader_epoch "))
            .and_then(|v| v.trim().parse().ok())
    }

    pub(crate) fn spawn(&mut self) -> anyhow::Result<()> {
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(&self.args);
        if self.unfenced {
            cmd.env(allot_server::UNFENCED_ENV, "1");
        }
        let child = crate::harness::spawn_logged(&mut cmd, &self.log)?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits for `/readyz` to answer 200; how long since `since`.
    pub(crate) async fn ready(
        &mut self,
        http: &reqwest::Client,
        since: Instant,
    ) -> anyhow::Result<Duration> {
        let url = format!("http://{}/readyz", self.http);
        loop {
            if let Ok(r) = http.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(since.elapsed());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "the server exited ({status}) before it was ready; its log: {}",
                    self.log.display()
                );
            }
            if since.elapsed() > Duration::from_secs(120) {
                bail!(
                    "the server was not ready within 120 s; its log: {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// SIGTERM, and SIGKILL if it has not stopped within 15 s.
    pub(crate) async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child);
            if tokio::time::timeout(Duration::from_secs(15), child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }
}
