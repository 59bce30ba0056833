use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_agent::gpu::{GpuBackend, NvmlBackend, SimBackend};
use allot_agent::{AgentConfig, NodeResources};
use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The control plane's gRPC endpoint (mutual TLS): one, or each replica's,
    /// comma-separated (the agent follows the leader among them).
    #[arg(
        long,
        env = "ALLOT_AGENT_SERVER",
        default_value = "https://127.0.0.1:7070"
    )]
    server: String,
    /// The control plane's node CA certificate (its <data-dir>/pki/ca.pem).
    #[arg(long, env = "ALLOT_NODE_CA")]
    ca_cert: PathBuf,
    /// A one-time bootstrap token (`allot node bootstrap-token create`), needed until the
    /// node has its certificate (kept in <data-dir>/identity/ and renewed automatically).
    #[arg(long, env = "ALLOT_BOOTSTRAP_TOKEN", hide_env_values = true)]
    bootstrap_token: Option<String>,
    /// Node name; the host name when absent.
    #[arg(long, env = "ALLOT_NODE_NAME")]
    name: Option<String>,
    /// Where other nodes reach this one (an IP address or DNS name): where the replicas of
    /// a multi-node job whose first replica runs here meet (their MASTER_ADDR). Default:
    /// this machine's address on its route to the control plane.
    #[arg(long, env = "ALLOT_ADVERTISE_ADDRESS")]
    advertise_address: Option<String>,
    /// Where GPUs come from: `nvml` (this machine's, through the NVIDIA driver), `sim`
    /// (simulated, see --sim-gpus), or `auto` (NVML when the driver loads, else simulated).
    #[arg(long, env = "ALLOT_GPU_BACKEND", value_enum, default_value_t = BackendChoice::Auto)]
    gpu_backend: BackendChoice,
    /// Simulated GPUs, e.g. 8xH200 or 2xH200,1xT4.
    #[arg(long, default_value = "8xH200")]
    sim_gpus: String,
    /// Job directories and logs.
    #[arg(long, env = "ALLOT_AGENT_DATA_DIR", default_value = ".allot-agent")]
    data_dir: PathBuf,
    /// How much of the end of each attempt's log this node keeps beside its first MiB, at
    /// least 4MiB: the middle of a longer log is freed as it grows (the control plane keeps
    /// each attempt's first MiB and last 4 MiB).
    #[arg(long, default_value = "64MiB", value_parser = allot_domain::parse_memory)]
    job_log_tail: u64,
    /// Seconds a stopped job gets between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 10)]
    stop_grace_secs: u64,
    /// CPUs offered to jobs, e.g. 60 (default: all of this machine's).
    #[arg(long, env = "ALLOT_AGENT_CPUS", value_parser = crate::cmd::parse_milli)]
    cpus: Option<u64>,
    /// Memory offered to jobs, e.g. 480GiB (default: all of this machine's).
    #[arg(long, env = "ALLOT_AGENT_MEMORY", value_parser = allot_domain::parse_memory)]
    memory: Option<u64>,
    /// Serve Prometheus metrics at `/metrics` here, e.g. 127.0.0.1:9465 (unauthenticated:
    /// keep it on loopback or an internal network). See docs/metrics.md.
    #[arg(long, env = "ALLOT_AGENT_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The GPU-sharing shim preloaded into jobs on shares of GPUs (default: liballot_shim.so
    /// next to this executable, else in /usr/lib/allot or /usr/local/lib/allot). On real
    /// GPUs a node without it refuses shared jobs rather than run them unenforced.
    #[arg(long, env = "ALLOT_SHIM_LIBRARY")]
    shim_library: Option<PathBuf>,
    /// GPU memory charged to a shared job for each process's CUDA context on each GPU.
    #[arg(long, default_value = "512MiB", value_parser = allot_domain::parse_memory)]
    shim_context_reserve: u64,
    /// Below this much free space on the data dir's file system (its logs, images and
    /// containers' roots), the node takes no new work and says why (`allot node get`);
    /// 0 turns the check off.
    #[arg(long, env = "ALLOT_MIN_FREE_DISK", default_value = "2GiB", value_parser = allot_domain::parse_memory)]
    min_free_disk: u64,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

