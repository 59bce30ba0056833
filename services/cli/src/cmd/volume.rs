//! `allot volume`: named volumes, shared storage jobs mount by name.

use allot_api::views::VolumeView;
use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

use crate::client::Client;
use crate::cmd::when;
use crate::output::{Format, print, table};

#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    /// Declare a volume, or replace its declaration (platform admins): a directory every
    /// node has at HOST_PATH (shared storage), and the tenants whose jobs may mount it.
    /// Each tenant's jobs see only `<HOST_PATH>/<tenant>`.
    Put {
        name: String,
        #[arg(long)]
        host_path: String,
        /// A tenant whose jobs may mount it (repeatable).
        #[arg(long = "tenant")]
        tenants: Vec<String>,
        /// Jobs may only read it.
        #[arg(long)]
        read_only: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// The volumes your tenants may mount (all of them, for platform admins).
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Remove a volume's declaration (nothing on the storage is touched).
    Delete {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

fn rows(list: &[VolumeView]) -> Vec<Vec<String>> {
    list.iter()
        .map(|v| {
            vec![
                v.name.clone(),
                v.host_path.clone(),
                if v.read_only { "ro" } else { "rw" }.to_owned(),
                v.tenants.join(","),
                when(Some(v.created_at)),
            ]
        })
        .collect()
}

const HEADERS: &[&str] = &["NAME", "HOST PATH", "MODE", "TENANTS", "CREATED"];

pub async fn run(client: &Client, cmd: VolumeCmd) -> anyhow::Result<()> {
    match cmd {
        VolumeCmd::Put {
            name,
            host_path,
            tenants,
            read_only,
            output,
        } => {
            let body =
                json!({ "host_path": host_path, "tenants": tenants, "read_only": read_only });
            let v: VolumeView = client
                .call(Method::PUT, &format!("/api/v1/volumes/{name}"), Some(&body))
                .await?;
            print(output, &v, |v| {
                table(HEADERS, &rows(std::slice::from_ref(v)))
            })
        }
        VolumeCmd::List { output } => {
            let list: Vec<VolumeView> = client.get("/api/v1/volumes", &[]).await?;
            print(output, &list, |l| table(HEADERS, &rows(l)))
        }
        VolumeCmd::Delete { name, output } => {
            client.delete(&format!("/api/v1/volumes/{name}")).await?;
            let done = serde_json::json!({ "volume": name, "deleted": true });
            print(output, &done, |_| format!("volume {name} removed"))
        }
    }
}
