//! `allot server` replicas as separate processes of the real binary, for the tests that
//! share one database among several of them, and the waiting such tests do.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

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
    spawn_logged(name, name, url, dir, lease_secs, extra)
}

/// [`spawn_replica`], its log in `dir/<log>.log` (two processes given one name).
pub fn spawn_logged(
    name: &str,
    log: &str,
    url: &str,
    dir: &Path,
    lease_secs: u64,
    extra: &[&str],
) -> Replica {
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let log = std::fs::File::create(dir.join(format!("{log}.log"))).expect("log file");
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

/// Polls `check` every 100 ms until it gives a value, following the system's own state:
/// `check` says what it sees when it is not there yet, and the wait goes on while that
/// changes (a cluster still bootstrapping, on a loaded machine). Panics naming `what` and
/// what it last saw once nothing changed for `idle`, or after `cap` in all.
pub async fn eventually_following<T>(
    what: &str,
    idle: Duration,
    cap: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    let (mut seen, mut changed) = (String::new(), Instant::now());
    loop {
        match check().await {
            Ok(v) => return v,
            Err(now) if now != seen => {
                eprintln!("{what}: {now} ({:.1} s)", start.elapsed().as_secs_f64());
                (seen, changed) = (now, Instant::now());
            }
            Err(_) => {}
        }
        assert!(
            changed.elapsed() < idle && start.elapsed() < cap,
            "{what}: not within {:?} ({:?} without change, at most {cap:?}); last seen: {seen}",
            start.elapsed(),
            changed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `sig` (`-STOP`, `-CONT`, `-TERM`, `-9`) to `child`.
pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "kill {sig}");
}

/// The API as a platform admin speaks to it, through any replica.
pub struct Api<'a> {
    pub http: &'a reqwest::Client,
    pub token: String,
}

impl Api<'_> {
    pub async fn call(
        &self,
        base: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{base}{path}"))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("the API answers");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    pub async fn job(&self, base: &str, id: &str) -> Value {
        self.call(
            base,
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{id}"),
            None,
        )
        .await
        .1
    }

    pub async fn submit(&self, base: &str, name: &str) -> String {
        let (status, job) = self
            .call(
                base,
                reqwest::Method::POST,
                "/api/v1/jobs",
                Some(json!({
                    "tenant": "replicas",
                    "name": name,
                    "gpus": 1,
                    "command": ["sleep", "600"],
                })),
            )
            .await;
        assert_eq!(status, 201, "{job}");
        job["id"].as_str().expect("job id").to_owned()
    }
}

/// Makes tenant `replicas` (unless there is one) and node `node` through `via`, and
/// starts an agent for `node` given `servers` in that order, its data in `root/<node>`.
pub async fn join_agent(
    api: &Api<'_>,
    root: &Path,
    via: &Replica,
    servers: &[&str],
    node: &str,
) -> Child {
    let (status, t) = api
        .call(
            &via.http,
            reqwest::Method::POST,
            "/api/v1/tenants",
            Some(json!({ "name": "replicas" })),
        )
        .await;
    assert!(
        status == 201 || status == 409,
        "a follower serves the API: {t}"
    );
    let (status, token) = api
        .call(
            &via.http,
            reqwest::Method::POST,
            "/api/v1/bootstrap-tokens",
            Some(json!({ "node_name": node })),
        )
        .await;
    assert_eq!(status, 201, "{token}");
    start_agent(
        root,
        servers,
        node,
        Some(token["secret"].as_str().expect("secret")),
    )
}

/// Starts the agent of `node` (again, with no `bootstrap` token: it has its identity in
/// `root/<node>`), given `servers`, its log appended to `root/<node>.log` (`agent.log`
/// for n1).
pub fn start_agent(root: &Path, servers: &[&str], node: &str, bootstrap: Option<&str>) -> Child {
    let log_name = if node == "n1" {
        "agent.log".to_owned()
    } else {
        format!("{node}.log")
    };
    let agent_log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join(log_name))
        .expect("log");
    let mut cmd = Command::new(allot_bin());
    cmd.args(["agent", "--server", &servers.join(",")])
        .arg("--ca-cert")
        .arg(root.join("server/pki/ca.pem"));
    if let Some(token) = bootstrap {
        cmd.args(["--bootstrap-token", token]);
    }
    cmd.args([
        "--name",
        node,
        "--sim-gpus",
        "2xH100",
        "--runtime",
        "process",
    ])
    .arg("--data-dir")
    .arg(root.join(node))
    .env("ALLOT_LOG", "info")
    .stdout(Stdio::null())
    .stderr(agent_log)
    .spawn()
    .expect("allot agent starts")
}

/// A file's text, trimmed.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// The tests' HTTP client: a replica that does not answer in 5 s has failed the test.
pub fn client() -> reqwest::Client {
    crate::http_client()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}
