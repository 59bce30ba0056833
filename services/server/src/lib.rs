//! The control plane process: the REST API (actix-web) and the agent gRPC service (tonic) on
//! separate ports of one tokio process, the scheduling loop, and first-start bootstrap.

pub mod budgets;
pub mod checkpoints;
pub mod drains;
pub mod elastic;
pub mod gangs;
pub mod grpc;
pub mod hub;
pub mod launches;
pub mod leadership;
pub mod memory;
pub use leadership::UNFENCED_ENV;
mod leases;
pub mod metrics;
pub mod node_limits;
pub mod pacing;
pub mod pki;
pub mod ports;
pub mod resizing;
pub mod scheduling;
pub mod sizing;
pub mod time_limits;
pub mod tls;
mod wakeups;
pub mod workflows;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpServer, web};
use allot_api::{AppState, BodyLimit, ControlEvents, secret};
use allot_domain::{AuditContext, Clock, Job, Role};
use allot_scheduler::LiveScheduler;
use allot_scheduler::engine::{Config as EngineConfig, GpuLimits};
use allot_store::{Fenced, NewToken, Store, StoreError, TokenRepo};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;

/// How long shutdown waits for open connections to finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `sqlite://path?mode=rwc` or `postgres://…`.
    pub database_url: String,
    pub http_listen: SocketAddr,
    pub grpc_listen: SocketAddr,
    /// The internal CA that issues node certificates (and the gRPC server's).
    pub node_ca: pki::NodeCaSource,
    /// Host names and IP addresses agents reach the gRPC port by: the names its server
    /// certificate carries.
    pub grpc_names: Vec<String>,
    /// How long node certificates are valid; agents renew at two thirds.
    pub node_cert_ttl: Duration,
    /// How long a node stays ready without a heartbeat.
    pub lease: Duration,
    /// How long a node may go unheard (its lease lapsed meanwhile) before it is lost and
    /// its jobs are requeued; its agent keeps them running for four fifths of it while it
    /// reaches no replica (`docs/operations.md`). At least the lease.
    pub outage_tolerance: Duration,
    pub heartbeat_interval: Duration,
    /// The most heartbeats a second the leader plans to answer: beyond it (more nodes than
    /// this many times the interval) the interval and the lease stretch alike
    /// ([`pacing::Pacing`]). 0: never stretched.
    pub max_heartbeats_per_sec: f64,
    /// Scheduling passes run at least this often.
    pub schedule_interval: Duration,
    /// This replica's name, the holder of the leader lease when it leads. Unique among the
    /// replicas sharing a database; a replica started again under its name takes its lease
    /// back at once.
    /// This process of the replica, drawn when it starts: the lease is renewed (and taken
    /// back before it lapses) only by the process holding it.
    pub replica_instance: String,
    pub replica_name: String,
    /// Where agents reach this replica's gRPC endpoint (followers point agents there when it
    /// leads). `None`: `https://` and the bound address.
    pub grpc_advertise: Option<String>,
    /// How long the leader lease lasts unrenewed (renewed every third of it): about the
    /// longest a failed leader leaves the control plane without one. Keep it well inside
    /// the node `lease`, so agents find the next leader before their jobs' lease runs out.
    pub leader_lease: Duration,
    /// The placement policy (`allot_scheduler::LIVE_POLICIES`); `allot` by default.
    pub placement_policy: String,
    /// Seeds the policy's tie-breaks, so a given history places the same way.
    pub scheduler_seed: u64,
    /// How long a job runs before reclaim may preempt it.
    pub min_runtime: Duration,
    /// Per-GPU limits on shared GPUs: most jobs on one, and the GPU memory kept free.
    pub gpu_limits: GpuLimits,
    /// Fair share over time: tenants are ordered for spare capacity by their past GPU use
    /// too, decayed with this half-life. `None`: by what they hold now only.
    pub fair_share_half_life: Option<Duration>,
    pub body_limit: usize,
    /// The audit signing keys, one `PRIVATE+KEY+… [not-before=…] [not-after=…]` per line
    /// (see `allot_audit::keys`), kept outside the database. Empty: a throwaway key.
    pub audit_key: String,
    /// The keys sealing secrets kept in the database (tenants' registry credentials), one
    /// `ID:BASE64` per line, the first sealing (see `allot_store::SecretKeys`), kept outside
    /// the database. Empty: a key that lives as long as the process.
    pub secrets_key: String,
    /// Checkpoint origins are `<audit_origin>/<log>`.
    pub audit_origin: String,
    /// Directory that receives a copy of every checkpoint (the external sink).
    pub checkpoint_dir: Option<std::path::PathBuf>,
    pub checkpoint_interval: Duration,
    /// Audit entries older than this lose their payload (leaf hashes stay), except in logs
    /// under legal hold. `None` keeps everything.
    pub audit_retention: Option<Duration>,
    /// A directory with `allot.cedarschema` and `*.cedar` policies replacing the shipped
    /// ones; validated at start-up either way.
    pub policy_dir: Option<std::path::PathBuf>,
    /// Apply the elastic share policy in the scheduling loop: time-windowed shares by
    /// workload class, bursts, forecasts (`services/server/src/elastic.rs`). The policy is
    /// `elastic_policy`, else `elastic.toml` in `policy_dir`, else the shipped one; it is
    /// validated at start-up whether applied or not.
    pub elastic: bool,
    pub elastic_policy: Option<std::path::PathBuf>,
    /// How many times faster than the clock auto-sized jobs' windows run (a benchmark
    /// replaying a day compressed `K` times sizes on windows `K` times shorter); 1: as
    /// `allot_sizing::Policy::default` says.
    pub sizing_time_scale: f64,
    /// How auto-sized jobs are sized: by forecast (the product), or a benchmark's control
    /// (on the last sample alone, or not at all).
    pub sizing_rules: sizing::Rules,
    /// Accept bearer JWTs from this OpenID Connect provider.
    pub oidc: Option<allot_api::jwt::OidcConfig>,
    /// Failed authentication attempts one source may make per `auth_failure_window` before
    /// its attempts are refused (429) for the rest of the window.
    pub auth_max_failures: u32,
    pub auth_failure_window: Duration,
    /// Reverse proxies whose forwarding headers name the client.
    pub trusted_proxies: allot_api::client::TrustedProxies,
    /// Web sign-in through the OpenID Connect provider (the authorization code flow).
    pub web_sign_in: Option<allot_api::signin::SignInConfig>,
    /// How long sessions last and whether their cookies are `Secure`.
    pub sessions: allot_api::signin::SessionPolicy,
    /// The development sign-in page (pick a seeded user, no password). Only `allot dev`
    /// sets it, and the server refuses to start with it on a non-loopback address.
    pub dev_sign_in: bool,
    /// Serve the API over HTTPS with this certificate. Without one it speaks plain HTTP,
    /// which is allowed on loopback only.
    pub tls: Option<tls::TlsIdentity>,
    /// Serve Prometheus metrics at `/metrics` on this address (no authentication: keep it
    /// on loopback or an internal network).
    pub metrics_listen: Option<SocketAddr>,
}

