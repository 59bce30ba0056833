use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use allot_domain::SystemClock;
use allot_server::ServerConfig;
use anyhow::Context;
use clap::Args;

use crate::cmd::{read_secret, write_secret};

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Database URL: postgres://… in production; SQLite under --data-dir when absent.
    #[arg(long, env = "ALLOT_DATABASE_URL")]
    database_url: Option<String>,
    /// Where the embedded database and generated secrets live.
    #[arg(long, env = "ALLOT_DATA_DIR", default_value = ".allot")]
    data_dir: PathBuf,
    /// HTTP API address.
    #[arg(long, env = "ALLOT_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Agent gRPC address.
    #[arg(long, env = "ALLOT_GRPC_LISTEN", default_value = "127.0.0.1:7070")]
    grpc_listen: SocketAddr,
    /// Prometheus metrics at `/metrics` (unauthenticated: keep it on loopback or an
    /// internal network). See docs/metrics.md.
    #[arg(long, env = "ALLOT_METRICS_LISTEN", default_value = "127.0.0.1:9464")]
    metrics_listen: SocketAddr,
    #[command(flatten)]
    agents: AgentTlsArgs,
    #[command(flatten)]
    replica: ReplicaArgs,
    /// A directory with `allot.cedarschema` and `*.cedar` policies that replace the shipped
    /// authorization policies (they must validate, or the server does not start).
    #[arg(long, env = "ALLOT_POLICY_DIR")]
    policy_dir: Option<PathBuf>,
    /// Apply the elastic share policy when scheduling: per time window, each workload
    /// class's guaranteed share of the fleet, taken back from other classes' preemptible
    /// jobs (after the policy's grace period) when the class needs it; bursts; forecasts.
    /// The policy is --elastic-policy, else elastic.toml in --policy-dir, else the shipped
    /// policies/elastic.toml.
    #[arg(long, env = "ALLOT_ELASTIC")]
    elastic: bool,
    /// The elastic share policy file (TOML, like policies/elastic.toml); implies --elastic.
    #[arg(long, env = "ALLOT_ELASTIC_POLICY")]
    elastic_policy: Option<PathBuf>,
    /// Serve the API over HTTPS with this certificate chain (PEM, leaf first). Without
    /// one, the API listens on loopback only (behind a local TLS proxy, say).
    #[arg(long, env = "ALLOT_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "ALLOT_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A reverse proxy (address or CIDR block, repeatable) whose `Forwarded` and
    /// `X-Forwarded-For` headers name the client: its address is then what audit entries
    /// record and failed authentication is counted against. Without one, those headers
    /// are ignored and the client is the connection's peer.
    #[arg(
        long = "trusted-proxy",
        env = "ALLOT_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    trusted_proxies: Vec<String>,
    #[command(flatten)]
    oidc: OidcArgs,
    #[command(flatten)]
    audit: AuditArgs,
    #[command(flatten)]
    secrets: SecretsArgs,
    #[command(flatten)]
    scheduler: SchedulerArgs,
}

/// How agents reach the control plane: mutual TLS with the node CA in <data-dir>/pki/.
#[derive(Debug, clap::Args)]
pub struct AgentTlsArgs {
    /// A host name or IP address agents reach the gRPC port by, for its certificate
    /// (repeatable; this host's name and the loopback addresses are always included).
    #[arg(long = "grpc-name", env = "ALLOT_GRPC_NAMES", value_delimiter = ',')]
    grpc_names: Vec<String>,
    /// Hours a node certificate is valid; agents renew theirs two thirds of the way through.
    #[arg(long, env = "ALLOT_NODE_CERT_HOURS", default_value_t = 24,
        value_parser = clap::value_parser!(u64).range(1..=24 * 90))]
    node_cert_hours: u64,
}

impl AgentTlsArgs {
    pub fn apply(&self, data_dir: &Path, config: &mut ServerConfig) {
        config.node_ca = allot_server::pki::NodeCaSource::Dir(data_dir.join("pki"));
        config.grpc_names.extend(self.grpc_names.iter().cloned());
        if let Ok(host) = nix::unistd::gethostname()
            && let Ok(host) = host.into_string()
        {
            config.grpc_names.push(host);
        }
        config.node_cert_ttl = std::time::Duration::from_secs(self.node_cert_hours * 3600);
    }
}

