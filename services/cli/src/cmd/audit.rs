//! `allot audit`: list the logs, export one as a bundle, verify a bundle offline.

use std::path::{Path, PathBuf};

use allot_api::views::TenantView;
use allot_audit::Verifier;
use allot_audit::bundle::{Bundle, verify};
use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;

use crate::client::Client;
use crate::output::{Format, print, table};

#[derive(Debug, Subcommand)]
pub enum AuditCmd {
    /// List the audit logs you may read, with their sizes and latest checkpoints.
    Logs {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Export a log (`system` or a tenant name) as a bundle file for offline verification.
    Export {
        log: String,
        #[arg(long, short = 'O')]
        output: PathBuf,
    },
    /// Verify a bundle offline, with no server: signatures, hashes, sequence continuity,
    /// history commitments and checkpoints. One line per problem; non-zero exit on any.
    Verify {
        bundle: PathBuf,
        /// The verifier key to trust (a file holding NAME+ID+KEY); without it the bundle's
        /// own key is used, which proves integrity but not origin.
        #[arg(long)]
        trusted_key: Option<PathBuf>,
        /// The external checkpoint copies: the sink directory (holding <log>/…) or one
        /// log's directory. Catches truncation and wholesale rewrites.
        #[arg(long)]
        checkpoints: Option<PathBuf>,
    },
}

/// A log id from `system` or a tenant's name.
async fn log_id(client: &Client, log: &str) -> anyhow::Result<String> {
    if log == "system" {
        return Ok(log.to_owned());
    }
    let t: TenantView = client.get(&format!("/api/v1/tenants/{log}"), &[]).await?;
    Ok(t.id)
}

/// Reads `*.checkpoint` files of `log` from a sink directory or a log's directory.
fn external_checkpoints(dir: &Path, log: &str) -> anyhow::Result<Vec<(u64, String)>> {
    let nested = dir.join(log);
    let dir = if nested.is_dir() {
        nested
    } else {
        dir.to_owned()
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(size) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".checkpoint"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let note = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        out.push((size, note));
    }
    out.sort_by_key(|(s, _)| *s);
    Ok(out)
}

pub fn verify_file(
    bundle: &Path,
    trusted_key: Option<&Path>,
    checkpoints: Option<&Path>,
) -> anyhow::Result<i32> {
    let bytes = std::fs::read(bundle).with_context(|| format!("reading {}", bundle.display()))?;
    let bundle = Bundle::from_tar(&bytes).context("the file is not an Allot audit bundle")?;
    let trusted = trusted_key
        .map(|p| -> anyhow::Result<Verifier> {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Ok(Verifier::from_vkey(&text)?)
        })
        .transpose()?;
    let log = serde_json::from_str::<Value>(&bundle.manifest_json)
        .ok()
        .and_then(|m| m["log"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let external = match checkpoints {
        Some(dir) => external_checkpoints(dir, &log)?,
        None => Vec::new(),
    };
    let report = verify(&bundle, trusted.as_ref(), &external);
    for p in &report.problems {
        println!("{p}");
    }
    if !report.key_trusted {
        eprintln!("warning: no --trusted-key given; verified with the key inside the bundle");
    }
    if checkpoints.is_none() {
        eprintln!(
            "warning: no --checkpoints given; truncation and rewrites of unsigned history are undetectable"
        );
    }
    if report.ok() {
        println!(
            "OK: log {log}: {} entries, {} checkpoint(s) verified{}",
            report.entries,
            report.checkpoints_verified,
            if report.unsigned_tail > 0 {
                format!(
                    "; the last {} entries are not yet covered by a checkpoint",
                    report.unsigned_tail
                )
            } else {
                String::new()
            }
        );
        Ok(0)
    } else {
        if let Some(seq) = report.first_bad_entry {
            println!("first bad entry: {seq}");
        }
        println!("FAILED: {} problem(s)", report.problems.len());
        Ok(1)
    }
}

pub async fn run(
    client: impl FnOnce() -> anyhow::Result<Client>,
    cmd: AuditCmd,
) -> anyhow::Result<i32> {
    match cmd {
        AuditCmd::Verify {
            bundle,
            trusted_key,
            checkpoints,
        } => verify_file(&bundle, trusted_key.as_deref(), checkpoints.as_deref()),
        AuditCmd::Logs { output } => {
            let logs: Vec<Value> = client()?.get("/api/v1/audit/logs", &[]).await?;
            print(output, &logs, |logs| {
                let rows: Vec<_> = logs
                    .iter()
                    .map(|l| {
                        let cp_size = l["checkpoint"]
                            .as_str()
                            .and_then(|n| n.lines().nth(1))
                            .unwrap_or("-")
                            .to_owned();
                        vec![
                            l["log"].as_str().unwrap_or("").to_owned(),
                            l["tenant"].as_str().unwrap_or("-").to_owned(),
                            l["size"].to_string(),
                            cp_size,
                            l["root"].as_str().unwrap_or("").to_owned(),
                        ]
                    })
                    .collect();
                table(&["LOG", "TENANT", "ENTRIES", "CHECKPOINTED", "ROOT"], &rows)
            })?;
            Ok(0)
        }
        AuditCmd::Export { log, output } => {
            let client = client()?;
            let id = log_id(&client, &log).await?;
            let bytes = client
                .get_bytes(&format!("/api/v1/audit/logs/{id}/export"))
                .await?;
            std::fs::write(&output, &bytes)
                .with_context(|| format!("writing {}", output.display()))?;
            eprintln!("wrote {} ({} bytes)", output.display(), bytes.len());
            Ok(0)
        }
    }
}
