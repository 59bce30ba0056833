use allot_api::views::NodeView;
use allot_domain::format_bytes;
use clap::Subcommand;

use crate::client::Client;
use crate::output::{Format, fields, print, table};

#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// List nodes with their GPU counts and status.
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Show one node and each of its GPUs.
    Get {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

pub async fn run(client: &Client, cmd: NodeCmd) -> anyhow::Result<()> {
    match cmd {
        NodeCmd::List { output } => {
            let nodes: Vec<NodeView> = client.get("/api/v1/nodes", &[]).await?;
            print(output, &nodes, |nodes| {
                let rows: Vec<_> = nodes
                    .iter()
                    .map(|n| {
                        let mut models: Vec<_> = n.gpus.iter().map(|g| g.model.as_str()).collect();
                        models.dedup();
                        vec![
                            n.name.clone(),
                            n.id.clone(),
                            n.status.clone(),
                            n.gpus.len().to_string(),
                            models.join(","),
                            n.gpu_backend.clone(),
                        ]
                    })
                    .collect();
                table(
                    &["NAME", "ID", "STATUS", "GPUS", "MODELS", "BACKEND"],
                    &rows,
                )
            })
        }
        NodeCmd::Get { id, output } => {
            let n: NodeView = client.get(&format!("/api/v1/nodes/{id}"), &[]).await?;
            print(output, &n, |n| {
                let head = fields(&[
                    ("Name", n.name.clone()),
                    ("ID", n.id.clone()),
                    ("Status", n.status.clone()),
                    ("Agent", n.agent_version.clone()),
                    ("Backend", n.gpu_backend.clone()),
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
                            if g.healthy { "healthy" } else { "unhealthy" }.to_owned(),
                        ]
                    })
                    .collect();
                let gpus = table(&["INDEX", "UUID", "MODEL", "MEMORY", "HEALTH"], &rows);
                format!("{head}\n\n{gpus}")
            })
        }
    }
}
