//! Test harness: a real control plane on free ports, real agents with simulated GPUs over
//! real gRPC on loopback, and a fresh database per test (SQLite file or PostgreSQL database).

pub mod browser;
pub mod oci;
pub mod oidc;
pub mod replica;
pub mod shim;

use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_agent::AgentConfig;
use allot_agent::gpu::SimBackend;
use allot_domain::SystemClock;
use allot_server::{RunningServer, ServerConfig};
pub use allot_store::testing::Backend;
use allot_store::testing::TestDb;
pub use reqwest::StatusCode;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a test waits for something that should take well under a second.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub struct TestCluster {
    pub server: RunningServer,
    /// The database URL (for tests that act as a database superuser).
    pub db_url: String,
    pub admin_token: String,
    pub http: reqwest::Client,
    pub data_dir: tempfile::TempDir,
    /// The external checkpoint sink's directory.
    pub checkpoints: tempfile::TempDir,
    agents_stop: CancellationToken,
    agents: Vec<JoinHandle<Result<(), allot_agent::AgentError>>>,
    _db: TestDb,
}

/// Starts a control plane on port 0 and `nodes` agents, each with `gpus` (e.g. `4xH200`),
/// and waits until every node is ready.
pub async fn spawn_cluster(backend: Backend, nodes: usize, gpus: &str) -> TestCluster {
    spawn_cluster_with(backend, nodes, gpus, |_| {}).await
}

/// [`spawn_cluster`], with the server's configuration adjusted by `configure` first.
pub async fn spawn_cluster_with(
    backend: Backend,
    nodes: usize,
    gpus: &str,
    configure: impl FnOnce(&mut ServerConfig),
) -> TestCluster {
    spawn_cluster_of(backend, nodes, gpus, configure, |_| {}).await
}

/// [`spawn_cluster_with`], with each agent's configuration adjusted by `agent` too.
pub async fn spawn_cluster_of(
    backend: Backend,
    nodes: usize,
    gpus: &str,
    configure: impl FnOnce(&mut ServerConfig),
    agent: impl Fn(&mut AgentConfig),
) -> TestCluster {
    let db = TestDb::new(backend).await.expect("test database");
    let mut config = ServerConfig::new(db.url.clone());
    config.heartbeat_interval = Duration::from_millis(300);
    config.schedule_interval = Duration::from_millis(200);
    config.checkpoint_interval = Duration::from_millis(200);
    configure(&mut config);
    // An HTTPS API: trust the certificates of its chain (its CA among them).
    let mut http = http_client();
    if let Some(tls) = &config.tls {
        for cert in reqwest::Certificate::from_pem_bundle(tls.cert_pem.as_bytes()).expect("PEM") {
            http = http.add_root_certificate(cert);
        }
    }
    let http = http.build().expect("HTTP client");
    let checkpoints = tempfile::tempdir().expect("temp dir");
    config.checkpoint_dir = Some(checkpoints.path().to_owned());
    let server = allot_server::start(config, Arc::new(SystemClock))
        .await
        .expect("server starts");
    let admin_token = server
        .bootstrap_admin_token
        .clone()
        .expect("a fresh database gets a bootstrap admin token");
    let data_dir = tempfile::tempdir().expect("temp dir");
    let agents_stop = CancellationToken::new();
    let mut agents = Vec::with_capacity(nodes);
    for i in 1..=nodes {
        let name = format!("node-{i}");
        let backend = SimBackend::from_spec(gpus, &name)
            .expect("gpu spec")
            .with_fault_dir(data_dir.path().join(&name).join("sim-faults"));
        let mut cfg = agent_config(&server, &name, data_dir.path().join(&name)).await;
        agent(&mut cfg);
        if matches!(cfg.runtime, allot_agent::RuntimeChoice::Oci(_)) {
            oci::searchable(data_dir.path());
        }
        agents.push(tokio::spawn(allot_agent::run(
            cfg,
            Arc::new(backend),
            agents_stop.clone(),
        )));
    }
    let cluster = TestCluster {
        db_url: db.url.clone(),
        server,
        admin_token,
        http,
        data_dir,
        checkpoints,
        agents_stop,
        agents,
        _db: db,
    };
    cluster
        .eventually("all nodes ready", || async {
            let (_, nodes_json) = cluster.get("/api/v1/nodes").await;
            let ready = nodes_json
                .as_array()
                .map(|a| a.iter().filter(|n| n["status"] == "ready").count())
                .unwrap_or(0);
            (ready == nodes).then_some(())
        })
        .await;
    cluster
}