impl ServerConfig {
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            node_ca: pki::NodeCaSource::Ephemeral,
            grpc_names: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            node_cert_ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(15),
            outage_tolerance: Duration::from_secs(300),
            heartbeat_interval: Duration::from_secs(3),
            max_heartbeats_per_sec: 500.0,
            schedule_interval: Duration::from_secs(2),
            replica_name: format!("replica-{}", uuid::Uuid::new_v4().simple()),
            replica_instance: uuid::Uuid::new_v4().simple().to_string(),
            grpc_advertise: None,
            leader_lease: Duration::from_secs(5),
            placement_policy: "allot".to_owned(),
            scheduler_seed: 42,
            min_runtime: Duration::from_secs(60),
            fair_share_half_life: None,
            gpu_limits: GpuLimits::default(),
            body_limit: allot_api::extract::DEFAULT_BODY_LIMIT,
            audit_key: String::new(),
            secrets_key: String::new(),
            audit_origin: "allot.local".to_owned(),
            checkpoint_dir: None,
            checkpoint_interval: Duration::from_secs(1),
            audit_retention: None,
            policy_dir: None,
            elastic: false,
            elastic_policy: None,
            sizing_time_scale: 1.0,
            sizing_rules: sizing::Rules::default(),
            oidc: None,
            auth_max_failures: 20,
            auth_failure_window: Duration::from_secs(60),
            trusted_proxies: allot_api::client::TrustedProxies::default(),
            web_sign_in: None,
            sessions: allot_api::signin::SessionPolicy::default(),
            dev_sign_in: false,
            tls: None,
            metrics_listen: None,
        }
    }
}

