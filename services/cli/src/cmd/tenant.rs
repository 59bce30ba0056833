use allot_api::views::{QuotaBody, TenantView};
use allot_domain::{format_bytes, parse_bytes};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use crate::client::Client;
use crate::cmd::opt;
use crate::output::{Format, fields, print, table};

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// Create a tenant, optionally with caps.
    Create {
        name: String,
        #[command(flatten)]
        quota: QuotaArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// List tenants.
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Show one tenant.
    Get {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Replace a tenant's caps (omitted caps become unlimited).
    SetQuota {
        name: String,
        #[command(flatten)]
        quota: QuotaArgs,
    },
}

#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// Most GPUs the tenant may hold at once.
    #[arg(long)]
    gpus: Option<u32>,
    /// Most GPU memory the tenant may hold at once, e.g. 80GiB.
    #[arg(long, value_parser = parse_bytes)]
    gpu_memory: Option<u64>,
}

impl QuotaArgs {
    fn body(&self) -> QuotaBody {
        QuotaBody {
            max_gpus: self.gpus,
            max_gpu_memory_bytes: self.gpu_memory,
        }
    }
}

fn show(t: &TenantView, output: Format) -> anyhow::Result<()> {
    print(output, t, |t| {
        fields(&[
            ("Name", t.name.clone()),
            ("ID", t.id.clone()),
            ("GPU cap", opt(t.quota.max_gpus)),
            (
                "GPU memory cap",
                opt(t.quota.max_gpu_memory_bytes.map(format_bytes)),
            ),
            ("Created", t.created_at.to_rfc3339()),
        ])
    })
}

pub async fn run(client: &Client, cmd: TenantCmd) -> anyhow::Result<()> {
    match cmd {
        TenantCmd::Create {
            name,
            quota,
            output,
        } => {
            let body = json!({ "name": name, "quota": quota.body() });
            let t: TenantView = client
                .call(Method::POST, "/api/v1/tenants", Some(&body))
                .await?;
            show(&t, output)
        }
        TenantCmd::List { output } => {
            let ts: Vec<TenantView> = client.get("/api/v1/tenants", &[]).await?;
            print(output, &ts, |ts| {
                let rows: Vec<_> = ts
                    .iter()
                    .map(|t| {
                        vec![
                            t.name.clone(),
                            opt(t.quota.max_gpus),
                            opt(t.quota.max_gpu_memory_bytes.map(format_bytes)),
                            t.created_at.format("%Y-%m-%d %H:%M").to_string(),
                        ]
                    })
                    .collect();
                table(&["NAME", "GPU CAP", "GPU MEMORY CAP", "CREATED"], &rows)
            })
        }
        TenantCmd::Get { name, output } => {
            let t: TenantView = client.get(&format!("/api/v1/tenants/{name}"), &[]).await?;
            show(&t, output)
        }
        TenantCmd::SetQuota { name, quota } => {
            let t: TenantView = client
                .call(
                    Method::PUT,
                    &format!("/api/v1/tenants/{name}/quota"),
                    Some(&quota.body()),
                )
                .await?;
            show(&t, Format::Table)
        }
    }
}
