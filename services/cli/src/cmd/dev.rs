//! `allot dev`: the whole system in one process on an embedded SQLite database, with
//! simulated GPU nodes connected over real gRPC on loopback.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_agent::AgentConfig;
use allot_agent::gpu::SimBackend;
use allot_domain::{BindingSubject, Role, RoleBinding, SystemClock};
use allot_server::ServerConfig;
use allot_store::TokenRepo;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::cmd::{read_secret, write_secret};

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Where the database, the admin token and job logs live; kept across restarts.
    #[arg(long, default_value = ".allot")]
    data_dir: PathBuf,
    /// HTTP API address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Agent gRPC address (a free port when 0).
    #[arg(long, default_value = "127.0.0.1:0")]
    grpc_listen: SocketAddr,
    /// Also serve Prometheus metrics at `/metrics` here, e.g. 127.0.0.1:9464.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Number of simulated nodes.
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    /// Failed authentication attempts one address may make per minute before its failures
    /// are answered 429 (valid credentials are always served).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    auth_max_failures_per_minute: u32,
    /// GPUs on each simulated node, e.g. 4xH200 or 2xH200,1xT4 (`:mig` puts them in MIG
    /// mode, `:nvlink=4` makes NVLink islands of four). Layouts separated by `;` go to the
    /// nodes in turn, the last to the rest: `--nodes 3 --sim-gpus '8xH200;8xH200:mig'`
    /// makes one node of whole GPUs and two in MIG mode.
    #[arg(long, default_value = "4xH200")]
    sim_gpus: String,
    /// What runs the nodes' jobs: `process` (the default: unconfined, no root needed) or
    /// `oci` (confined containers from images; needs root and runc).
    #[arg(long = "runtime", value_enum, default_value_t = crate::cmd::agent::RuntimeKindArg::Process)]
    runtime: crate::cmd::agent::RuntimeKindArg,
    /// A registry the nodes pull images from over plain HTTP, HOST:PORT (repeatable).
    #[arg(long = "insecure-registry")]
    insecure_registries: Vec<String>,
    #[command(flatten)]
    audit: crate::cmd::server::AuditArgs,
    #[command(flatten)]
    secrets: crate::cmd::server::SecretsArgs,
    #[command(flatten)]
    scheduler: crate::cmd::server::SchedulerArgs,
}

/// The admin token to show: the one from an earlier run if it still works, else a new one.
async fn admin_token(
    server: &allot_server::RunningServer,
    path: &std::path::Path,
) -> anyhow::Result<String> {
    if let Some(t) = &server.bootstrap_admin_token {
        return Ok(t.clone());
    }
    if let Some(existing) = read_secret(path) {
        let found = server
            .store
            .use_token(&allot_api::secret::hash(&existing))
            .await?;
        if found.is_some_and(|(t, _)| t.is_usable(server.store.clock().now())) {
            return Ok(existing);
        }
    }
    let ctx = allot_domain::AuditContext::system("allot-dev");
    Ok(allot_server::create_admin_token(&server.store, &ctx, "dev-admin").await?)
}

/// The people of the development sign-in page, and their roles (created once).
const DEV_USERS: [(&str, &str, Role); 2] = [
    ("dev-admin", "Dev Admin", Role::Admin),
    ("dev-auditor", "Dev Auditor", Role::Auditor),
];

async fn seed_dev_users(store: &allot_store::Store) -> anyhow::Result<()> {
    use allot_store::{IdentityRepo, NewBinding, SignIn};
    let ctx = allot_domain::AuditContext::system("allot-dev");
    for (subject, name, role) in DEV_USERS {
        let user = store
            .sign_in(SignIn {
                issuer: allot_api::signin::DEV_ISSUER.to_owned(),
                subject: subject.to_owned(),
                email: Some(format!("{subject}@allot.dev")),
                name: Some(name.to_owned()),
            })
            .await?;
        let binding = RoleBinding::platform(role);
        if !store.roles_of(&user.id, &[]).await?.contains(&binding) {
            store
                .create_binding(
                    &ctx,
                    NewBinding {
                        subject: BindingSubject::User { user_id: user.id },
                        role,
                        tenant_id: None,
                    },
                )
                .await?;
        }
    }
    Ok(())
}

/// Node `i`'s (from 1) GPU layout of `--sim-gpus`: its `;`-separated layouts in turn, the
/// last for every node after.
fn node_layout(sim_gpus: &str, i: u32) -> &str {
    let layouts: Vec<&str> = sim_gpus.split(';').collect();
    let at = usize::try_from(i.saturating_sub(1)).unwrap_or(usize::MAX);
    layouts
        .get(at)
        .or(layouts.last())
        .copied()
        .unwrap_or(sim_gpus)
        .trim()
}