/// How a node runs its jobs.
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// What runs jobs: `oci` (confined OCI containers through runc; needs root) or
    /// `process` (unconfined processes of the agent's user).
    #[arg(long = "runtime", env = "ALLOT_RUNTIME", value_enum, default_value_t = RuntimeKindArg::Oci)]
    pub kind: RuntimeKindArg,
    /// Accept unconfined jobs (`--runtime process`) on a node whose control plane is not on
    /// loopback: every job then runs as the agent's user, with its files and keys.
    #[arg(long)]
    pub allow_unconfined_jobs: bool,
    /// The OCI runtime binary (default: runc, else crun, on PATH).
    #[arg(long, env = "ALLOT_OCI_RUNTIME")]
    pub oci_runtime: Option<PathBuf>,
    /// Directories of CDI specs (repeatable; default /etc/cdi and /var/run/cdi), as
    /// `nvidia-ctk cdi generate` writes them.
    #[arg(long = "cdi-dir")]
    pub cdi_dirs: Vec<PathBuf>,
    /// A registry spoken to over plain HTTP, HOST:PORT (repeatable; loopback test
    /// registries).
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// CA certificates (PEM) trusted for registries, beside the system's.
    #[arg(long)]
    pub registry_ca: Option<PathBuf>,
    /// Size cap of the image cache (layers and unpacked images), held while images
    /// download and unpack.
    #[arg(long, default_value = "20GiB", value_parser = allot_domain::parse_memory)]
    pub image_cache_size: u64,
    /// Cap on one image: its layers and its unpacked root together (a decompression bomb
    /// stops there). Default: half the image cache.
    #[arg(long, value_parser = allot_domain::parse_memory)]
    pub image_max_size: Option<u64>,
    /// Cap on what one tenant's images take of the image cache. Default: three quarters
    /// of it.
    #[arg(long, value_parser = allot_domain::parse_memory)]
    pub image_tenant_share: Option<u64>,
    /// Size of each container's /scratch (tmpfs; counts against its memory limit).
    #[arg(long, default_value = "10GiB", value_parser = allot_domain::parse_memory)]
    pub scratch_size: u64,
    /// Size of each container's /tmp and of its /dev/shm.
    #[arg(long, default_value = "1GiB", value_parser = allot_domain::parse_memory)]
    pub tmp_size: u64,
    /// Processes and threads one container may have.
    #[arg(long, default_value_t = 4096)]
    pub pids_limit: i64,
    /// The IPv4 pool this agent takes its jobs' /24 from (one that no route or address of
    /// the host overlaps, nor another agent's on it).
    #[arg(long, env = "ALLOT_JOB_SUBNETS", default_value = allot_agent::runtime::oci::network::plan::DEFAULT_POOL)]
    pub job_subnets: ipnet::Ipv4Net,
    /// Processes and threads all containers together may have; below the kernel's pid_max
    /// (default: pid_max less an eighth of it, at least 1024, for the agent and the
    /// system).
    #[arg(long)]
    pub jobs_pids_limit: Option<i64>,
    /// Memory kept from the jobs for the agent and the system, as kubelet's
    /// system-reserved: every container's cgroup is below one limited to this machine's
    /// memory less it, and the memory offered to jobs is that much less by default.
    #[arg(long, default_value = "2GiB", value_parser = allot_domain::parse_memory)]
    pub system_reserved_memory: u64,
}