/// A one-time bootstrap token, as `allot node bootstrap-token create` makes one.
/// The token the development sign-in page puts in its forms (`csrf_token`), which a
/// browser sends back with them.
pub fn dev_sign_in_token(html: &str) -> &str {
    html.split("name=\"csrf_token\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("the development sign-in form carries a token")
}

/// A bootstrap token admitting any new node (`*`), as an admin may make one.
pub async fn bootstrap_token(server: &RunningServer) -> String {
    bootstrap_token_for(server, "*", false).await
}

/// A bootstrap token admitting `node_name` (a name or a pattern), replacing a registered
/// node of that name when `replace`.
pub async fn bootstrap_token_for(server: &RunningServer, node_name: &str, replace: bool) -> String {
    allot_api::issue_bootstrap_token(
        &server.store,
        &allot_domain::AuditContext::system("test"),
        "test",
        allot_api::TokenFor { node_name, replace },
        Duration::from_secs(600),
    )
    .await
    .expect("bootstrap token")
    .0
}

/// An agent of `server` named `name`, with a fresh bootstrap token, keeping its files in
/// `data_dir`.
pub async fn agent_config(
    server: &RunningServer,
    name: &str,
    data_dir: std::path::PathBuf,
) -> AgentConfig {
    AgentConfig {
        servers: vec![server.grpc_url()],
        ca_cert_pem: server.node_ca_pem.clone(),
        bootstrap_token: Some(bootstrap_token(server).await),
        node_name: name.to_owned(),
        data_dir,
        stop_grace: Duration::from_secs(2),
        // Room for every job a test runs at once, whatever the machine running the tests has:
        // a job asking for no CPU or memory reserves its tenant's default.
        offer: allot_agent::NodeResources {
            cpu_milli: 64_000,
            memory_bytes: 256 << 30,
        },
        metrics_listen: None,
        sharing: allot_agent::sharing::SharingConfig::default(),
        runtime: allot_agent::RuntimeChoice::Process,
        address: String::new(),
        job_log_tail: allot_agent::DEFAULT_JOB_LOG_TAIL,
        min_free_disk_bytes: 0,
    }
}

impl TestCluster {
    /// The control plane's Prometheus text (the cluster must serve metrics).
    pub async fn scrape_metrics(&self) -> String {
        let addr = self.server.metrics_addr.expect("metrics listener");
        self.http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.http_url())
    }

    /// Sends a request with the admin token and returns status and JSON (or `Null`).
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("request sent");
        let status = res.status();
        let text = res.text().await.expect("body read");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// GET with the admin token, for a text answer (a job's log).
    pub async fn get_text(&self, path: &str) -> String {
        let res = self
            .http
            .get(self.url(path))
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .expect("request sent");
        assert!(res.status().is_success(), "{path}: {}", res.status());
        res.text().await.expect("body read")
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::GET, path, Some(&self.admin_token), None)
            .await
    }

    /// DELETE with the admin token.
    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::DELETE, path, Some(&self.admin_token), None)
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(
            reqwest::Method::POST,
            path,
            Some(&self.admin_token),
            Some(body),
        )
        .await
    }

    /// PUT with the admin token.
    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(
            reqwest::Method::PUT,
            path,
            Some(&self.admin_token),
            Some(body),
        )
        .await
    }

    /// Declares volume `name` at `host_path`, for `tenants`.
    pub async fn put_volume(&self, name: &str, host_path: &std::path::Path, tenants: &[&str]) {
        let (status, body) = self
            .put(
                &format!("/api/v1/volumes/{name}"),
                serde_json::json!({ "host_path": host_path, "tenants": tenants }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    /// Creates a tenant with at most `max_gpus` GPUs (unlimited when `None`).
    /// Creates tenant `name` (a team of `parent`, if given) with `quota` (the API's body).
    pub async fn create_tenant_in(&self, name: &str, parent: Option<&str>, quota: Value) {
        let (status, body) = self
            .post(
                "/api/v1/tenants",
                serde_json::json!({ "name": name, "parent": parent, "quota": quota }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    pub async fn create_tenant(&self, name: &str, max_gpus: Option<u32>) {
        let quota =
            serde_json::json!({ "limit": { "gpu_milli": max_gpus.map(|g| u64::from(g) * 1000) } });
        let (status, body) = self
            .post(
                "/api/v1/tenants",
                serde_json::json!({ "name": name, "quota": quota }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    /// A new API token of `role` in `tenant`, as its secret.
    pub async fn token_for(&self, tenant: &str, role: &str) -> String {
        let (s, body) = self
            .post(
                "/api/v1/tokens",
                serde_json::json!({ "name": format!("{tenant}-{role}"), "tenant": tenant, "role": role }),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        body["secret"].as_str().expect("secret").to_owned()
    }

    /// Every file of the cluster (the nodes' data, the database's directory, the checkpoint
    /// sink) whose bytes contain `needle`.
    pub fn files_containing(&self, needle: &[u8]) -> Vec<std::path::PathBuf> {
        let db_dir = self
            .db_url
            .trim_start_matches("sqlite://")
            .split('?')
            .next()
            .and_then(|f| {
                std::path::Path::new(f)
                    .parent()
                    .map(std::path::Path::to_owned)
            });
        let mut found = files_containing(self.data_dir.path(), needle);
        found.extend(files_containing(self.checkpoints.path(), needle));
        if let Some(d) = db_dir.filter(|d| d.is_dir()) {
            found.extend(files_containing(&d, needle));
        }
        found
    }

    /// Every entry of audit log `log` (`system` or a tenant's id), read from the database.
    pub async fn audit_log(&self, log: &str) -> Vec<allot_domain::AuditEntry> {
        allot_store::AuditRepo::audit_entries(&self.server.store, log, 0, 1_000_000)
            .await
            .expect("audit entries")
            .into_iter()
            .filter_map(|e| e.body)
            .map(|b| serde_json::from_str(&b).expect("an entry's body"))
            .collect()
    }

    /// Submits a job as admin with extra request fields (`gpu_milli`, `priority`, ...) and
    /// returns its id.
    pub async fn submit_with(&self, tenant: &str, fields: Value, command: &[&str]) -> String {
        let mut body = serde_json::json!({ "tenant": tenant, "command": command });
        if let (Some(b), Some(extra)) = (body.as_object_mut(), fields.as_object()) {
            b.extend(extra.clone());
        }
        let (status, body) = self.post("/api/v1/jobs", body).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_str().expect("job id").to_owned()
    }

    /// Submits a job as admin and returns its id.
    pub async fn submit(&self, tenant: &str, gpus: u32, command: &[&str]) -> String {
        let (status, body) = self
            .post(
                "/api/v1/jobs",
                serde_json::json!({ "tenant": tenant, "gpus": gpus, "command": command }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_str().expect("job id").to_owned()
    }

    /// The id of the user the identity provider calls `subject` (they signed in before).
    pub async fn user_id(&self, subject: &str) -> String {
        let (_, users) = self.get("/api/v1/users").await;
        users
            .as_array()
            .expect("users")
            .iter()
            .find(|u| u["subject"] == subject)
            .unwrap_or_else(|| panic!("{subject} has signed in: {users}"))["id"]
            .as_str()
            .expect("id")
            .to_owned()
    }

    /// Polls `check` until it yields a value, failing the test after [`PATIENCE`].
    pub async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        self.eventually_within(what, PATIENCE, check).await
    }

    /// [`Self::eventually`] with a patience of its own, for what waits on several of the
    /// control plane's windows (which a loaded machine stretches).
    pub async fn eventually_within<T, F, Fut>(
        &self,
        what: &str,
        patience: Duration,
        mut check: F,
    ) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(start.elapsed() < patience, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the pending job carries a reason and returns the job.
    pub async fn wait_for_reason(&self, id: &str) -> Value {
        self.eventually("a pending reason", || async {
            let (_, job) = self.get(&format!("/api/v1/jobs/{id}")).await;
            job["pending_reason"]["code"].is_string().then_some(job)
        })
        .await
    }

    /// Waits until the job is in `state` and returns it.
    pub async fn wait_for_state(&self, id: &str, state: &str) -> Value {
        let path = format!("/api/v1/jobs/{id}");
        let start = Instant::now();
        loop {
            let (_, job) = self.get(&path).await;
            if job["state"] == state {
                return job;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "timed out waiting for job {id} to be {state}; it is {job:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the job has ended (succeeded, failed, cancelled or timed out) and returns
    /// it.
    pub async fn wait_for_end(&self, id: &str) -> Value {
        self.eventually("the job ends", || async {
            let (_, j) = self.get(&format!("/api/v1/jobs/{id}")).await;
            allot_domain::JobState::ends_in(j["state"].as_str().unwrap_or_default()).then_some(j)
        })
        .await
    }

    /// The job's log as the API serves it.
    pub async fn log_of(&self, id: &str) -> String {
        self.http
            .get(self.url(&format!("/api/v1/jobs/{id}/log")))
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .expect("log")
            .text()
            .await
            .expect("text")
    }

    /// Runs `allot ARGS` against the cluster as its admin, however it ends.
    pub fn cli_output(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(allot_bin())
            .args(args)
            .env("ALLOT_SERVER", self.server.http_url())
            .env("ALLOT_TOKEN", &self.admin_token)
            .output()
            .expect("allot runs")
    }

    /// Runs `allot ARGS` against the cluster as its admin; what it printed, once it
    /// succeeded.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub async fn shutdown(self) {
        self.agents_stop.cancel();
        for a in self.agents {
            a.await.expect("agent task").expect("agent stops cleanly");
        }
        self.server.shutdown().await;
    }
}

pub use allot_agent::runtime::process::process_group_alive;

/// An `allot agent` process of the cluster (`--runtime process`, simulated `sim_gpus`), its
/// files in the cluster's data dir under `name` and its output appended to `<name>.log`
/// there; `token` for its first registration (none: it has its certificate from an earlier
/// run). The caller ends it.
pub fn agent_process(
    c: &TestCluster,
    name: &str,
    sim_gpus: &str,
    token: Option<&str>,
) -> std::process::Child {
    use std::process::{Command, Stdio};
    let dir = c.data_dir.path().join(name);
    std::fs::create_dir_all(&dir).expect("agent dir");
    // Written once, whole (a rename): an agent started a moment earlier may be reading it,
    // and one that read it truncated would trust no server for the rest of its life.
    let ca = c.data_dir.path().join("node-ca.pem");
    if std::fs::read(&ca).ok().as_deref() != Some(c.server.node_ca_pem.as_bytes()) {
        let tmp = c.data_dir.path().join(format!("node-ca.pem.{name}"));
        std::fs::write(&tmp, &c.server.node_ca_pem).expect("CA file");
        std::fs::rename(&tmp, &ca).expect("CA file in place");
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.with_extension("log"))
        .expect("agent log");
    let mut cmd = Command::new(allot_bin());
    cmd.arg("agent")
        .args(["--server", &c.server.grpc_url()])
        .arg("--ca-cert")
        .arg(&ca)
        .args(["--name", name])
        .args(["--gpu-backend", "sim", "--sim-gpus", sim_gpus])
        .arg("--data-dir")
        .arg(&dir)
        .args(["--runtime", "process", "--stop-grace-secs", "1"])
        .env("ALLOT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    if let Some(t) = token {
        cmd.args(["--bootstrap-token", t]);
    }
    cmd.spawn().expect("allot agent starts")
}

/// Builds (if needed) and locates the `allot` binary of this workspace and profile.
pub fn allot_bin() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("ALLOT_BIN") {
        return std::path::PathBuf::from(p);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "--quiet", "-p", "allot", "-p", "allot-bench"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo build runs");
    assert!(status.success(), "building the allot binary failed");
    // target/<profile>/deps/<test binary> -> target/<profile>/allot
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target profile directory");
    profile_dir.join("allot")
}

/// A throwaway certificate authority and a server certificate it signed for `localhost`
/// and 127.0.0.1: (CA PEM, server chain PEM, server key PEM).
pub fn test_pki() -> (String, String, String) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "Allot test CA");
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("params");
    let leaf_key = rcgen::KeyPair::generate().expect("key");
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).expect("certificate");
    (
        ca_cert.pem(),
        format!("{}{}", leaf_cert.pem(), ca_cert.pem()),
        leaf_key.serialize_pem(),
    )
}

/// An HTTP client builder, with the process's TLS crypto provider in place.
pub fn http_client() -> reqwest::ClientBuilder {
    allot_api::crypto::install_crypto_provider();
    reqwest::Client::builder()
}

/// Every file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file()
                && std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            {
                found.push(path);
            }
        }
    }
    found
}

/// A value no other test or run shares (`<what>-<random hex>`), so finding it anywhere
/// means it leaked from the test that made it.
pub fn unique(what: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{what}-{:016x}{:016x}", h.finish(), {
        h.write_u8(1);
        h.finish()
    })
}