/// Several replicas on one PostgreSQL database: one leads (schedules, serves the agents),
/// all serve the API. See docs/operations.md.
#[derive(Debug, clap::Args)]
pub struct ReplicaArgs {
    /// This replica's name, unique among the replicas of one database (default: the host
    /// name). A replica started again under its name waits out the leader lease its
    /// earlier run held; one that finds its name held by another running replica does not
    /// lead, and says so (its `/readyz` answers 503 naming the other).
    #[arg(long, env = "ALLOT_REPLICA_NAME")]
    replica_name: Option<String>,
    /// Where agents reach this replica's gRPC port, as `https://host:port` (default: the
    /// --grpc-listen address). Followers send agents to the leader's.
    #[arg(long, env = "ALLOT_GRPC_ADVERTISE")]
    grpc_advertise: Option<String>,
    /// Seconds the leader lease lasts unrenewed (renewed every third of it): about how long
    /// a failed leader leaves the control plane without one. Keep it well under the node
    /// lease.
    #[arg(long, env = "ALLOT_LEADER_LEASE_SECS", default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..=600))]
    leader_lease_secs: u64,
    /// Seconds a node stays ready without an accepted heartbeat. Agents stop their jobs at
    /// four fifths of it when the control plane does not answer (a failover of the leader
    /// or of the database), and their jobs are requeued once it lapses: longer rides out
    /// longer outages, shorter moves work off a dead node sooner. A fleet larger than
    /// --max-heartbeats-per-sec allows is given a longer lease alike.
    #[arg(long, env = "ALLOT_NODE_LEASE_SECS", default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(3..=3600))]
    node_lease_secs: u64,
    /// How long a node may go unheard before it is lost and its jobs run elsewhere, e.g. 5m
    /// (at least the node lease). A node whose lease lapsed takes no new work, but its jobs
    /// run on: its agent keeps them for four fifths of this while it reaches no replica, so
    /// an upgrade, a database failover or a network blip shorter than this costs no running
    /// work; a node that really died has its jobs requeued this much later (sooner when its
    /// agent comes back without them). See docs/operations.md.
    #[arg(long, env = "ALLOT_OUTAGE_TOLERANCE", default_value = "5m",
        value_parser = crate::cmd::parse_duration)]
    outage_tolerance: u64,
    /// The most heartbeats a second the leader plans to answer. A fleet larger than this
    /// many times the heartbeat interval (3 s) is told to heartbeat less often, its node
    /// lease stretched alike (5,000 nodes at 500 a second: every 10 s, a 50 s lease), as
    /// Nomad paces heartbeats. 0: never stretched.
    #[arg(long, env = "ALLOT_MAX_HEARTBEATS_PER_SEC", default_value_t = 500,
        value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    max_heartbeats_per_sec: u32,
    /// Seconds between scheduling passes when nothing asks for one sooner (submits, ends,
    /// nodes joining, wakeups from other replicas do): the most a lapsed node lease waits
    /// to be noticed.
    #[arg(long, env = "ALLOT_SCHEDULE_INTERVAL_SECS", default_value_t = 2,
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    schedule_interval_secs: u64,
}

impl ReplicaArgs {
    pub fn apply(&self, config: &mut ServerConfig) -> anyhow::Result<()> {
        config.replica_name = match &self.replica_name {
            Some(name) if name.trim().is_empty() || name.len() > 200 => {
                anyhow::bail!("--replica-name: 1 to 200 characters")
            }
            Some(name) => name.clone(),
            None => nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "allot".to_owned()),
        };
        if let Some(url) = &self.grpc_advertise {
            if !url.starts_with("https://") || reqwest::Url::parse(url).is_err() {
                anyhow::bail!("--grpc-advertise: an https:// URL, e.g. https://cp1.example:7070");
            }
            config.grpc_advertise = Some(url.clone());
        }
        config.leader_lease = std::time::Duration::from_secs(self.leader_lease_secs);
        config.lease = std::time::Duration::from_secs(self.node_lease_secs);
        config.outage_tolerance = std::time::Duration::from_secs(self.outage_tolerance);
        if config.outage_tolerance < config.lease {
            anyhow::bail!(
                "--outage-tolerance ({} s) must be at least --node-lease-secs ({})",
                self.outage_tolerance,
                self.node_lease_secs
            );
        }
        config.max_heartbeats_per_sec = f64::from(self.max_heartbeats_per_sec);
        config.schedule_interval = std::time::Duration::from_secs(self.schedule_interval_secs);
        if config.leader_lease * 2 >= config.lease {
            anyhow::bail!(
                "--leader-lease-secs ({}) must be under half of --node-lease-secs ({}): agents must find the next leader before they stop their jobs",
                self.leader_lease_secs,
                self.node_lease_secs
            );
        }
        Ok(())
    }
}

