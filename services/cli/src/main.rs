//! `allot`: the control plane, the node agent, the one-process dev cluster, and the client.

mod cmd;
mod output;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use allot_client as client;

use crate::client::Client;
use crate::cmd::job::JobCmd;
use crate::cmd::node::NodeCmd;
use crate::cmd::tenant::TenantCmd;
use crate::cmd::token::TokenCmd;

#[derive(Debug, Parser)]
#[command(
    name = "allot",
    version,
    about = "Multi-tenant GPU cluster control plane"
)]
struct Cli {
    /// The Allot API to talk to.
    #[arg(
        long,
        global = true,
        env = "ALLOT_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    server: String,
    /// API token.
    #[arg(long, global = true, env = "ALLOT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Trust the CA certificates in this PEM file (besides the system's) for an HTTPS server.
    #[arg(long, global = true, env = "ALLOT_CA_CERT")]
    ca_cert: Option<std::path::PathBuf>,
    /// Logs on stderr as text, or as one JSON object per line (for log shippers).
    #[arg(long, global = true, env = "ALLOT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Export traces of `allot server`, `agent` and `dev` over OTLP/gRPC to this collector,
    /// e.g. http://127.0.0.1:4317 (none when absent).
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control plane (API, agent gRPC, scheduler).
    Server(Box<cmd::server::ServerArgs>),
    /// Run a node agent.
    Agent(cmd::agent::AgentArgs),
    /// Run a whole cluster in one process: SQLite, simulated GPU nodes, real gRPC.
    Dev(cmd::dev::DevArgs),
    /// Manage tenants and their quotas.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Submit, inspect and cancel jobs.
    #[command(subcommand)]
    Job(JobCmd),
    /// Inspect nodes and their GPUs.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Named volumes: shared storage jobs mount by name.
    #[command(subcommand)]
    Volume(cmd::volume::VolumeCmd),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCmd),
    /// The people who sign in through the identity provider.
    #[command(subcommand)]
    User(cmd::access::UserCmd),
    /// Grant roles to users, or to everyone whose provider token carries a claim.
    #[command(subcommand)]
    Binding(cmd::access::BindingCmd),
    /// GPU-hours used per tenant, day or job (`--csv` for billing).
    Usage(cmd::usage::UsageArgs),
    /// Who the token is, and every role it holds.
    Whoami {
        #[arg(short, long, value_enum, default_value_t)]
        output: output::Format,
    },
    /// Run a benchmark: `allot-bench`, the benchmarks' own binary beside this one
    /// (`allot bench --help` lists them; results belong in docs/benchmarks.md).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Read, export and verify the tamper-evident audit logs.
    #[command(subcommand)]
    Audit(cmd::audit::AuditCmd),
    /// Schema administration: migrations and the PostgreSQL application role.
    #[command(subcommand)]
    Db(cmd::db::DbCmd),
    /// This machine's GPUs, as the agent's NVML backend sees them.
    #[command(subcommand)]
    Gpu(cmd::gpu::GpuCmd),
    /// Print a shell's completion script: `source <(allot completion bash)`, or save it
    /// where the shell looks (e.g. `allot completion zsh > ~/.zfunc/_allot`).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM. Both are watched from this call on, not from
/// the future's first poll: a signal sent as soon as a daemon says it is up (its banner
/// printed) is caught and stops it cleanly, instead of killing it outright.
pub fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let (interrupt, terminate) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        match (interrupt, terminate) {
            (Ok(mut i), Ok(mut t)) => {
                tokio::select! {
                    _ = i.recv() => {}
                    _ = t.recv() => {}
                }
            }
            (Ok(mut i), Err(e)) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops");
                i.recv().await;
            }
            (Err(e), _) => {
                tracing::warn!(error = %e, "cannot watch signals; Ctrl-C stops as it would");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let client = || {
        Ok::<_, anyhow::Error>(Client::new(
            &cli.server,
            cli.token.clone(),
            cli.ca_cert.as_deref(),
        )?)
    };
    match cli.command {
        Command::Server(args) => cmd::server::run(*args).await.map(|()| 0),
        Command::Agent(args) => cmd::agent::run(args).await.map(|()| 0),
        Command::Dev(args) => cmd::dev::run(args).await.map(|()| 0),
        Command::Tenant(c) => cmd::tenant::run(&client()?, c).await.map(|()| 0),
        Command::Job(c) => cmd::job::run(&client()?, c).await,
        Command::Node(c) => cmd::node::run(&client()?, c).await.map(|()| 0),
        Command::Volume(c) => cmd::volume::run(&client()?, c).await.map(|()| 0),
        Command::Token(c) => cmd::token::run(&client()?, c).await.map(|()| 0),
        Command::User(c) => cmd::access::run_user(&client()?, c).await.map(|()| 0),
        Command::Binding(c) => cmd::access::run_binding(&client()?, c).await.map(|()| 0),
        Command::Whoami { output } => cmd::access::whoami(&client()?, output).await.map(|()| 0),
        Command::Audit(c) => cmd::audit::run(client, c).await,
        Command::Bench { args } => Err(cmd::bench::exec(args)),
        Command::Db(c) => cmd::db::run(c).await.map(|()| 0),
        Command::Gpu(c) => cmd::gpu::run(c).await,
        Command::Usage(args) => cmd::usage::run(&client()?, args).await.map(|()| 0),
        Command::Completion { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "allot", &mut std::io::stdout());
            Ok(0)
        }
    }
}

