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
    /// The control plane's gRPC endpoint (mutual TLS).
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
    /// Seconds a stopped job gets between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 10)]
    stop_grace_secs: u64,
    /// CPUs offered to jobs, e.g. 60 (default: all of this machine's).
    #[arg(long, env = "ALLOT_AGENT_CPUS", value_parser = crate::cmd::parse_milli)]
    cpus: Option<u64>,
    /// Memory offered to jobs, e.g. 480GiB (default: all of this machine's).
    #[arg(long, env = "ALLOT_AGENT_MEMORY", value_parser = allot_domain::parse_bytes)]
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
    #[arg(long, default_value = "512MiB", value_parser = allot_domain::parse_bytes)]
    shim_context_reserve: u64,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BackendChoice {
    Auto,
    Nvml,
    Sim,
}

fn sim(args: &AgentArgs, name: &str) -> anyhow::Result<Arc<dyn GpuBackend>> {
    // Faults are injected by dropping files there (see `allot_agent::gpu::XID_FILE_PREFIX`).
    Ok(Arc::new(
        SimBackend::from_spec(&args.sim_gpus, name)
            .with_context(|| format!("--sim-gpus {}", args.sim_gpus))?
            .with_fault_dir(args.data_dir.join("sim-faults")),
    ))
}

fn host_name() -> anyhow::Result<String> {
    let name = nix::unistd::gethostname().context("reading the host name")?;
    name.into_string()
        .map_err(|_| anyhow::anyhow!("the host name is not valid UTF-8; pass --name"))
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
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
    let config = AgentConfig {
        server: args.server,
        ca_cert_pem,
        bootstrap_token: args.bootstrap_token.filter(|t| !t.trim().is_empty()),
        node_name: name,
        data_dir: args.data_dir,
        stop_grace: Duration::from_secs(args.stop_grace_secs),
        offer: {
            let host = NodeResources::detect();
            NodeResources {
                cpu_milli: args.cpus.unwrap_or(host.cpu_milli),
                memory_bytes: args.memory.unwrap_or(host.memory_bytes),
            }
        },
        metrics_listen: args.metrics_listen,
        sharing: allot_agent::sharing::SharingConfig {
            shim_library,
            context_reserve_bytes: args.shim_context_reserve,
            require_shim,
        },
    };
    let agent = tokio::spawn(allot_agent::run(config, backend, stop.clone()));
    crate::shutdown_signal().await;
    eprintln!("shutting down: stopping jobs");
    stop.cancel();
    agent.await??;
    Ok(())
}