/// Bearer JWTs from the organisation's OpenID Connect provider, and what their claims grant.
#[derive(Debug, clap::Args)]
pub struct OidcArgs {
    /// The provider's issuer URL (its discovery document and keys are fetched from it).
    #[arg(long, env = "ALLOT_OIDC_ISSUER")]
    oidc_issuer: Option<String>,
    /// Accepted token audiences (the API's audience, or the client id for ID tokens).
    #[arg(
        long = "oidc-audience",
        env = "ALLOT_OIDC_AUDIENCE",
        value_delimiter = ','
    )]
    oidc_audiences: Vec<String>,
    /// Accepted signature algorithms (asymmetric only).
    #[arg(
        long = "oidc-algorithm",
        env = "ALLOT_OIDC_ALGORITHMS",
        value_delimiter = ',',
        default_value = "RS256,PS256,ES256,EdDSA"
    )]
    oidc_algorithms: Vec<String>,
    /// Grants a role to tokens with a claim: CLAIM=VALUE:ROLE[@TENANT], e.g.
    /// `groups=ml-team:member@ml`; repeat for more. The first platform admin comes from one,
    /// e.g. `email=root@example.com:platform-admin`.
    #[arg(long = "oidc-role", env = "ALLOT_OIDC_ROLES", value_delimiter = ' ')]
    oidc_roles: Vec<allot_api::jwt::ClaimRole>,
    /// Web sign-in: this deployment's client id at the provider (its redirect URI is
    /// `<public URL>/auth/callback`).
    #[arg(long, env = "ALLOT_OIDC_CLIENT_ID")]
    oidc_client_id: Option<String>,
    /// The client secret, for confidential clients.
    #[arg(long, env = "ALLOT_OIDC_CLIENT_SECRET", hide_env_values = true)]
    oidc_client_secret: Option<String>,
    /// Also accept the provider's opaque (non-JWT) access tokens, asking its introspection
    /// endpoint (RFC 7662) about each as --oidc-client-id; accepted only when issued to (or
    /// for) an --oidc-audience (or the client id).
    #[arg(long, env = "ALLOT_OIDC_OPAQUE_TOKENS", requires = "oidc_client_id")]
    oidc_opaque_tokens: bool,
    /// How long the provider's answer about an opaque token is trusted (a revoked token
    /// works at most this long after).
    #[arg(long, env = "ALLOT_OIDC_OPAQUE_CACHE_SECS", default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    oidc_opaque_cache_secs: u64,
    /// The URL people reach Allot at, e.g. https://allot.example.com [default: http://<listen>].
    #[arg(long, env = "ALLOT_PUBLIC_URL")]
    public_url: Option<String>,
    /// A web session ends this many hours after sign-in.
    #[arg(long, env = "ALLOT_SESSION_HOURS", default_value_t = 12,
        value_parser = clap::value_parser!(u64).range(1..=720))]
    session_hours: u64,
    /// A web session ends after this many minutes without a request.
    #[arg(long, env = "ALLOT_SESSION_IDLE_MINUTES", default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..=10_080))]
    session_idle_minutes: u64,
    /// Seconds of clock skew tolerated on `exp` and `nbf`.
    #[arg(long, env = "ALLOT_OIDC_LEEWAY_SECS", default_value_t = 60)]
    oidc_leeway_secs: u64,
    /// Failed authentication attempts one address may make per minute before it is refused.
    #[arg(long, env = "ALLOT_AUTH_MAX_FAILURES_PER_MINUTE", default_value_t = 20,
        value_parser = clap::value_parser!(u32).range(1..))]
    auth_max_failures_per_minute: u32,
}

