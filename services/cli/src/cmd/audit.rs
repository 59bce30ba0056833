//! `allot audit`: list and search the logs, export a bundle, verify a bundle offline, and
//! manage retention (pruning, legal holds).

use std::path::{Path, PathBuf};

use allot_audit::TrustedKeys;
use allot_audit::bundle::{Bundle, verify};
use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use crate::client::Client;
use crate::output::{Format, print, table};

#[derive(Debug, Subcommand)]
pub enum AuditCmd {
    /// List the audit logs you may read, with their sizes and latest checkpoints.
    Logs {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Search the logs you may read, newest first (`--oldest-first` for time order).
    Search {
        /// Only this log: `system` or a tenant name.
        #[arg(long)]
        log: Option<String>,
        #[command(flatten)]
        filter: Filter,
        /// Entries per page (1–1000).
        #[arg(long, default_value_t = 100)]
        limit: u64,
        /// Oldest first.
        #[arg(long)]
        oldest_first: bool,
        /// Continue after this cursor (printed when more entries remain).
        #[arg(long, conflicts_with = "before")]
        after: Option<String>,
        /// The page before this cursor (printed as the way back).
        #[arg(long)]
        before: Option<String>,
        /// Follow every page to the end.
        #[arg(long)]
        all: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Export a log (`system` or a tenant name) as a bundle file for offline verification:
    /// the whole log, or with filters the matching entries with inclusion proofs.
    Export {
        log: String,
        /// The bundle file to write.
        #[arg(long = "out", short = 'O')]
        file: PathBuf,
        #[command(flatten)]
        filter: Filter,
        /// `json`: the file written and its size.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Verify a bundle offline, with no server: signatures and key validity periods, hashes,
    /// sequence continuity, history commitments, checkpoints, inclusion proofs and the CSV
    /// and OCSF renderings. One line per problem; non-zero exit on any.
    Verify {
        bundle: PathBuf,
        /// The verifier keys to trust (a file as `allot audit keys` prints: one
        /// NAME+ID+KEY per line, with optional not-before=/not-after= periods); without it
        /// the bundle's own keys are used, which proves integrity but not origin.
        #[arg(long)]
        trusted_key: Option<PathBuf>,
        /// The external checkpoint copies: the sink directory (holding <log>/…) or one
        /// log's directory. Catches truncation and wholesale rewrites.
        #[arg(long)]
        checkpoints: Option<PathBuf>,
        /// `json`: the report as one object (ok, problems, counts).
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Print the verifier keys with their validity periods (save for --trusted-key).
    Keys {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Write an auditor's evidence bundle into a new directory: the SOC 2 and ISO 27001
    /// control matrices (each control naming its test), the authorization policies in
    /// force, the verifier keys, every log's latest signed checkpoint, and SHA256SUMS over
    /// all of it (`sha256sum -c SHA256SUMS`). Auditors and platform admins; audited.
    Evidence {
        /// The directory to create (it must not exist, or be empty).
        #[arg(long)]
        out: PathBuf,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Generate a signing key line for the audit key file (offline; prints a secret).
    Keygen {
        /// The key's name, usually the deployment's --audit-origin.
        #[arg(long, default_value = "allot.local")]
        name: String,
        /// When the key takes over signing (RFC 3339); default at once.
        #[arg(long)]
        not_before: Option<DateTime<Utc>>,
    },
    /// Remove the payload of a log's entries recorded before a time; positions, times,
    /// leaf hashes, actions and outcomes stay, so the log still verifies (admins).
    Prune {
        log: String,
        /// RFC 3339, e.g. 2026-01-01T00:00:00Z.
        #[arg(long)]
        before: DateTime<Utc>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Legal holds: while a log is held, nothing in it is pruned (admins).
    #[command(subcommand)]
    Hold(HoldCmd),
}

#[derive(Debug, Subcommand)]
pub enum HoldCmd {
    /// Hold a log (`system` or a tenant name).
    Set {
        log: String,
        #[arg(long)]
        reason: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Release a log's hold.
    Release {
        log: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// List the holds.
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

/// Which entries: every condition must hold.
#[derive(Debug, Args)]
pub struct Filter {
    /// Recorded at or after (RFC 3339).
    #[arg(long)]
    since: Option<DateTime<Utc>>,
    /// Recorded before (RFC 3339).
    #[arg(long)]
    until: Option<DateTime<Utc>>,
    /// `<kind>:<id>` (token:…, node:…, system:scheduler) or a bare id.
    #[arg(long)]
    actor: Option<String>,
    /// An action, or a prefix ending in `.*` (e.g. `token.*`).
    #[arg(long)]
    action: Option<String>,
    /// The resource, e.g. job/01….
    #[arg(long)]
    target: Option<String>,
    #[arg(long, value_parser = ["success", "denied", "failed"])]
    outcome: Option<String>,
}

impl Filter {
    fn query(&self) -> Vec<(&'static str, String)> {
        let time = |t: &DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        [
            ("since", self.since.as_ref().map(time)),
            ("until", self.until.as_ref().map(time)),
            ("actor", self.actor.clone()),
            ("action", self.action.clone()),
            ("target", self.target.clone()),
            ("outcome", self.outcome.clone()),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }
}

/// The table row of one entry; pruned entries show what is left of them.
fn entry_row(e: &Value) -> Vec<String> {
    let body: Value = e["body"]
        .as_str()
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or_default();
    // Names as the server reads them now, where the ids still name something.
    let actor = match (
        body["actor"]["kind"].as_str(),
        body["actor"]["id"].as_str(),
        e["actor_name"].as_str(),
    ) {
        (Some(k), _, Some(name)) => format!("{k}:{name}"),
        (Some(k), Some(id), None) => format!("{k}:{id}"),
        _ => "(pruned)".to_owned(),
    };
    let target = match (body["target"].as_str(), e["target_name"].as_str()) {
        (Some(t), Some(name)) => {
            let kind = t.split('/').next().unwrap_or_default();
            format!("{kind}/{name}")
        }
        (Some(t), None) => t.to_owned(),
        (None, _) => "(pruned)".to_owned(),
    };
    vec![
        e["time"].as_str().unwrap_or("").to_owned(),
        e["log_name"]
            .as_str()
            .or(e["log"].as_str())
            .unwrap_or("")
            .to_owned(),
        e["seq"].to_string(),
        e["action"].as_str().unwrap_or("").to_owned(),
        target,
        e["outcome"].as_str().unwrap_or("").to_owned(),
        actor,
    ]
}

pub fn verify_file(
    bundle: &Path,
    trusted_key: Option<&Path>,
    checkpoints: Option<&Path>,
    output: Format,
) -> anyhow::Result<i32> {
    let bytes = std::fs::read(bundle).with_context(|| format!("reading {}", bundle.display()))?;
    let bundle = Bundle::from_tar(&bytes).context("the file is not an Allot audit bundle")?;
    let trusted = trusted_key
        .map(|p| -> anyhow::Result<TrustedKeys> {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            TrustedKeys::parse(&text).with_context(|| format!("{}", p.display()))
        })
        .transpose()?;
    let log = serde_json::from_str::<Value>(&bundle.manifest_json)
        .ok()
        .and_then(|m| m["log"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let external = match checkpoints {
        Some(dir) => allot_server::checkpoints::read_dir_sink(dir, &log)
            .with_context(|| format!("reading the checkpoints in {}", dir.display()))?,
        None => Vec::new(),
    };
    let report = verify(&bundle, trusted.as_ref(), &external);
    if output.is_document() {
        let problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
        print(
            output,
            &json!({
                "ok": report.ok(),
                "log": log,
                "filtered": report.filtered,
                "entries": report.entries,
                "pruned": report.pruned,
                "checkpoints_verified": report.checkpoints_verified,
                "unsigned_tail": report.unsigned_tail,
                "key_trusted": report.key_trusted,
                "external_checkpoints": checkpoints.is_some(),
                "first_bad_entry": report.first_bad_entry,
                "problems": problems,
            }),
            |_| String::new(),
        )?;
        return Ok(if report.ok() { 0 } else { 1 });
    }
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
        let kind = if report.filtered {
            "filtered export, each entry proven in the covering checkpoint"
        } else {
            "whole log"
        };
        let pruned = if report.pruned > 0 {
            format!(" ({} pruned to their leaf hashes)", report.pruned)
        } else {
            String::new()
        };
        println!(
            "OK: log {log} ({kind}): {} entries{pruned}, {} checkpoint(s) verified{}",
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
            output,
        } => verify_file(
            &bundle,
            trusted_key.as_deref(),
            checkpoints.as_deref(),
            output,
        ),
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
        AuditCmd::Export {
            log,
            file,
            filter,
            output,
        } => {
            let bytes = client()?
                .get_bytes(&format!("/api/v1/audit/logs/{log}/export"), &filter.query())
                .await?;
            std::fs::write(&file, &bytes).with_context(|| format!("writing {}", file.display()))?;
            if output.is_document() {
                let done = json!({ "log": log, "file": file, "bytes": bytes.len() });
                print(output, &done, |_| String::new())?;
            } else {
                eprintln!("wrote {} ({} bytes)", file.display(), bytes.len());
            }
            Ok(0)
        }
        AuditCmd::Search {
            log,
            filter,
            limit,
            oldest_first,
            mut after,
            before,
            all,
            output,
        } => {
            let client = client()?;
            let mut entries: Vec<Value> = Vec::new();
            let mut prev = None;
            let mut before = before;
            loop {
                let mut query = filter.query();
                query.push(("limit", limit.to_string()));
                let order = if oldest_first { "oldest" } else { "newest" };
                query.push(("order", order.to_owned()));
                if let Some(l) = &log {
                    query.push(("log", l.clone()));
                }
                if let Some(a) = &after {
                    query.push(("after", a.clone()));
                }
                if let Some(b) = before.take() {
                    query.push(("before", b));
                }
                let page: Value = client.get("/api/v1/audit/entries", &query).await?;
                entries.extend(page["entries"].as_array().cloned().unwrap_or_default());
                if prev.is_none() {
                    prev = page["prev"].as_str().map(str::to_owned);
                }
                after = page["next"].as_str().map(str::to_owned);
                if !all || after.is_none() {
                    break;
                }
            }
            print(output, &entries, |entries| {
                let rows: Vec<_> = entries.iter().map(entry_row).collect();
                table(
                    &["TIME", "LOG", "SEQ", "ACTION", "TARGET", "OUTCOME", "ACTOR"],
                    &rows,
                )
            })?;
            if let Some(b) = prev {
                eprintln!("previous page: --before {b}");
            }
            if let Some(a) = after {
                eprintln!("more entries: continue with --after {a}");
            }
            Ok(0)
        }
        AuditCmd::Keygen { name, not_before } => {
            let key = allot_audit::Signer::generate_system(&name)?;
            match not_before {
                Some(t) => println!(
                    "{} not-before={}",
                    key.skey(),
                    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
                ),
                None => println!("{}", key.skey()),
            }
            eprintln!("public key: {}", key.verifier().vkey());
            Ok(0)
        }
        AuditCmd::Evidence { out, output } => {
            let bundle: allot_api::Evidence = client()?.get("/api/v1/audit/evidence", &[]).await?;
            let files = write_evidence(&out, &bundle)?;
            let done = json!({ "dir": out, "files": files, "logs": bundle.checkpoints.len() });
            print(output, &done, |_| {
                format!(
                    "wrote {} files to {} ({} logs); check with: cd {} && sha256sum -c SHA256SUMS",
                    files,
                    out.display(),
                    bundle.checkpoints.len(),
                    out.display()
                )
            })?;
            Ok(0)
        }
        AuditCmd::Keys { output } => {
            let keys: Value = client()?.get("/api/v1/audit/key", &[]).await?;
            if output.is_document() {
                print(output, &keys, |_| String::new())?;
            } else {
                print!("{}", keys["keys"].as_str().unwrap_or(""));
            }
            Ok(0)
        }
        AuditCmd::Prune {
            log,
            before,
            output,
        } => {
            let out: Value = client()?
                .call(
                    Method::POST,
                    &format!("/api/v1/audit/logs/{log}/prune"),
                    Some(&json!({ "before": before })),
                )
                .await?;
            print(output, &out, |out| {
                format!("pruned {} entries of log {log}", out["pruned"])
            })?;
            Ok(0)
        }
        AuditCmd::Hold(HoldCmd::Set {
            log,
            reason,
            output,
        }) => {
            let hold: Value = client()?
                .call(
                    Method::PUT,
                    &format!("/api/v1/audit/logs/{log}/hold"),
                    Some(&json!({ "reason": reason })),
                )
                .await?;
            print(output, &hold, |_| format!("log {log} is under legal hold"))?;
            Ok(0)
        }
        AuditCmd::Hold(HoldCmd::Release { log, output }) => {
            let released: Value = client()?
                .call::<(), _>(
                    Method::DELETE,
                    &format!("/api/v1/audit/logs/{log}/hold"),
                    None,
                )
                .await?;
            print(output, &released, |_| {
                format!("released the legal hold on log {log}")
            })?;
            Ok(0)
        }
        AuditCmd::Hold(HoldCmd::List { output }) => {
            let holds: Vec<Value> = client()?.get("/api/v1/audit/holds", &[]).await?;
            print(output, &holds, |holds| {
                let rows: Vec<_> = holds
                    .iter()
                    .map(|h| {
                        ["log", "reason", "set_by", "set_at"]
                            .map(|k| h[k].as_str().unwrap_or("").to_owned())
                            .to_vec()
                    })
                    .collect();
                table(&["LOG", "REASON", "SET BY", "SET AT"], &rows)
            })?;
            Ok(0)
        }
    }
}

/// Writes the evidence bundle into `out` (new, or empty): how many files.
fn write_evidence(out: &Path, bundle: &allot_api::Evidence) -> anyhow::Result<usize> {
    use sha2::{Digest, Sha256};
    if out.exists() && std::fs::read_dir(out)?.next().is_some() {
        anyhow::bail!("--out: {} exists and is not empty", out.display());
    }
    let mut sums = Vec::new();
    let mut write = |rel: String, text: &str, expected: Option<&str>| -> anyhow::Result<()> {
        let sha = hex::encode(Sha256::digest(text.as_bytes()));
        if let Some(e) = expected
            && e != sha
        {
            anyhow::bail!("{rel}: the server's hash {e} is not its text's {sha}");
        }
        // Names come from the server: only plain file names are written.
        let plain =
            |n: &str| !n.is_empty() && n != "." && n != ".." && !n.contains(['/', '\\', '\0']);
        anyhow::ensure!(rel.split('/').all(plain), "refusing to write `{rel}`");
        let path = out.join(&rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
        }
        std::fs::write(&path, text).with_context(|| path.display().to_string())?;
        sums.push(format!("{sha}  {rel}"));
        Ok(())
    };
    for f in &bundle.control_matrices {
        write(format!("controls/{}", f.name), &f.text, Some(&f.sha256))?;
    }
    for f in &bundle.policies {
        write(format!("policies/{}", f.name), &f.text, Some(&f.sha256))?;
    }
    write("verifier-keys.txt".into(), &bundle.verifier_keys, None)?;
    let mut logs = Vec::new();
    for c in &bundle.checkpoints {
        if let Some(note) = &c.checkpoint {
            write(format!("checkpoints/{}.checkpoint", c.log), note, None)?;
        }
        logs.push(json!({ "log": c.log, "tenant": c.tenant, "size": c.size,
                          "checkpoint": c.checkpoint.is_some() }));
    }
    let index = json!({
        "generated_at": bundle.generated_at,
        "version": bundle.version,
        "logs": logs,
    });
    write(
        "evidence.json".into(),
        &serde_json::to_string_pretty(&index)?,
        None,
    )?;
    let n = sums.len();
    sums.push(String::new());
    std::fs::write(out.join("SHA256SUMS"), sums.join("\n"))?;
    Ok(n + 1)
}