/// A new audit signing key named `name`, as a `PRIVATE+KEY+…` string.
pub fn generate_audit_key(name: &str) -> Result<String, allot_audit::NoteError> {
    Ok(allot_audit::Signer::generate_system(name)?.skey())
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Secrets(#[from] allot_store::SecretsError),
    #[error("audit signing key: {0}")]
    AuditKey(#[from] allot_audit::NoteError),
    #[error("scheduler: {0}")]
    Scheduler(#[from] allot_scheduler::LiveError),
    #[error(
        "the API would speak plain HTTP on {0}: give it a TLS certificate (--tls-cert, --tls-key), or listen on loopback"
    )]
    PlainHttpExposed(SocketAddr),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("the development sign-in serves loopback only, not {0}")]
    DevSignInExposed(SocketAddr),
    #[error("OpenID Connect: {0}")]
    Oidc(String),
    #[error(transparent)]
    NodeCa(#[from] pki::CaError),
    #[error("agent gRPC TLS: {0}")]
    GrpcTls(String),
    #[error(transparent)]
    ElasticPolicy(#[from] allot_elastic::PolicyError),
    #[error("authorization policies: {0}")]
    Policies(#[from] allot_authz::AuthzError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Routes API events into the scheduling loop and the agents' streams.
struct Events {
    leadership: Arc<leadership::Leadership>,
    notify: Arc<Notify>,
    hub: Arc<Hub>,
    store: Store,
    /// Resizes a job's share (the API's, and the sizing of auto-sized jobs').
    resizer: Arc<resizing::Resizer>,
    /// Says which job's log grew, or which job ended.
    job_logs: tokio::sync::broadcast::Sender<String>,
    /// Asks for the leader's pass from a follower (`wakeups::announce_schedules`).
    wake_leader: Arc<Notify>,
}

impl ControlEvents for Events {
    fn job_submitted(&self) {
        if self.leadership.leads() {
            self.notify.notify_one();
        } else {
            self.wake_leader.notify_one();
        }
    }

    fn job_cancel_requested(&self, job: &Job) {
        let Some(node) = &job.node_id else {
            return;
        };
        if self.leadership.leads() {
            self.hub.send(node, hub::cancel(job));
        } else {
            wakeups::announce(
                &self.store,
                allot_store::Wakeup::Cancel {
                    job: job.id.clone(),
                },
            );
        }
    }

    fn node_revoked(&self, node_id: &str) {
        self.hub.disconnect(
            node_id,
            tonic::Status::unauthenticated("the node's certificates were revoked"),
        );
        if !self.leadership.leads() {
            wakeups::announce(
                &self.store,
                allot_store::Wakeup::Revoke {
                    node: node_id.to_owned(),
                },
            );
        }
    }

    fn job_logs(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.job_logs.subscribe()
    }

    fn not_ready(&self) -> Option<String> {
        self.leadership.conflict()
    }

    fn resize_job(
        &self,
        ctx: allot_domain::AuditContext,
        job: Job,
        share: allot_domain::Share,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Job, allot_api::ApiError>> + Send + '_>> {
        use allot_api::ApiError;
        Box::pin(async move {
            // Checked against placements under the scheduling passes' lock, which only the
            // leader holds, and written through its term's fence: another replica (or a
            // leader whose term ended meanwhile) sends the client there.
            let Some(fenced) = self.leadership.fenced() else {
                return Err(ApiError::Unavailable(
                    "resizes are decided by the leading replica; retry (through the load \
                     balancer) until it answers"
                        .into(),
                ));
            };
            match self
                .resizer
                .resize(&fenced, &ctx, &job.id, &[(share, None)])
                .await
            {
                Ok((job, _)) => Ok(job),
                Err(e @ (resizing::Refused::NotHolding(_) | resizing::Refused::NoRoom(_))) => {
                    Err(ApiError::Conflict(e.to_string()))
                }
                Err(resizing::Refused::Store(e)) => Err(e.into()),
            }
        })
    }
}

/// A started control plane.
pub struct RunningServer {
    pub http_addr: SocketAddr,
    /// Whether the API speaks HTTPS.
    pub https: bool,
    /// Where `/metrics` is served, when it is.
    pub metrics_addr: Option<SocketAddr>,
    pub grpc_addr: SocketAddr,
    /// The CA certificate (PEM) agents trust, and whose node certificates they present.
    pub node_ca_pem: String,
    pub store: Store,
    /// Set when this start created the first admin token; shown once.
    pub bootstrap_admin_token: Option<String>,
    /// Whether this replica leads.
    pub leadership: Arc<leadership::Leadership>,
    stop: CancellationToken,
    hub: Arc<Hub>,
    http: actix_web::dev::ServerHandle,
    metrics_http: Option<actix_web::dev::ServerHandle>,
    /// What ends on `stop`: the gRPC server, the campaign with its leader work, the
    /// wake-ups, and the heartbeat batcher once the gRPC server dropped its handle.
    loops: Vec<JoinHandle<()>>,
    /// What ends once the HTTP servers stopped: the servers themselves and the batchers
    /// their requests feed.
    http_tasks: Vec<JoinHandle<()>>,
}

impl RunningServer {
    pub fn http_url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.http_addr)
    }

    /// The agents' endpoint (TLS; the server certificate names the loopback addresses).
    pub fn grpc_url(&self) -> String {
        format!("https://{}", self.grpc_addr)
    }

    /// Stops the loops (a leader gives its lease up, signs a last checkpoint and saves its
    /// fair-share history), then stops accepting and finishes in-flight requests, then
    /// closes the database. Connected agents get their streams closed; any call still open
    /// after [`SHUTDOWN_GRACE`] is dropped.
    ///
    /// The loops stop first, while every HTTP worker still runs: a pooled database
    /// connection that a worker opened lives on that worker's runtime and dies with it, so
    /// a leader stopped after its workers could not give its lease up (the next leader then
    /// waited a whole lease).
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.hub.close_all();
        join_within_grace(self.loops).await;
        self.http.stop(true).await;
        if let Some(m) = &self.metrics_http {
            m.stop(true).await;
        }
        join_within_grace(self.http_tasks).await;
        if let Err(e) = self.store.close().await {
            tracing::warn!(error = %e, "closing the database");
        }
    }
}

/// Waits for each task up to [`SHUTDOWN_GRACE`], aborting one that takes longer.
async fn join_within_grace(tasks: Vec<JoinHandle<()>>) {
    for mut t in tasks {
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut t).await.is_err() {
            tracing::warn!("a server task did not stop in time; aborting it");
            t.abort();
        }
    }
}