impl OidcArgs {
    pub fn apply(&self, config: &mut ServerConfig) -> anyhow::Result<()> {
        config.auth_max_failures = self.auth_max_failures_per_minute;
        let Some(issuer) = &self.oidc_issuer else {
            anyhow::ensure!(
                self.oidc_roles.is_empty()
                    && self.oidc_audiences.is_empty()
                    && self.oidc_client_id.is_none(),
                "--oidc-role, --oidc-audience and --oidc-client-id need --oidc-issuer"
            );
            return Ok(());
        };
        if let Some(client_id) = &self.oidc_client_id {
            let public = self.public_url.clone().unwrap_or_else(|| {
                let scheme = if config.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}", config.http_listen)
            });
            let public = public.trim_end_matches('/');
            config.web_sign_in = Some(allot_api::signin::SignInConfig {
                issuer: issuer.clone(),
                client_id: client_id.clone(),
                client_secret: self.oidc_client_secret.clone(),
                redirect_url: Some(format!("{public}/auth/callback")),
            });
            config.sessions = allot_api::signin::SessionPolicy {
                secure_cookies: public.starts_with("https://"),
                max: std::time::Duration::from_secs(self.session_hours * 3600),
                idle: std::time::Duration::from_secs(self.session_idle_minutes * 60),
            };
        }
        let mut algorithms = Vec::new();
        for a in &self.oidc_algorithms {
            algorithms.push(
                a.parse::<jsonwebtoken::Algorithm>()
                    .map_err(|_| anyhow::anyhow!("--oidc-algorithm: unknown algorithm `{a}`"))?,
            );
        }
        let audiences = if self.oidc_audiences.is_empty() {
            // ID tokens name the client: accept them as bearer tokens too.
            self.oidc_client_id.iter().cloned().collect()
        } else {
            self.oidc_audiences.clone()
        };
        let oidc = allot_api::jwt::OidcConfig {
            issuer: issuer.clone(),
            audiences,
            algorithms,
            leeway: std::time::Duration::from_secs(self.oidc_leeway_secs),
            claim_roles: self.oidc_roles.clone(),
            jwks_refetch: allot_api::jwt::DEFAULT_JWKS_REFETCH,
            introspection: match (&self.oidc_client_id, self.oidc_opaque_tokens) {
                (Some(client_id), true) => Some(allot_api::introspection::Introspection {
                    client_id: client_id.clone(),
                    client_secret: self.oidc_client_secret.clone(),
                    cache_for: std::time::Duration::from_secs(self.oidc_opaque_cache_secs),
                }),
                _ => None,
            },
        };
        oidc.check()
            .map_err(|e| anyhow::anyhow!("OpenID Connect: {e}"))?;
        config.oidc = Some(oidc);
        Ok(())
    }
}

/// How the scheduler places and reclaims.
#[derive(Debug, clap::Args)]
pub struct SchedulerArgs {
    /// Size auto-sized jobs (`--gpus auto`) on windows this many times shorter than the
    /// production ones (a 300 s window, shrinking after 120 s below): for a benchmark that
    /// replays a day compressed as many times, or a demonstration.
    #[arg(long, env = "ALLOT_SIZING_TIME_SCALE", default_value_t = 1.0, value_parser = parse_time_scale)]
    sizing_time_scale: f64,
    /// Placement policy: allot (fragmentation-aware, the default), or a published baseline
    /// (fgd, bestfit, dotprod, gpu-packing, gpu-clustering, random).
    #[arg(long, env = "ALLOT_PLACEMENT_POLICY", default_value = "allot",
        value_parser = clap::builder::PossibleValuesParser::new(allot_scheduler::LIVE_POLICIES))]
    placement_policy: String,
    /// Seconds a job runs before reclaim may preempt it.
    #[arg(long, env = "ALLOT_MIN_RUNTIME_SECS", default_value_t = 60)]
    min_runtime_secs: u64,
    /// Most jobs sharing one GPU.
    #[arg(long, env = "ALLOT_MAX_JOBS_PER_SHARED_GPU", default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=64))]
    max_jobs_per_shared_gpu: u32,
    /// Order tenants for spare capacity by their past GPU use too, decayed with this
    /// half-life (e.g. 7d), as Slurm's fair-tree does; absent: by what they hold now only.
    #[arg(long, env = "ALLOT_FAIR_SHARE_HALF_LIFE", value_parser = crate::cmd::parse_duration)]
    fair_share_half_life: Option<u64>,
    /// Percent of a shared GPU's memory kept free of jobs' memory.
    #[arg(long, env = "ALLOT_SHARED_GPU_MEMORY_RESERVE_PCT", default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(0..=90))]
    shared_gpu_memory_reserve_pct: u32,
    /// Percent of a GPU that auto-sized jobs' forecasts leave free where they are placed or
    /// consolidated, so that they grow in place.
    #[arg(long, env = "ALLOT_SIZED_GPU_HEADROOM_PCT", default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(0..=50))]
    sized_gpu_headroom_pct: u32,
}

