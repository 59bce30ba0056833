use allot_api::views::{
    BootstrapTokenView, CreateBootstrapToken, CreatedBootstrapToken, NodeView, RevokedNode,
};
use allot_domain::{NodeStatus, format_bytes};
use clap::Subcommand;

use crate::client::Client;
use crate::output::{Column, Format, ListOutput, Watch, fields, print, table};

#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// List nodes: their state, GPUs (free, held) and models.
    List {
        #[command(flatten)]
        output: ListOutput,
        #[command(flatten)]
        watch: Watch,
    },
    /// Show one node and each of its GPUs.
    Get {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Set or remove a node's labels, as `kubectl label`: `rack=r12` sets, `rack-` removes.
    /// Gangs may ask to be packed within one value of a label (`job submit --pack rack`).
    /// Platform admins.
    Label {
        /// Node id or name.
        node: String,
        /// NAME=VALUE to set, NAME- to remove.
        #[arg(required = true, value_parser = parse_label_change)]
        changes: Vec<(String, Option<String>)>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Take no new work on a node (what runs there stays). Platform admins.
    Cordon {
        /// Node id or name.
        node: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Cordon a node and move its jobs elsewhere (after --grace), saying why (--reason);
    /// or with --gpu, only one GPU's jobs, at once.
    Drain {
        /// Node id or name.
        node: String,
        /// Only this GPU (UUID).
        #[arg(long, conflicts_with_all = ["reason", "grace"])]
        gpu: Option<String>,
        /// Why, shown beside the node (`node list`, the portal), as `sinfo -R` shows it.
        #[arg(long)]
        reason: Option<String>,
        /// How long its running jobs may finish before they are requeued elsewhere, e.g.
        /// 10m or 2h (default: at once).
        #[arg(long, value_parser = parse_grace)]
        grace: Option<u64>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Return a node (undo cordon or drain), or with --gpu a drained GPU, to service.
    #[command(visible_aliases = ["undrain", "uncordon", "resume"])]
    Return {
        /// Node id or name.
        node: String,
        #[arg(long)]
        gpu: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Revoke a node's certificates: its calls stop at once, its jobs are requeued when its
    /// lease lapses, and it rejoins only with a new bootstrap token. Platform admins.
    Revoke {
        /// Node id or name.
        node: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// One-time tokens new nodes register with. Platform admins.
    #[command(subcommand, name = "bootstrap-token")]
    BootstrapToken(BootstrapTokenCmd),
}

#[derive(Debug, Subcommand)]
pub enum BootstrapTokenCmd {
    /// Create a token; its secret is printed once (pass it to `allot agent --bootstrap-token`).
    Create {
        /// The node it admits: its name, or a pattern with `*` (e.g. gpu-4*).
        #[arg(long = "node")]
        node_name: String,
        /// It may take over the name of a node already registered (revoking that node's
        /// certificates).
        #[arg(long)]
        replace: bool,
        /// What it is for, e.g. "rack 4".
        #[arg(long, default_value = "")]
        description: String,
        /// Minutes until it expires (at most 7 days).
        #[arg(long, default_value_t = 60)]
        ttl_minutes: u64,
        /// `json`: the token and its secret as the API gives them.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// List tokens (never their secrets), newest first.
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Delete a token: it admits no one from now on.
    Delete {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

/// A node's state in one word: `draining` (an operator drained it and jobs still run
/// there), `drained` (nothing runs there any more), `ready`, `cordoned` (ready, taking no new work by an
/// operator's word), `unavailable` (ready, taking no new work by its agent's: see `node
/// get`) or `not-ready` (its lease lapsed).
fn state(n: &NodeView) -> String {
    let ready = n.status == NodeStatus::Ready;
    if n.drain.is_some() {
        // Drained once nothing runs there any more (as far as the caller may see).
        return if n.jobs.is_some_and(|j| j == 0) {
            "drained".into()
        } else {
            "draining".into()
        };
    }
    if n.cordoned && ready {
        "cordoned".into()
    } else if !n.unavailable.is_empty() && ready {
        "unavailable".into()
    } else {
        n.status.to_string()
    }
}

/// GPUs' worth, e.g. `2.5` (`-` where the caller may not see every tenant's jobs:
/// cluster-wide telemetry).
fn gpus(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), crate::cmd::show_gpus)
}

/// What `node list` can show of a node (`--format` names, `-o wide` all).
fn node_columns() -> [Column<NodeView>; 14] {
    [
        Column::new("name", "NAME", |n| n.name.clone()),
        Column::new("state", "STATE", state),
        Column::new("reason", "REASON", |n| match &n.drain {
            Some(d) if !d.reason.is_empty() => d.reason.clone(),
            Some(_) => "drained".into(),
            None if !n.unavailable.is_empty() => n.unavailable.clone(),
            None => "-".into(),
        }),
        Column::new("gpus", "GPUS", |n| n.gpus.len().to_string()),
        Column::new("free", "FREE", |n| gpus(n.gpus_free)),
        Column::new("held", "HELD", |n| gpus(n.gpus_held)),
        // Sick GPUs (a GPU an operator drains is not sick: see DRAINED).
        Column::new("unhealthy", "UNHEALTHY", |n| {
            n.gpus
                .iter()
                .filter(|g| !matches!(g.health.as_str(), "healthy" | "draining"))
                .count()
                .to_string()
        }),
        Column::wide("drained", "DRAINED", |n| {
            n.gpus
                .iter()
                .filter(|g| g.health == "draining")
                .count()
                .to_string()
        }),
        Column::new("models", "MODELS", |n| {
            let mut models: Vec<_> = n.gpus.iter().map(|g| g.model.as_str()).collect();
            models.dedup();
            models.join(",")
        }),
        Column::wide("id", "ID", |n| n.id.clone()),
        Column::wide("cpus", "CPUS", |n| crate::cmd::show_milli(n.cpu_milli)),
        Column::wide("memory", "MEMORY", |n| format_bytes(n.memory_bytes)),
        Column::wide("backend", "BACKEND", |n| n.gpu_backend.clone()),
        Column::wide("runtime", "RUNTIME", |n| n.runtime.clone()),
    ]
}

fn health(g: &allot_api::views::GpuView) -> &str {
    &g.health
}

/// A drain's grace: `0` (at once) or a span as `--time-limit` takes it (10m, 2h).
fn parse_grace(s: &str) -> Result<u64, String> {
    if matches!(s.trim(), "0" | "0s" | "0m" | "0h") {
        return Ok(0);
    }
    crate::cmd::job::parse_duration_secs(s)
        .map_err(|_| format!("`{s}` is not a grace: write 0 (at once), 10m, 2h or HH:MM:SS"))
}

/// `rack=r12` (set) or `rack-` (remove).
fn parse_label_change(s: &str) -> Result<(String, Option<String>), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), Some(v.to_owned()))),
        None if s.len() > 1 && s.ends_with('-') => Ok((s[..s.len() - 1].to_owned(), None)),
        _ => Err("expected NAME=VALUE (set) or NAME- (remove)".into()),
    }
}

pub async fn run(client: &Client, cmd: NodeCmd) -> anyhow::Result<()> {
    match cmd {
        NodeCmd::Label {
            node,
            changes,
            output,
        } => {
            let labels: serde_json::Map<String, serde_json::Value> = changes
                .into_iter()
                .map(|(k, v)| {
                    (
                        k,
                        v.map_or(serde_json::Value::Null, serde_json::Value::String),
                    )
                })
                .collect();
            let n: NodeView = client
                .call(
                    reqwest::Method::PATCH,
                    &format!("/api/v1/nodes/{node}/labels"),
                    Some(&serde_json::json!({ "labels": labels })),
                )
                .await?;
            print(output, &n, |n| format!("node {}: {}", n.name, labels_of(n)))
        }
        NodeCmd::List { output, watch } => {
            let columns = node_columns();
            output.columns(&columns)?;
            watch
                .run("allot node list", || async {
                    let mut nodes: Vec<NodeView> = client.get("/api/v1/nodes", &[]).await?;
                    nodes.sort_by(|a, b| allot_domain::node::natural_order(&a.name, &b.name));
                    output.render(&nodes, &nodes, &columns)
                })
                .await
        }
        NodeCmd::Get { id, output } => {
            let n: NodeView = client.get(&format!("/api/v1/nodes/{id}"), &[]).await?;
            print(output, &n, |n| {
                let head = fields(&[
                    ("Name", n.name.clone()),
                    ("ID", n.id.clone()),
                    (
                        "Status",
                        match (n.cordoned, n.unavailable.is_empty()) {
                            _ if n.drain.is_some() => format!("{} ({})", n.status, state(n)),
                            (true, _) => format!("{} (cordoned)", n.status),
                            (false, false) => format!("{} (unavailable)", n.status),
                            (false, true) => n.status.to_string(),
                        },
                    ),
                    (
                        "Drain",
                        n.drain.as_ref().map_or_else(
                            || "-".into(),
                            |d| {
                                format!(
                                    "{}; jobs requeued from {}",
                                    if d.reason.is_empty() {
                                        "no reason given"
                                    } else {
                                        &d.reason
                                    },
                                    d.deadline
                                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                                )
                            },
                        ),
                    ),
                    (
                        "Unavailable",
                        if n.unavailable.is_empty() {
                            "-".into()
                        } else {
                            n.unavailable.clone()
                        },
                    ),
                    ("Labels", labels_of(n)),
                    (
                        "Address",
                        if n.address.is_empty() {
                            "-".into()
                        } else {
                            n.address.clone()
                        },
                    ),
                    ("Agent", n.agent_version.clone()),
                    ("Backend", n.gpu_backend.clone()),
                    ("Runtime", n.runtime.clone()),
                    (
                        "GPUs",
                        match (n.gpus_free, n.gpus_held, n.gpus_unavailable) {
                            (Some(free), Some(held), Some(off)) if off > 0.0 => format!(
                                "{} ({} held, {} free, {} unavailable)",
                                n.gpus.len(),
                                gpus(Some(held)),
                                gpus(Some(free)),
                                gpus(Some(off))
                            ),
                            (Some(free), Some(held), _) => format!(
                                "{} ({} held, {} free)",
                                n.gpus.len(),
                                gpus(Some(held)),
                                gpus(Some(free))
                            ),
                            _ => n.gpus.len().to_string(),
                        },
                    ),
                    ("Last heartbeat", n.last_heartbeat_at.to_rfc3339()),
                ]);
                let rows: Vec<_> = n
                    .gpus
                    .iter()
                    .map(|g| {
                        vec![
                            g.index.to_string(),
                            g.uuid.clone(),
                            g.model.clone(),
                            format_bytes(g.memory_bytes),
                            health(g).to_owned(),
                            match (g.held, g.jobs) {
                                (Some(h), Some(j)) => format!(
                                    "{} ({j} job{})",
                                    crate::cmd::show_gpus(h),
                                    if j == 1 { "" } else { "s" }
                                ),
                                _ => "-".into(),
                            },
                            g.memory_enforcement.clone(),
                            g.nvlink_domain.map_or("-".into(), |d| d.to_string()),
                        ]
                    })
                    .collect();
                let gpus = table(
                    &[
                        "INDEX",
                        "UUID",
                        "MODEL",
                        "MEMORY",
                        "HEALTH",
                        "HELD",
                        "MEMORY LIMITS",
                        "NVLINK",
                    ],
                    &rows,
                );
                let mig: Vec<Vec<String>> = n
                    .gpus
                    .iter()
                    .flat_map(|g| {
                        g.mig_instances.iter().flatten().map(move |m| {
                            vec![
                                g.index.to_string(),
                                m.profile.clone(),
                                m.start.to_string(),
                                m.uuid.clone(),
                            ]
                        })
                    })
                    .collect();
                if mig.is_empty() {
                    format!("{head}\n\n{gpus}")
                } else {
                    let mig = table(&["GPU", "MIG PROFILE", "START", "UUID"], &mig);
                    format!("{head}\n\n{gpus}\n\n{mig}")
                }
            })
        }
        NodeCmd::Cordon { node, output } => {
            admin(client, &format!("/api/v1/nodes/{node}/cordon"), output).await
        }
        NodeCmd::Drain {
            node,
            gpu,
            reason,
            grace,
            output,
        } => {
            let path = match gpu {
                Some(g) => format!("/api/v1/nodes/{node}/gpus/{g}/drain"),
                None => {
                    let mut q: Vec<(&str, String)> = Vec::new();
                    if let Some(r) = reason {
                        q.push(("reason", r));
                    }
                    if let Some(g) = grace {
                        q.push(("grace_secs", g.to_string()));
                    }
                    let query = serde_urlencoded::to_string(&q)?;
                    if query.is_empty() {
                        format!("/api/v1/nodes/{node}/drain")
                    } else {
                        format!("/api/v1/nodes/{node}/drain?{query}")
                    }
                }
            };
            admin(client, &path, output).await
        }
        NodeCmd::Return { node, gpu, output } => {
            let path = match gpu {
                Some(g) => format!("/api/v1/nodes/{node}/gpus/{g}/return"),
                None => format!("/api/v1/nodes/{node}/uncordon"),
            };
            admin(client, &path, output).await
        }
        NodeCmd::Revoke { node, output } => {
            let r: RevokedNode = client
                .call::<(), _>(
                    reqwest::Method::POST,
                    &format!("/api/v1/nodes/{node}/revoke"),
                    None,
                )
                .await?;
            print(output, &r, |r| {
                format!(
                    "node {} revoked ({} certificate(s)); it rejoins only with a new bootstrap token",
                    r.node.name, r.certificates_revoked
                )
            })
        }
        NodeCmd::BootstrapToken(cmd) => bootstrap_token(client, cmd).await,
    }
}

async fn bootstrap_token(client: &Client, cmd: BootstrapTokenCmd) -> anyhow::Result<()> {
    const PATH: &str = "/api/v1/bootstrap-tokens";
    match cmd {
        BootstrapTokenCmd::Create {
            node_name,
            replace,
            description,
            ttl_minutes,
            output,
        } => {
            let body = CreateBootstrapToken {
                node_name,
                replace,
                description,
                expires_in_seconds: Some(ttl_minutes.saturating_mul(60)),
            };
            let t: CreatedBootstrapToken = client
                .call(reqwest::Method::POST, PATH, Some(&body))
                .await?;
            if output.is_document() {
                print(output, &t, |_| String::new())?;
            } else {
                eprintln!(
                    "bootstrap token {} (expires {}); one node can register with it, once:",
                    t.token.id,
                    t.token.expires_at.to_rfc3339()
                );
                println!("{}", t.secret);
            }
        }
        BootstrapTokenCmd::List { output } => {
            let tokens: Vec<BootstrapTokenView> = client.get(PATH, &[]).await?;
            print(output, &tokens, |tokens| {
                let rows: Vec<_> = tokens
                    .iter()
                    .map(|t| {
                        vec![
                            t.id.clone(),
                            t.description.clone(),
                            t.expires_at.to_rfc3339(),
                            crate::cmd::when(t.used_at),
                            crate::cmd::opt(t.used_by.as_ref()),
                        ]
                    })
                    .collect();
                table(&["ID", "DESCRIPTION", "EXPIRES", "USED", "USED BY"], &rows)
            })?;
        }
        BootstrapTokenCmd::Delete { id, output } => {
            let t: BootstrapTokenView = client
                .call::<(), _>(reqwest::Method::DELETE, &format!("{PATH}/{id}"), None)
                .await?;
            print(output, &t, |t| format!("bootstrap token {} deleted", t.id))?;
        }
    }
    Ok(())
}

async fn admin(client: &Client, path: &str, output: Format) -> anyhow::Result<()> {
    let n: NodeView = client
        .call(reqwest::Method::POST, path, None::<&serde_json::Value>)
        .await?;
    let drained: Vec<&str> = n
        .gpus
        .iter()
        .filter(|g| g.drained)
        .map(|g| g.uuid.as_str())
        .collect();
    let line = format!(
        "node {}: {}{}",
        n.name,
        match &n.drain {
            Some(d) => format!(
                "draining{}; its jobs are requeued elsewhere from {}",
                if d.reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", d.reason)
                },
                d.deadline
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            None if n.cordoned => "cordoned".into(),
            None => "in service".into(),
        },
        if drained.is_empty() {
            String::new()
        } else {
            format!("; drained GPUs: {}", drained.join(", "))
        }
    );
    print(output, &n, |_| line)
}

/// `rack=r12, spine=s3`, or `-`.
fn labels_of(n: &NodeView) -> String {
    if n.labels.is_empty() {
        return "-".into();
    }
    n.labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