pub async fn run(mut args: DevArgs) -> anyhow::Result<()> {
    // Absolute from here on: jobs run in their own directories, and every path the agent
    // hands them (the simulated GPUs' state, their home, their job dir) must mean the same
    // there.
    args.data_dir = std::path::absolute(&args.data_dir)
        .with_context(|| format!("--data-dir {}", args.data_dir.display()))?;
    if args.nodes > 64 {
        anyhow::bail!("--nodes must be at most 64");
    }
    // Validate the GPU layouts before anything starts.
    for layout in args.sim_gpus.split(';') {
        SimBackend::from_spec(layout, "check")
            .with_context(|| format!("--sim-gpus {}: `{layout}`", args.sim_gpus))?;
    }
    // The containers' users pass through the data dir (and `nodes/`) to their images,
    // listing nothing; each agent keeps its own directory below `nodes/`.
    let containers = args.runtime == crate::cmd::agent::RuntimeKindArg::Oci;
    let nodes = args.data_dir.join("nodes");
    let descend = |p: &std::path::Path| {
        if p.parent() == Some(nodes.as_path()) || (containers && p == nodes) {
            allot_pki::Descend::Leave
        } else {
            allot_pki::Descend::All
        }
    };
    let mode = if containers { 0o711 } else { 0o700 };
    crate::cmd::data_dir::secure(&args.data_dir, mode, &descend)?;
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(&nodes)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })
        .with_context(|| format!("creating {}", nodes.display()))?;
    if containers {
        std::fs::set_permissions(&nodes, std::fs::Permissions::from_mode(0o711))?;
        // Said now, not as every job's "permission denied" later.
        allot_agent::runtime::oci::check_traversable(&nodes)
            .map_err(|e| anyhow::anyhow!("--runtime oci: {e}"))?;
    }
    let database_url = crate::cmd::server::sqlite_url(&args.data_dir);
    let mut config = ServerConfig::new(database_url);
    config.node_ca = allot_server::pki::NodeCaSource::Dir(args.data_dir.join("pki"));
    config.http_listen = args.listen;
    config.grpc_listen = args.grpc_listen;
    config.metrics_listen = args.metrics_listen;
    config.heartbeat_interval = Duration::from_secs(2);
    config.auth_max_failures = args.auth_max_failures_per_minute;
    // Password-free sign-in as a seeded user: on loopback only.
    config.dev_sign_in = args.listen.ip().is_loopback();
    let dev_sign_in = config.dev_sign_in;
    args.audit.apply(&args.data_dir, &mut config)?;
    args.secrets.apply(&args.data_dir, &mut config)?;
    args.scheduler.apply(&mut config);
    let server = allot_server::start(config, Arc::new(SystemClock)).await?;

    let token_path = args.data_dir.join("admin.token");
    let token = admin_token(&server, &token_path).await?;
    write_secret(&token_path, &token)?;
    if dev_sign_in {
        seed_dev_users(&server.store).await?;
    }

    let runtime = crate::cmd::agent::RuntimeArgs {
        kind: args.runtime,
        allow_unconfined_jobs: false,
        oci_runtime: None,
        cdi_dirs: Vec::new(),
        insecure_registries: args.insecure_registries.clone(),
        registry_ca: None,
        image_cache_size: 20 << 30,
        image_max_size: None,
        image_tenant_share: None,
        scratch_size: 1 << 30,
        tmp_size: 1 << 30,
        pids_limit: 4096,
        jobs_pids_limit: None,
        system_reserved_memory: allot_agent::runtime::oci::DEFAULT_SYSTEM_RESERVED_MEMORY,
        job_subnets: allot_agent::runtime::oci::network::plan::DEFAULT_POOL.parse()?,
    }
    .choice(&[server.grpc_url()])?;
    if matches!(runtime, allot_agent::RuntimeChoice::Oci(_)) {
        // The containers' user namespaces pass through the data dir to their own roots;
        // what is secret in it keeps its own mode.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&args.data_dir, std::fs::Permissions::from_mode(0o711))?;
        std::fs::create_dir_all(args.data_dir.join("nodes"))?;
        std::fs::set_permissions(
            args.data_dir.join("nodes"),
            std::fs::Permissions::from_mode(0o711),
        )?;
    }
    let stop = CancellationToken::new();
    let mut agents = Vec::new();
    for i in 1..=args.nodes {
        let name = format!("dev-node-{i}");
        let layout = node_layout(&args.sim_gpus, i);
        let node_dir = args.data_dir.join("nodes").join(&name);
        // `touch <node dir>/sim-faults/xid-<gpu>-<code>` injects an XID.
        // Jobs loading the fake CUDA driver share each simulated GPU through `sim-gpus/`.
        let state = node_dir.join("sim-gpus");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&state)?;
        let backend = SimBackend::from_spec(layout, &name)?
            .with_fault_dir(node_dir.join("sim-faults"))
            .with_state_dir(state);
        // Each embedded agent joins as an operator's would: with a one-time token the first
        // time, with the certificate it then keeps in its directory after that. Other
        // simulated GPUs than last time are an inventory only a token approves (a
        // certificate's holder never adds GPUs): the node joins with a new one then.
        let spec_file = node_dir.join("sim-gpus.spec");
        let same_gpus = std::fs::read_to_string(&spec_file).is_ok_and(|s| s == layout);
        if !same_gpus {
            let _ = std::fs::remove_dir_all(node_dir.join("identity"));
            allot_pki::write_private(&spec_file, layout)?;
        }
        let bootstrap_token = if allot_agent::identity::load(&node_dir, &name)?.is_some() {
            None
        } else {
            let (token, _) = allot_api::issue_bootstrap_token(
                &server.store,
                &allot_domain::AuditContext::system("allot-dev"),
                &format!("allot dev: {name}"),
                // Its own node: one whose directory was wiped takes its name back.
                allot_api::TokenFor {
                    node_name: &name,
                    replace: true,
                },
                allot_api::DEFAULT_BOOTSTRAP_TTL,
            )
            .await?;
            Some(token)
        };
        let cfg = AgentConfig {
            servers: vec![server.grpc_url()],
            ca_cert_pem: server.node_ca_pem.clone(),
            bootstrap_token,
            node_name: name.clone(),
            data_dir: node_dir,
            stop_grace: Duration::from_secs(5),
            offer: {
                let host = allot_agent::NodeResources::detect();
                allot_agent::NodeResources {
                    memory_bytes: host
                        .memory_bytes
                        .saturating_sub(allot_agent::runtime::oci::DEFAULT_SYSTEM_RESERVED_MEMORY),
                    ..host
                }
            },
            metrics_listen: None,
            sharing: allot_agent::sharing::SharingConfig {
                shim_library: allot_agent::sharing::SharingConfig::discover_shim(),
                ..Default::default()
            },
            runtime: runtime.clone(),
            address: String::new(),
            job_log_tail: allot_agent::DEFAULT_JOB_LOG_TAIL,
            min_free_disk_bytes: 0,
        };
        agents.push(tokio::spawn(allot_agent::run(
            cfg,
            Arc::new(backend),
            stop.clone(),
        )));
    }

    // Watched before the banner says the cluster runs.
    let stopped = crate::shutdown_signal();
    let url = server.http_url();
    // One write, whose failure is ignored: a closed stdout (`allot dev | head`) must not take
    // the cluster down with it.
    let token_file = token_path.display();
    let banner = format!(
        "Allot dev cluster is running.

  API:          {url}
  Sign in:      {sign_in}
  Admin token:  {token}
                (also in {token_file})
  Nodes:        {nodes} simulated, {gpus}
  Data:         {data}
  Logs:         warnings and errors (ALLOT_LOG=info allot dev for more)

Try, in another terminal:
  export ALLOT_SERVER={url} ALLOT_TOKEN=$(cat {token_file})
  allot tenant create demo --guaranteed-gpus 2 --max-gpus 4
  allot job submit --tenant demo --wait -- sh -c 'echo hello from $CUDA_VISIBLE_DEVICES'

Press Ctrl-C to stop.
",
        sign_in = if dev_sign_in {
            format!("{url}/auth/dev (pick a seeded user)")
        } else {
            "not on a non-loopback address: use the admin token".to_owned()
        },
        nodes = args.nodes,
        gpus = if args.sim_gpus.contains(';') {
            format!("{} (node by node, the last for the rest)", args.sim_gpus)
        } else {
            format!("{} each", args.sim_gpus)
        },
        data = args.data_dir.display(),
    );
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
    drop(out);

    stopped.await;
    eprintln!("shutting down: stopping jobs and agents");
    stop.cancel();
    for a in agents {
        match a.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("agent stopped with an error: {e}"),
            Err(e) => eprintln!("agent task failed: {e}"),
        }
    }
    server.shutdown().await;
    eprintln!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn layouts_go_to_the_nodes_in_turn_the_last_to_the_rest() {
        let l = |spec, i| super::node_layout(spec, i);
        assert_eq!(l("4xH200", 1), "4xH200");
        assert_eq!(l("4xH200", 3), "4xH200");
        assert_eq!(l("8xH200; 8xH200:mig", 1), "8xH200");
        assert_eq!(l("8xH200; 8xH200:mig", 2), "8xH200:mig");
        assert_eq!(l("8xH200; 8xH200:mig", 5), "8xH200:mig");
    }
}