impl SchedulerArgs {
    pub fn apply(&self, config: &mut ServerConfig) {
        config.placement_policy = self.placement_policy.clone();
        config.sizing_time_scale = self.sizing_time_scale;
        config.min_runtime = std::time::Duration::from_secs(self.min_runtime_secs);
        config.fair_share_half_life = self
            .fair_share_half_life
            .map(std::time::Duration::from_secs);
        config.gpu_limits = allot_scheduler::engine::GpuLimits {
            max_jobs_per_shared_gpu: self.max_jobs_per_shared_gpu,
            shared_memory_reserve_pct: self.shared_gpu_memory_reserve_pct,
            sized_headroom_milli: self.sized_gpu_headroom_pct * 10,
        };
    }
}

/// Where the audit log's signing key and external checkpoint copies live.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// The checkpoint signing keys: one `PRIVATE+KEY+… [not-before=TIME] [not-after=TIME]`
    /// per line (rotate by adding a key with a later not-before); generated into
    /// <data-dir>/audit.key when absent. Keep it off the database host if you can.
    #[arg(long, env = "ALLOT_AUDIT_KEY_FILE")]
    audit_key_file: Option<PathBuf>,
    /// The signing keys themselves, in the key file's format (for secret stores that inject
    /// environment variables); takes precedence over the file.
    #[arg(long, env = "ALLOT_AUDIT_KEY", hide_env_values = true)]
    audit_key: Option<String>,
    /// Directory receiving a copy of every signed checkpoint [default: <data-dir>/checkpoints].
    #[arg(long, env = "ALLOT_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Names this deployment in checkpoint origins and the key name, e.g. audit.example.com.
    #[arg(long, env = "ALLOT_AUDIT_ORIGIN", default_value = "allot.local")]
    audit_origin: String,
    /// Prune audit entries older than this many days (their leaf hashes stay, so the logs
    /// still verify); logs under legal hold are never pruned. Default: keep everything.
    #[arg(long, env = "ALLOT_AUDIT_RETENTION_DAYS", value_parser = clap::value_parser!(u32).range(1..=36_500))]
    audit_retention_days: Option<u32>,
}

impl AuditArgs {
    /// Fills the audit settings of `config`, creating the key file on first start.
    pub fn apply(&self, data_dir: &Path, config: &mut ServerConfig) -> anyhow::Result<()> {
        let key_path = self
            .audit_key_file
            .clone()
            .unwrap_or_else(|| data_dir.join("audit.key"));
        config.audit_key = match self.audit_key.clone().or_else(|| read_secret(&key_path)) {
            Some(k) => k,
            None => {
                let k = allot_server::generate_audit_key(&self.audit_origin)?;
                write_secret(&key_path, &k)?;
                eprintln!("Audit signing key written to {}", key_path.display());
                k
            }
        };
        config.audit_origin = self.audit_origin.clone();
        config.audit_retention = self
            .audit_retention_days
            .map(|d| std::time::Duration::from_secs(u64::from(d) * 86_400));
        config.checkpoint_dir = Some(
            self.checkpoint_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("checkpoints")),
        );
        Ok(())
    }
}