/// Whether `server` (a control-plane URL) is on loopback: its host, as a URL parser reads
/// it, is `localhost` or an address in 127.0.0.0/8 or `::1`. A name that only begins like
/// one (`127.0.0.1.example.net`, `localhost-cp.internal`) is a name anyone's DNS answers.
pub fn is_loopback_url(server: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(server) else {
        return false;
    };
    match url.host_str() {
        Some("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKindArg {
    Oci,
    Process,
}

impl RuntimeArgs {
    /// The runtime to configure, refusing unconfined jobs on a node that is not
    /// loopback-only unless the operator said so twice.
    pub fn choice(&self, servers: &[String]) -> anyhow::Result<allot_agent::RuntimeChoice> {
        match self.kind {
            RuntimeKindArg::Process => {
                let loopback = servers.iter().all(|server| is_loopback_url(server));
                if !loopback && !self.allow_unconfined_jobs {
                    anyhow::bail!(
                        "--runtime process runs every job unconfined, as this agent's user: on a \
                         node whose control plane is not on loopback, pass \
                         --allow-unconfined-jobs too"
                    );
                }
                Ok(allot_agent::RuntimeChoice::Process)
            }
            RuntimeKindArg::Oci => {
                let mut cfg =
                    allot_agent::runtime::oci::OciConfig::discover(self.oci_runtime.clone())
                        .map_err(|e| anyhow::anyhow!("--runtime oci: {e}"))?;
                if !self.cdi_dirs.is_empty() {
                    cfg.cdi_dirs = self.cdi_dirs.clone();
                }
                cfg.registries.insecure = self.insecure_registries.clone();
                if let Some(ca) = &self.registry_ca {
                    cfg.registries.ca_pem = Some(
                        std::fs::read_to_string(ca)
                            .with_context(|| format!("--registry-ca {}", ca.display()))?,
                    );
                }
                cfg.image_cache_bytes = self.image_cache_size;
                cfg.image_max_bytes = self.image_max_size;
                cfg.image_tenant_bytes = self.image_tenant_share;
                cfg.scratch_bytes = self.scratch_size;
                cfg.tmp_bytes = self.tmp_size;
                cfg.shm_bytes = self.tmp_size;
                cfg.pids_limit = self.pids_limit;
                anyhow::ensure!(
                    self.job_subnets.prefix_len()
                        <= allot_agent::runtime::oci::network::plan::SUBNET_PREFIX,
                    "--job-subnets {}: the pool must hold a /{} at least",
                    self.job_subnets,
                    allot_agent::runtime::oci::network::plan::SUBNET_PREFIX
                );
                cfg.job_subnets = self.job_subnets;
                cfg.jobs_pids_limit = self.jobs_pids_limit;
                cfg.system_reserved_memory = self.system_reserved_memory;
                Ok(allot_agent::RuntimeChoice::Oci(cfg))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BackendChoice {
    Auto,
    Nvml,
    Sim,
}

fn sim(args: &AgentArgs, name: &str) -> anyhow::Result<Arc<dyn GpuBackend>> {
    // Jobs that load the fake CUDA driver share the simulated GPUs through this directory.
    let state = args.data_dir.join("sim-gpus");
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&state)
        .with_context(|| format!("creating {}", state.display()))?;
    // Faults are injected by dropping files there (see `allot_agent::gpu::XID_FILE_PREFIX`).
    Ok(Arc::new(
        SimBackend::from_spec(&args.sim_gpus, name)
            .with_context(|| format!("--sim-gpus {}", args.sim_gpus))?
            .with_fault_dir(args.data_dir.join("sim-faults"))
            .with_state_dir(state),
    ))
}

fn host_name() -> anyhow::Result<String> {
    let name = nix::unistd::gethostname().context("reading the host name")?;
    name.into_string()
        .map_err(|_| anyhow::anyhow!("the host name is not valid UTF-8; pass --name"))
}

pub async fn run(mut args: AgentArgs) -> anyhow::Result<()> {
    // Absolute from here on: jobs run in their own directories, and every path the agent
    // hands them (the simulated GPUs' state, their home, their job dir) must mean the same
    // there.
    args.data_dir = std::path::absolute(&args.data_dir)
        .with_context(|| format!("--data-dir {}", args.data_dir.display()))?;
    let name = match args.name.clone() {
        Some(n) => n,
        None => host_name()?,
    };
    let backend: Arc<dyn GpuBackend> = match args.gpu_backend {
        BackendChoice::Nvml => Arc::new(NvmlBackend::start().context("--gpu-backend nvml")?),
        BackendChoice::Auto => match NvmlBackend::start() {
            Ok(b) => {
                tracing::info!("GPUs through NVML");
                Arc::new(b)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no NVIDIA driver: simulating {}", args.sim_gpus);
                sim(&args, &name)?
            }
        },
        BackendChoice::Sim => sim(&args, &name)?,
    };
    let shim_library = match args.shim_library {
        Some(path) => {
            allot_agent::sharing::check_shim(&path)
                .map_err(|e| anyhow::anyhow!("--shim-library: {e}"))?;
            Some(path)
        }
        None => allot_agent::sharing::SharingConfig::discover_shim(),
    };
    let require_shim = backend.kind() != "simulated";
    match &shim_library {
        Some(path) => tracing::info!(shim = %path.display(), "GPU shares enforced by the shim"),
        None if require_shim => tracing::warn!(
            "no liballot_shim.so found (--shim-library): this node refuses jobs on shares of GPUs"
        ),
        None => {}
    }
    let stop = CancellationToken::new();
    let ca_cert_pem = std::fs::read_to_string(&args.ca_cert)
        .with_context(|| format!("--ca-cert: reading {}", args.ca_cert.display()))?;
    let servers: Vec<String> = args
        .server
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if servers.is_empty() {
        anyhow::bail!("--server: at least one https:// URL");
    }
    let runtime = args.runtime.choice(&servers)?;
    let config = AgentConfig {
        runtime,
        address: args.advertise_address.unwrap_or_default(),
        job_log_tail: args.job_log_tail,
        min_free_disk_bytes: args.min_free_disk,
        servers,
        ca_cert_pem,
        bootstrap_token: args.bootstrap_token.filter(|t| !t.trim().is_empty()),
        node_name: name,
        data_dir: args.data_dir,
        stop_grace: Duration::from_secs(args.stop_grace_secs),
        offer: {
            let host = NodeResources::detect();
            NodeResources {
                cpu_milli: args.cpus.unwrap_or(host.cpu_milli),
                memory_bytes: args.memory.unwrap_or(
                    host.memory_bytes
                        .saturating_sub(args.runtime.system_reserved_memory),
                ),
            }
        },
        metrics_listen: args.metrics_listen,
        sharing: allot_agent::sharing::SharingConfig {
            shim_library,
            context_reserve_bytes: args.shim_context_reserve,
            require_shim,
        },
    };
    let stopped = crate::shutdown_signal();
    let mut agent = tokio::spawn(allot_agent::run(config, backend, stop.clone()));
    // The agent ends on its own when the control plane refuses the node for good (a spent
    // or missing bootstrap token, a revoked node): it exits then with the reason, rather
    // than waiting for a signal a service manager would never send.
    tokio::select! {
        () = stopped => {
            eprintln!("shutting down: stopping jobs");
            stop.cancel();
            agent.await??;
        }
        ended = &mut agent => {
            stop.cancel();
            ended??;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_loopback_url;

    #[test]
    fn only_a_loopback_host_is_loopback() {
        for (url, loopback) in [
            ("https://127.0.0.1:7070", true),
            ("https://127.5.6.7:7070", true),
            ("https://localhost:7070", true),
            ("https://LOCALHOST:7070", true),
            ("https://[::1]:7070", true),
            ("http://127.0.0.1", true),
            // The WHATWG parser reads these as 127.0.0.1, as a client would.
            ("https://2130706433:7070", true),
            ("https://0x7f.1:7070", true),
            ("https://127.0.0.1.attacker.example:7070", false),
            ("https://localhost-cp.internal:7070", false),
            ("https://localhost.attacker.example:7070", false),
            ("https://cp.example.com:7070", false),
            ("https://10.0.0.1:7070", false),
            ("https://[::ffff:127.0.0.1]:7070", false),
            ("https://[::2]:7070", false),
            ("https://user@127.0.0.1.nip.io:7070", false),
            ("https://127.0.0.1@cp.example.com:7070", false),
            ("127.0.0.1:7070", false),
            ("not a url", false),
            ("", false),
        ] {
            assert_eq!(is_loopback_url(url), loopback, "{url}");
        }
    }
}