/// What a write to a closed pipe does to the process.
enum SigPipe {
    /// Killed by SIGPIPE, quietly (status 141 to the shell), as Unix tools end when their
    /// reader goes away (`allot job list | head`), instead of panicking on the failed write.
    Default,
    /// The write fails with EPIPE (Rust's default): daemons, whom a closed socket or log
    /// pipe must never end.
    Ignore,
}

fn sigpipe(how: SigPipe) {
    use nix::sys::signal::{SigHandler, Signal, signal};
    let handler = match how {
        SigPipe::Default => SigHandler::SigDfl,
        SigPipe::Ignore => SigHandler::SigIgn,
    };
    // SAFETY: called from `main` before the async runtime (or any other thread) starts,
    // and installs no handler code, only a disposition.
    #[allow(unsafe_code)]
    let _ = unsafe { signal(Signal::SIGPIPE, handler) };
}

fn main() -> ExitCode {
    // Before parsing: `allot --help | head` is a client too.
    sigpipe(SigPipe::Default);
    allot_api::crypto::install_crypto_provider();
    let mut cli = Cli::parse();
    // `allot job submit SCRIPT`: parsed again with the script's directives before the flags.
    if let Command::Job(JobCmd::Submit {
        script: Some(_), ..
    }) = &cli.command
    {
        let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
        match cmd::job::with_directives(&argv) {
            Ok(Some(argv)) => cli = Cli::parse_from(argv),
            Ok(None) => {}
            Err(e) => {
                eprintln!("error: {}", output::terminal_safe(&format!("{e:#}")));
                return ExitCode::from(2);
            }
        }
    }
    let daemon = matches!(
        cli.command,
        Command::Server(_) | Command::Agent(_) | Command::Dev(_) | Command::Bench { .. }
    );
    if daemon {
        sigpipe(SigPipe::Ignore);
    }
    // `allot dev` is for people at a terminal: its banner comes first, not buried under
    // migrations and one registration line per node (ALLOT_LOG=info shows them).
    let default_level = match cli.command {
        Command::Dev(_) => "warn",
        _ if daemon => "info",
        _ => "warn",
    };
    let filter =
        EnvFilter::try_from_env("ALLOT_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Traces leave the process only when a collector is named (daemons only).
    let service = match cli.command {
        Command::Agent(_) => "allot-agent",
        _ => "allot-server",
    };
    let traces = match cli.otlp_endpoint.as_deref().filter(|_| daemon) {
        Some(endpoint) => {
            let _guard = runtime.enter();
            match allot_telemetry::Tracing::otlp(endpoint, service) {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("error: --otlp-endpoint: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        None => None,
    };
    let otel = traces.as_ref().map(|t| t.layer());
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(otel)
        .with(allot_telemetry::ClientErrors::new());
    // A client's malformed request is said again as a warning (above), not as the HTTP
    // server's error.
    let not_clients =
        || tracing_subscriber::filter::filter_fn(|m| !allot_telemetry::is_client_error(m));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    match cli.log_format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_writer(std::io::stderr)
                    .with_filter(not_clients()),
            )
            .init(),
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr)
                    .with_filter(not_clients()),
            )
            .init(),
    }
    let result = runtime.block_on(run(cli));
    if let Some(t) = &traces {
        t.shutdown();
    }
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            // What it says may quote a script's line, a file's name, or a server's words:
            // none of it acts on the terminal.
            eprintln!("error: {}", output::terminal_safe(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