/// The key sealing the secrets the database keeps (tenants' registry credentials).
#[derive(Debug, clap::Args)]
pub struct SecretsArgs {
    /// The secrets keys: one `ID:BASE64` (32 bytes) per line, the first sealing, all
    /// opening (rotate by putting a new key first); generated into <data-dir>/secrets.key
    /// when absent. Keep it off the database host, and back it up: what it sealed does not
    /// open without it.
    #[arg(long, env = "ALLOT_SECRETS_KEY_FILE")]
    secrets_key_file: Option<PathBuf>,
    /// The keys themselves, in the key file's format (for secret stores that inject
    /// environment variables); takes precedence over the file.
    #[arg(long, env = "ALLOT_SECRETS_KEY", hide_env_values = true)]
    secrets_key: Option<String>,
}

impl SecretsArgs {
    /// Fills `config.secrets_key`, creating the key file on first start.
    pub fn apply(&self, data_dir: &Path, config: &mut ServerConfig) -> anyhow::Result<()> {
        let path = self
            .secrets_key_file
            .clone()
            .unwrap_or_else(|| data_dir.join("secrets.key"));
        config.secrets_key = match self.secrets_key.clone().or_else(|| read_secret(&path)) {
            Some(k) => k,
            None => {
                let id = format!("k{}", chrono::Utc::now().format("%Y%m%d"));
                let k = allot_store::SecretKeys::generate_line(&id)?;
                write_secret(&path, &k)?;
                eprintln!("Secrets key written to {}", path.display());
                k
            }
        };
        Ok(())
    }
}

/// The SQLite database in `data_dir` (which [`crate::cmd::data_dir::secure`] made).
pub fn sqlite_url(data_dir: &std::path::Path) -> String {
    format!("sqlite://{}?mode=rwc", data_dir.join("allot.db").display())
}

pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    crate::cmd::data_dir::secure(&args.data_dir, 0o700, &|_| allot_pki::Descend::All)?;
    let database_url = match args.database_url {
        Some(u) => u,
        None => sqlite_url(&args.data_dir),
    };
    let mut config = ServerConfig::new(database_url);
    args.agents.apply(&args.data_dir, &mut config);
    args.replica.apply(&mut config)?;
    config.http_listen = args.listen;
    config.grpc_listen = args.grpc_listen;
    config.metrics_listen = Some(args.metrics_listen);
    config.policy_dir = args.policy_dir;
    config.elastic = args.elastic;
    config.elastic_policy = args.elastic_policy;
    config.trusted_proxies = allot_api::client::TrustedProxies::parse(&args.trusted_proxies)
        .context("--trusted-proxy")?;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let read = |p: &Path, what: &str| {
            std::fs::read_to_string(p).with_context(|| format!("{what}: reading {}", p.display()))
        };
        config.tls = Some(allot_server::tls::TlsIdentity {
            cert_pem: read(cert, "--tls-cert")?,
            key_pem: read(key, "--tls-key")?,
        });
    }
    // After TLS: the default public URL's scheme depends on it.
    args.oidc.apply(&mut config)?;
    args.audit.apply(&args.data_dir, &mut config)?;
    args.secrets.apply(&args.data_dir, &mut config)?;
    args.scheduler.apply(&mut config);
    let server = allot_server::start(config, Arc::new(SystemClock)).await?;
    // Watched before anything says the server is up.
    let stopped = crate::shutdown_signal();
    if let Some(token) = &server.bootstrap_admin_token {
        let path = args.data_dir.join("admin.token");
        write_secret(&path, token)?;
        eprintln!(
            "Created the bootstrap admin token (written to {}); it is not shown again.",
            path.display()
        );
    }
    println!(
        "Allot API on {}, agent gRPC (mutual TLS) on {}; agents trust {}",
        server.http_url(),
        server.grpc_url(),
        args.data_dir.join("pki").join("ca.pem").display()
    );
    stopped.await;
    eprintln!("shutting down");
    server.shutdown().await;
    Ok(())
}

fn parse_time_scale(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(k) if k.is_finite() && (1.0..=10_000.0).contains(&k) => Ok(k),
        _ => Err(format!("`{s}` is not a time scale from 1 to 10000")),
    }
}