/// actix middleware: every request in an `http.request` span named by its method and route
/// (exported when tracing is on), with the trace id in the span's fields for the logs.
async fn trace_requests(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    use tracing::Instrument;
    let route = req
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let span = tracing::info_span!(
        "http.request",
        otel.name = %format!("{} {route}", req.method()),
        otel.kind = "server",
        http.request.method = %req.method(),
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    if let Some(id) = allot_telemetry::trace_id(&span) {
        span.record("trace_id", id);
    }
    let res = next.call(req).instrument(span.clone()).await?;
    span.record("http.response.status_code", res.status().as_u16());
    Ok(res)
}

/// actix middleware: counts every API request by method, route pattern and status.
async fn count_requests(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    let started = std::time::Instant::now();
    let metrics = req.app_data::<web::Data<Arc<metrics::Metrics>>>().cloned();
    let method = req.method().to_string();
    let res = next.call(req).await?;
    if let Some(m) = metrics {
        let route = res.request().match_pattern();
        m.http_request(
            &method,
            route.as_deref(),
            res.status().as_u16(),
            started.elapsed(),
        );
    }
    Ok(res)
}

/// Serves `/metrics` on `addr`: its bound address, its handle and its task.
async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<metrics::Metrics>,
    store: Store,
) -> Result<(SocketAddr, actix_web::dev::ServerHandle, JoinHandle<()>), ServerError> {
    let listener = std::net::TcpListener::bind(addr).map_err(|source| ServerError::Bind {
        what: "metrics",
        addr,
        source,
    })?;
    let bound = listener.local_addr()?;
    let server = HttpServer::new(move || {
        let (metrics, store) = (metrics.clone(), store.clone());
        App::new().route(
            "/metrics",
            web::get().to(move || {
                let (metrics, store) = (metrics.clone(), store.clone());
                async move {
                    match metrics.render(&store).await {
                        Ok(text) => actix_web::HttpResponse::Ok()
                            .content_type(metrics::CONTENT_TYPE)
                            .body(text),
                        Err(e) => {
                            tracing::error!(error = %e, "rendering metrics");
                            actix_web::HttpResponse::ServiceUnavailable().finish()
                        }
                    }
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(2)
    .listen(listener)?
    .run();
    let handle = server.handle();
    let task = tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok((bound, handle, task))
}

/// Creates an admin token when none exists yet, returning its secret.
pub async fn bootstrap_admin(store: &Store) -> Result<Option<String>, StoreError> {
    if store.count_admin_tokens().await? > 0 {
        return Ok(None);
    }
    Ok(Some(
        create_admin_token(store, &AuditContext::system("bootstrap"), "bootstrap-admin").await?,
    ))
}

/// Creates a platform admin token and returns its secret.
pub async fn create_admin_token(
    store: &Store,
    ctx: &AuditContext,
    name: &str,
) -> Result<String, StoreError> {
    let secret = secret::generate(allot_api::TOKEN_PREFIX);
    store
        .create_token(
            ctx,
            NewToken {
                name: name.to_owned(),
                tenant_id: None,
                role: Role::Admin,
                secret_hash: secret::hash(&secret),
                expires_at: None,
            },
        )
        .await?;
    Ok(secret)
}

/// Connects the database (migrating it), binds both ports, and starts serving.
pub async fn start(
    config: ServerConfig,
    clock: Arc<dyn Clock>,
) -> Result<RunningServer, ServerError> {
    allot_api::crypto::install_crypto_provider();
    // Refuse to start on policies that do not parse or validate against their schema.
    let policies = Arc::new(match &config.policy_dir {
        Some(dir) => allot_authz::Policies::from_dir(dir)?,
        None => allot_authz::Policies::builtin()?,
    });
    // The elastic share policy too: the one given, else `elastic.toml` in the policy
    // directory, else the shipped one.
    let elastic_file = config.elastic_policy.clone().or_else(|| {
        config
            .policy_dir
            .as_ref()
            .map(|d| d.join("elastic.toml"))
            .filter(|p| p.exists())
    });
    let elastic_policy = match elastic_file {
        Some(path) => allot_elastic::ElasticPolicy::parse(&std::fs::read_to_string(&path)?)?,
        None => allot_elastic::ElasticPolicy::builtin()?,
    };
    let elastic = (config.elastic || config.elastic_policy.is_some())
        .then(|| Arc::new(elastic::ElasticShares::new(elastic_policy)));
    let keys = Arc::new(if config.audit_key.trim().is_empty() {
        allot_audit::SigningKeys::single(allot_audit::Signer::generate_system(
            &config.audit_origin,
        )?)
    } else {
        allot_audit::SigningKeys::parse(&config.audit_key)?
    });
    // Refuse to start without a key in force, rather than fail every checkpoint later.
    keys.active(clock.now())?;
    // Each term of leadership schedules with a scheduler of its own, which takes up the
    // fair-share history the last leader saved; one is built now to refuse a bad policy.
    let make_scheduler = {
        let policy = config.placement_policy.clone();
        let seed = config.scheduler_seed;
        let engine = EngineConfig {
            min_runtime_secs: i64::try_from(config.min_runtime.as_secs()).unwrap_or(i64::MAX),
            gpu_limits: config.gpu_limits,
        };
        // Two missed heartbeats and a half: probably gone, though the lease still stands.
        let suspect_after = config.heartbeat_interval.mul_f64(2.5);
        let lease = config.lease;
        let half_life = config.fair_share_half_life;
        move || -> Result<LiveScheduler, allot_scheduler::LiveError> {
            let scheduler =
                LiveScheduler::new(&policy, seed, engine)?.with_suspect_after(suspect_after, lease);
            Ok(match half_life {
                Some(h) => scheduler.with_fair_share_half_life(h),
                None => scheduler,
            })
        }
    };
    make_scheduler()?;
    let mut store = Store::connect(&config.database_url, clock.clone()).await?;
    if !config.secrets_key.trim().is_empty() {
        store = store.with_secret_keys(allot_store::SecretKeys::parse(&config.secrets_key)?);
    }
    let http_listener =
        std::net::TcpListener::bind(config.http_listen).map_err(|source| ServerError::Bind {
            what: "HTTP API",
            addr: config.http_listen,
            source,
        })?;
    let http_addr = http_listener.local_addr()?;
    if config.dev_sign_in && !http_addr.ip().is_loopback() {
        return Err(ServerError::DevSignInExposed(http_addr));
    }
    let https = config.tls.is_some();
    let tls_config = match &config.tls {
        Some(id) => Some(tls::server_config(id)?),
        None if http_addr.ip().is_loopback() => None,
        None => return Err(ServerError::PlainHttpExposed(http_addr)),
    };
    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_listen)
        .await
        .map_err(|source| ServerError::Bind {
            what: "agent gRPC",
            addr: config.grpc_listen,
            source,
        })?;
    let grpc_addr = grpc_listener.local_addr()?;
    let ca = Arc::new(pki::load_or_create(&config.node_ca, clock.now())?);
    let mut grpc_names = config.grpc_names.clone();
    if !grpc_addr.ip().is_unspecified() {
        grpc_names.push(grpc_addr.ip().to_string());
    }
    grpc_names.sort();
    grpc_names.dedup();
    let grpc_tls = pki::grpc_tls(&ca, &grpc_names, clock.now())?;

    // A replica that leads from the start bootstraps a first start, before it serves
    // (`/readyz` answering means the admin token of a first start exists).
    let grpc_advertise = config
        .grpc_advertise
        .clone()
        .unwrap_or_else(|| format!("https://{grpc_addr}"));
    let first_term = leadership::acquire(
        &store,
        &config.replica_name,
        &config.replica_instance,
        &grpc_advertise,
        config.leader_lease,
    )
    .await;
    let bootstrap_admin_token = match &first_term {
        Some(term) => bootstrap_admin(&store.fenced(term)).await?,
        None => None,
    };

    let stop = CancellationToken::new();
    let notify = Arc::new(Notify::new());
    let turn = Arc::new(tokio::sync::Mutex::new(()));
    let hub = Arc::new(Hub::default());
    let resizer = Arc::new(resizing::Resizer {
        hub: hub.clone(),
        turn: turn.clone(),
        notify: notify.clone(),
        gpu_limits: config.gpu_limits,
    });
    // Never windows shorter than the agents' samples (one a heartbeat) allow.
    let sizing = Arc::new(sizing::Sizing::new(
        allot_sizing::Policy::default()
            .compressed(config.sizing_time_scale)
            .sampled_every(config.heartbeat_interval),
        config.sizing_rules,
    ));
    let pacing = Arc::new(pacing::Pacing::new(
        config.heartbeat_interval,
        config.lease,
        config.max_heartbeats_per_sec,
    ));
    let leadership = Arc::new(leadership::Leadership::default());
    let (audit_batcher, batcher_task) = allot_store::AuditBatcher::start(store.clone(), 512);
    let (submits, submits_task) = allot_store::SubmitBatcher::start(store.clone(), 256);
    let (tokens, tokens_task) = allot_store::TokenReader::start(store.clone(), 256);
    let (beats, beats_task) = {
        let leadership = leadership.clone();
        allot_store::BeatBatcher::start(move || leadership.fenced(), 512)
    };
    let (job_logs, _) = tokio::sync::broadcast::channel(1024);
    let wake_leader = Arc::new(Notify::new());
    let state = AppState {
        audit_batcher,
        submits,
        tokens,
        admission: Arc::new(allot_api::admission::Admission::new(store.clone())),
        tenant_trees: Arc::default(),
        audit_keys: keys.clone(),
        audit_origin: config.audit_origin.clone(),
        policies,
        jwt: match config.oidc.clone() {
            Some(oidc) => Some(Arc::new(
                allot_api::jwt::JwtVerifier::new(oidc, clock.clone()).map_err(ServerError::Oidc)?,
            )),
            None => None,
        },
        web_sign_in: match config.web_sign_in.clone() {
            Some(mut c) => {
                // By default the provider sends browsers back to the address bound here.
                c.redirect_url
                    .get_or_insert_with(|| format!("http://{http_addr}/auth/callback"));
                Some(Arc::new(
                    allot_api::signin::WebSignIn::new(c, clock.clone())
                        .map_err(ServerError::Oidc)?,
                ))
            }
            None => None,
        },
        sessions: config.sessions,
        dev_sign_in: config.dev_sign_in,
        auth_failures: Arc::new(allot_api::limiter::FailureLimiter::new(
            config.auth_max_failures,
            config.auth_failure_window,
            store.clone(),
        )),
        trusted_proxies: config.trusted_proxies.clone(),
        store: store.clone(),
        events: Arc::new(Events {
            leadership: leadership.clone(),
            notify: notify.clone(),
            hub: hub.clone(),
            store: store.clone(),
            resizer: resizer.clone(),
            job_logs: job_logs.clone(),
            wake_leader: wake_leader.clone(),
        }),
    };
    let body_limit = BodyLimit(config.body_limit);
    let metrics = Arc::new(metrics::Metrics::new());
    let (metrics_addr, metrics_http, metrics_task) = match config.metrics_listen {
        Some(addr) => {
            let (addr, handle, task) = serve_metrics(addr, metrics.clone(), store.clone()).await?;
            (Some(addr), Some(handle), Some(task))
        }
        None => (None, None, None),
    };
    let counted = metrics.clone();
    let grpc_audit = state.audit_batcher.clone();
    let http = HttpServer::new(move || {
        App::new()
            .wrap(actix_web::middleware::from_fn(allot_api::record_denials))
            .wrap(actix_web::middleware::from_fn(count_requests))
            .wrap(actix_web::middleware::from_fn(trace_requests))
            .app_data(web::Data::new(counted.clone()))
            .app_data(web::Data::new(state.clone()))
            .app_data(body_limit)
            .configure(allot_api::configure)
            .configure(allot_portal::configure)
    })
    .workers(2)
    .disable_signals()
    .shutdown_timeout(5);
    let http = match tls_config {
        Some(tls) => http.listen_rustls_0_23(http_listener, tls)?,
        None => http.listen(http_listener)?,
    }
    .run();
    let http_handle = http.handle();
    // The batchers drain and end once the HTTP server has dropped their last handles.
    let mut http_tasks: Vec<JoinHandle<()>> = metrics_task.into_iter().collect();
    http_tasks.extend([
        batcher_task,
        submits_task,
        tokens_task,
        tokio::spawn(async move {
            if let Err(e) = http.await {
                tracing::error!(error = %e, "HTTP server stopped");
            }
        }),
    ]);

    let svc = grpc::NodeSvc {
        leadership: leadership.clone(),
        store: store.clone(),
        hub: hub.clone(),
        notify: notify.clone(),
        ca: ca.clone(),
        node_cert_ttl: config.node_cert_ttl,
        pacing: pacing.clone(),
        outage_tolerance: config.outage_tolerance,
        samples: grpc::SampleClock::default(),
        auth_failures: Arc::new(allot_api::limiter::FailureLimiter::new(
            config.auth_max_failures,
            config.auth_failure_window,
            store.clone(),
        )),
        audit: grpc_audit,
        beats,
        job_logs,
        metrics: metrics.clone(),
        limits: grpc::NodeLimits::default(),
        sizing: sizing.clone(),
    };
    let mut grpc_server = tonic::transport::Server::builder()
        // A connection that stopped answering is closed within seconds, and its assignment
        // stream with it: the node's agent, reconnecting, may open its one stream again.
        .http2_keepalive_interval(Some(Duration::from_secs(2)))
        .http2_keepalive_timeout(Some(Duration::from_secs(3)))
        .tls_config(grpc_tls)
        .map_err(|e| ServerError::GrpcTls(e.to_string()))?;
    let grpc_stop = stop.clone();
    let mut loops = vec![tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc_listener);
        let result = grpc_server
            .add_service(allot_proto::NodeServiceServer::new(svc))
            .serve_with_incoming_shutdown(incoming, grpc_stop.cancelled_owned())
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    })];

    let leader_work: leadership::LeaderWork = {
        let hub = hub.clone();
        let sizing = sizing.clone();
        let resizer = resizer.clone();
        let pacing = pacing.clone();
        let notify = notify.clone();
        let metrics = metrics.clone();
        let schedule_interval = config.schedule_interval;
        let outage_tolerance = config.outage_tolerance;
        let checkpoint_interval = config.checkpoint_interval;
        let origin = config.audit_origin.clone();
        let sink = config.checkpoint_dir.clone().map(|dir| {
            Arc::new(checkpoints::DirSink { dir }) as Arc<dyn checkpoints::CheckpointSink>
        });
        let keep = config
            .audit_retention
            .and_then(|d| chrono::Duration::from_std(d).ok());
        Box::new(move |store: Fenced, stop: CancellationToken| {
            let mut tasks = vec![tokio::spawn(
                pacing.clone().count(Store::clone(&store), stop.clone()),
            )];
            match make_scheduler() {
                Ok(scheduler) => tasks.push(tokio::spawn(scheduling::run(
                    store.clone(),
                    hub.clone(),
                    scheduler,
                    // Nodes are judged lost from the moment this term began at the
                    // earliest: a leader taking office (or its database back) gives every
                    // node a fresh tolerance first.
                    scheduling::NodeLoss {
                        since: store.clock().now(),
                        outage_tolerance,
                    },
                    sizing.clone(),
                    elastic.clone(),
                    turn.clone(),
                    notify.clone(),
                    schedule_interval,
                    metrics.clone(),
                    stop.clone(),
                ))),
                Err(e) => tracing::error!(error = %e, "no scheduler; nothing is scheduled"),
            }
            tasks.push(tokio::spawn(sizing::run(
                sizing.clone(),
                resizer.clone(),
                store.clone(),
                stop.clone(),
            )));
            let checkpointer = checkpoints::Checkpointer {
                store: Store::clone(&store),
                keys: keys.clone(),
                origin: origin.clone(),
                sink: sink.clone(),
            };
            let retention = keep.map(|keep| checkpoints::Retention {
                store: Store::clone(&store),
                keep,
            });
            tasks.push(tokio::spawn(checkpointer.run(
                checkpoint_interval,
                retention,
                stop,
            )));
            tasks
        })
    };
    let campaign = leadership::Campaign {
        store: store.clone(),
        replica: config.replica_name.clone(),
        instance: config.replica_instance.clone(),
        started: store.clock().now(),
        address: grpc_advertise,
        ttl: config.leader_lease,
        hub: hub.clone(),
        leadership: leadership.clone(),
        metrics: metrics.clone(),
        work: leader_work,
        pacing: pacing.clone(),
        grace: SHUTDOWN_GRACE / 2,
        fencing: leadership::fencing(),
    };
    loops.push(tokio::spawn(campaign.run(first_term, stop.clone())));
    // Work taken by a follower reaches the leader at once.
    loops.push(tokio::spawn(wakeups::announce_schedules(
        store.clone(),
        wake_leader,
        stop.clone(),
    )));
    loops.push(tokio::spawn(
        wakeups::Router {
            store: store.clone(),
            leadership: leadership.clone(),
            notify: notify.clone(),
            hub: hub.clone(),
        }
        .run(stop.clone()),
    ));
    // Last: it drains and ends once the gRPC server has dropped its handle.
    loops.push(beats_task);

    tracing::info!(%http_addr, %grpc_addr, backend = store.backend_name(), "control plane started");
    Ok(RunningServer {
        http_addr,
        https,
        metrics_addr,
        grpc_addr,
        node_ca_pem: ca.cert_pem().to_owned(),
        store,
        bootstrap_admin_token,
        leadership,
        stop,
        hub,
        http: http_handle,
        metrics_http,
        loops,
        http_tasks,
    })
}
