use std::collections::BTreeMap;
use std::time::Duration;

use allot_api::views::{JobList, JobView};
use allot_domain::{
    GpuCompute, Isolation, WorkloadClass, format_bytes, parse_memory, parse_priority,
};
use anyhow::{Context, bail};
use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

use crate::client::Client;
use crate::cmd::{parse_milli, show_milli};
use crate::output::{Format, ListOutput, Watch, print};

mod flags;
mod show;

use flags::*;
use show::*;

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum JobCmd {
    /// Submit a job: `allot job submit --tenant T --gpus 1 -- python train.py`.
    Submit {
        /// The tenant to run as (defaults to the token's tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// GPUs: whole ones (2), none (0, a CPU-only job), a fraction of one GPU that
        /// other jobs share (0.25), or `auto` (`auto:0.5`: at most half a GPU): a share of
        /// one GPU that Allot sizes from what the job uses, its GPU memory with it unless
        /// --gpu-memory gives a size.
        #[arg(long, default_value = "1", value_parser = parse_gpus)]
        gpus: Gpus,
        /// GPU memory needed on each GPU, e.g. 80GiB: the least a whole GPU must have, or
        /// what the job holds of a shared one; `auto`: Allot sizes the limit of a shared
        /// one from what the job holds.
        #[arg(long, value_parser = parse_gpu_memory)]
        gpu_memory: Option<GpuMemory>,
        /// An acceptable GPU model, e.g. H200 (repeatable; any model when absent).
        #[arg(long = "gpu-model")]
        gpu_models: Vec<String>,
        /// CPUs reserved on the node and the job's CPU limit, e.g. 4 or 0.5 (default: the
        /// tenant's, `tenant get` shows it).
        #[arg(long, value_parser = parse_milli)]
        cpus: Option<u64>,
        /// Memory reserved on the node and the job's memory limit, e.g. 16GiB (default: the
        /// tenant's).
        #[arg(long, value_parser = parse_memory)]
        memory: Option<u64>,
        /// low, normal, high, critical, or a number from -1000 to 1000.
        #[arg(long, default_value = "normal", value_parser = parse_priority)]
        priority: i32,
        /// Never preempt this job (it then runs only within the tenant's guarantee or on
        /// spare capacity nobody reclaims).
        #[arg(long)]
        not_preemptible: bool,
        /// shared, mig or dedicated (default: the class's, else shared; never below the
        /// tenant's minimum).
        #[arg(long)]
        isolation: Option<Isolation>,
        /// Run on a MIG instance of this profile (e.g. 1g.18gb) instead of GPUs.
        #[arg(long = "mig", conflicts_with_all = ["gpus", "gpu_memory"])]
        mig_profile: Option<String>,
        /// For a share of a GPU: strict (the default) holds the job to its share always,
        /// elastic only while other jobs want the GPU. best-effort: no share of its own
        /// (with --gpu-memory, without --gpu-share): it runs on what the GPU's other jobs
        /// leave idle and gives its place up to any job that is not best-effort.
        #[arg(long)]
        gpu_compute: Option<GpuCompute>,
        /// For a share of a GPU: allow resizing it while the job runs (`allot job resize`).
        #[arg(long)]
        gpu_resizable: bool,
        /// training, inference or batch.
        #[arg(long)]
        class: Option<WorkloadClass>,
        /// Retry attempts that fail on their own (non-zero exit) up to this many times,
        /// after 1 s, doubling to at most 5 minutes.
        #[arg(long, default_value_t = 0)]
        max_retries: u32,
        #[arg(long)]
        name: Option<String>,
        /// Environment variable for the job, KEY=VALUE (repeatable).
        #[arg(long = "env", short = 'e', value_parser = parse_env)]
        env: Vec<(String, String)>,
        /// The OCI image to run, REGISTRY/REPOSITORY:TAG or …@sha256:… (nodes that confine
        /// jobs run only images). The command is then optional: the image's entrypoint.
        #[arg(long)]
        image: Option<String>,
        /// The job's network: private (the default: its own, reaching what its tenant's
        /// policy allows and never the node, link-local addresses or other jobs), host (the
        /// node's own, where the tenant's policy allows it) or none (loopback only). Under
        /// --runtime process (allot dev's default) every job is on the node's network.
        #[arg(long)]
        network: Option<String>,
        /// Absolute working directory: inside the container for a job with an image, else
        /// on the node.
        #[arg(long)]
        workdir: Option<String>,
        /// Where the job writes checkpoints: a path inside a volume it mounts (--volume); a
        /// later attempt finds the newest in $ALLOT_RESTORE_FROM.
        #[arg(long)]
        checkpoint_dir: Option<String>,
        /// Mount a named volume: NAME:PATH or NAME:PATH:ro (repeatable; `allot volume
        /// list` shows those you may use).
        #[arg(long = "volume", value_parser = parse_volume)]
        volumes: Vec<serde_json::Value>,
        /// Give the job a tenant secret (`allot tenant set-secret`): NAME=VAR as variable
        /// VAR, or NAME=/run/secrets/FILE as a read-only file (repeatable). Its value
        /// never passes through the job's spec.
        #[arg(long = "secret", value_parser = parse_secret)]
        secrets: Vec<serde_json::Value>,
        /// The longest an attempt may run, e.g. 90m, 2h, 1d12h or 1-12:00:00 (as Slurm's
        /// --time): it is stopped then, and ends timed_out saying so. With a limit, the jobs
        /// behind it get an estimated start.
        #[arg(long, value_parser = parse_time_limit)]
        time_limit: Option<u64>,
        /// Run a multi-node job: this many replicas, each asking for all of the above on a
        /// node, placed all at once or not at all, and requeued, retried, preempted and
        /// cancelled together. Each is told WORLD_SIZE, RANK, NODE_RANK, LOCAL_WORLD_SIZE,
        /// MASTER_ADDR and MASTER_PORT (and torchrun's PET_* defaults), so `torchrun
        /// train.py` runs unchanged.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(allot_domain::MAX_REPLICAS)))]
        replicas: u32,
        /// Of a multi-node job: keep every replica on nodes sharing one value of this node
        /// label (`allot node label`), e.g. `rack`: it waits until one value has room for
        /// all of them; `rack:preferred` packs when it can and places anywhere otherwise.
        #[arg(long, value_parser = parse_pack)]
        pack: Option<serde_json::Value>,
        /// Wait for the job to finish, print its output, and exit with its status.
        #[arg(long)]
        wait: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
        /// The program and its arguments (required without --image).
        #[arg(required_unless_present = "image", last = true)]
        command: Vec<String>,
    },
    /// Show a job, its placement and its state history.
    Get {
        /// Its id, a unique prefix of it (at least 4 characters), or its name if no other
        /// job you see has that name.
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
        #[command(flatten)]
        watch: Watch,
    },
    /// List jobs, newest first.
    List {
        #[arg(long)]
        tenant: Option<String>,
        /// Comma-separated states, e.g. pending,running.
        #[arg(long)]
        state: Option<String>,
        /// Only jobs of this name.
        #[arg(long)]
        name: Option<String>,
        /// Only jobs placed on this node (its name or id).
        #[arg(long)]
        node: Option<String>,
        /// Show at most this many (the server is asked 500 at a time).
        #[arg(long, default_value_t = 50, conflicts_with = "all", value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
        /// Show every job that matches, however many.
        #[arg(long)]
        all: bool,
        /// Go on from where an earlier listing stopped (it prints the token).
        #[arg(long)]
        page_token: Option<String>,
        #[command(flatten)]
        output: ListOutput,
        #[command(flatten)]
        watch: Watch,
    },
    /// Submit a job again as it was submitted (a new job, with a new id): its resources,
    /// image, command, variables, secrets and volumes.
    Resubmit {
        /// The job to submit again: its id, a unique prefix of it, or its name.
        id: String,
        /// A name for the new job (default: the old one's).
        #[arg(long)]
        name: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Cancel a job.
    Cancel {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Give a running job on a share of a GPU (submitted with --gpu-resizable) a new share,
    /// at once.
    Resize {
        id: String,
        /// Its share of each GPU, e.g. 0.4.
        #[arg(long, value_parser = parse_milli)]
        gpus: Option<u64>,
        /// GPU memory it may hold on each, e.g. 20GiB.
        #[arg(long, value_parser = parse_memory)]
        gpu_memory: Option<u64>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Print a job's output (the last 4 MiB of an attempt are kept), with control
    /// characters escaped (a job's output must not drive your terminal).
    Logs {
        id: String,
        /// Keep printing output as it is written, until the job ends (following a requeued
        /// job into its next attempt).
        #[arg(short, long)]
        follow: bool,
        /// Which attempt's output (default: the latest).
        #[arg(long)]
        attempt: Option<u32>,
        /// Of a multi-node job, which replica's output (default: replica 0's).
        #[arg(long)]
        replica: Option<u32>,
        /// Print the bytes as the job wrote them.
        #[arg(long)]
        raw: bool,
        /// `json`: the log as one JSON string, with the job's id (following: one such
        /// object per line as output comes).
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

/// Up to `wanted` jobs matching `query`, from `token` on, asked for a page of at most
/// 500 at a time; the token of the rest, if any.
async fn list_jobs(
    client: &Client,
    query: Vec<(&'static str, String)>,
    wanted: u64,
    mut token: Option<String>,
) -> anyhow::Result<JobList> {
    const PAGE: u64 = 500;
    let mut items = Vec::new();
    loop {
        let left = wanted - items.len() as u64;
        let mut q = query.clone();
        q.push(("limit", left.min(PAGE).to_string()));
        if let Some(t) = &token {
            q.push(("page_token", t.clone()));
        }
        let page: JobList = client.get("/api/v1/jobs", &q).await?;
        items.extend(page.items);
        token = page.next_page_token;
        if token.is_none() || items.len() as u64 >= wanted {
            return Ok(JobList {
                items,
                next_page_token: token,
            });
        }
    }
}

/// How followed output is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogMode {
    /// Control characters escaped.
    Safe,
    /// As the job wrote it.
    Raw,
    /// One JSON object per piece, per line.
    Json,
}

/// Prints a job's output as it is written, until the job ends.
async fn follow_log(
    client: &Client,
    id: &str,
    attempt: Option<u32>,
    mode: LogMode,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut query = vec![("follow", "true".to_owned())];
    if let Some(a) = attempt {
        query.push(("attempt", a.to_string()));
    }
    let mut res = client
        .stream(&format!("/api/v1/jobs/{id}/log"), &query)
        .await?;
    let mut text = crate::output::Utf8Pieces::default();
    let mut out = std::io::stdout().lock();
    let show = |piece: &str, out: &mut std::io::StdoutLock<'_>| -> anyhow::Result<()> {
        if piece.is_empty() {
            return Ok(());
        }
        // Raw bytes never come here: they are written as they arrive.
        if mode == LogMode::Json {
            writeln!(out, "{}", json!({ "job": id, "log": piece }))?;
        } else {
            out.write_all(crate::output::terminal_safe(piece).as_bytes())?;
        }
        out.flush()?;
        Ok(())
    };
    while let Some(bytes) = res.chunk().await.context("reading the job's log")? {
        if mode == LogMode::Raw {
            out.write_all(&bytes)?;
            out.flush()?;
        } else {
            show(&text.push(&bytes), &mut out)?;
        }
    }
    let rest = text.finish();
    show(&rest, &mut out)
}

/// The body that submits `j` again, as it was submitted.
fn resubmission(j: &JobView, name: Option<String>) -> serde_json::Value {
    json!({
        "tenant": j.tenant, "name": name.unwrap_or_else(|| j.name.clone()),
        "gpus": j.gpus, "gpu_milli": j.gpu_milli,
        "gpu_memory_bytes": j.gpu_memory_bytes, "gpu_models": j.gpu_models,
        "cpu_milli": j.cpu_milli, "memory_bytes": j.memory_bytes,
        "priority": j.priority, "preemptible": j.preemptible,
        "isolation": j.isolation, "class": j.class, "max_retries": j.max_retries,
        "command": j.command, "env": j.env, "workdir": j.workdir,
        "checkpoint_dir": j.checkpoint_dir, "volumes": j.volumes, "secrets": j.secrets,
        "mig_profile": j.mig_profile, "gpu_compute": j.gpu_compute,
        "gpu_resizable": j.gpu_resizable, "image": j.image, "network": j.network,
        "time_limit_secs": j.time_limit_secs, "replicas": j.replicas, "pack": j.pack,
    })
}

/// The process exit status for a finished job: 0 on success, the job's own code when it has
/// one, 1 otherwise.
fn exit_status(j: &JobView) -> i32 {
    match (j.state.as_str(), j.exit_code) {
        ("succeeded", _) => 0,
        (_, Some(code)) if (1..=255).contains(&code) => code,
        _ => 1,
    }
}

pub async fn run(client: &Client, cmd: JobCmd) -> anyhow::Result<i32> {
    match cmd {
        JobCmd::Submit {
            tenant,
            gpus,
            gpu_memory,
            gpu_models,
            cpus,
            memory,
            priority,
            not_preemptible,
            isolation,
            mig_profile,
            gpu_compute,
            gpu_resizable,
            class,
            max_retries,
            name,
            env,
            image,
            network,
            workdir,
            checkpoint_dir,
            volumes,
            secrets,
            time_limit,
            replicas,
            pack,
            wait,
            output,
            command,
        } => {
            let env: BTreeMap<_, _> = env.into_iter().collect();
            let mut body = json!({
                "tenant": tenant, "name": name, "gpu_models": gpu_models,
                "cpu_milli": cpus.unwrap_or(0), "memory_bytes": memory.unwrap_or(0),
                "priority": priority, "preemptible": !not_preemptible,
                "isolation": isolation, "class": class, "max_retries": max_retries,
                "command": command, "env": env, "workdir": workdir,
                "checkpoint_dir": checkpoint_dir, "volumes": volumes, "secrets": secrets,
                "mig_profile": mig_profile,
                "gpu_compute": gpu_compute, "gpu_resizable": gpu_resizable,
                "image": image, "network": network, "time_limit_secs": time_limit,
                "replicas": replicas, "pack": pack,
            });
            if let (Some(b), serde_json::Value::Object(gpu)) =
                (body.as_object_mut(), gpu_fields(gpus, gpu_memory)?)
            {
                b.extend(gpu);
            }
            let job: JobView = client
                .call(Method::POST, "/api/v1/jobs", Some(&body))
                .await?;
            if !wait {
                print(output, &job, |j| j.id.clone())?;
                return Ok(0);
            }
            eprintln!("job {} submitted; waiting for it to finish", job.id);
            let path = format!("/api/v1/jobs/{}", job.id);
            let mut last_state = job.state;
            let mut last_reason = None;
            // Its output is printed as it comes, beside the changes of its state.
            let follow = async {
                if !output.is_document() {
                    follow_log(client, &job.id, None, LogMode::Safe).await
                } else {
                    Ok(())
                }
            };
            let watch = async {
                loop {
                    let j: JobView = client.get(&path, &[]).await?;
                    // The end is said once, below.
                    if j.state != last_state && !j.state.is_terminal() {
                        eprintln!("job {}: {}", j.id, j.state);
                        last_state = j.state;
                    }
                    let reason = j.pending_reason.as_ref().map(|r| r.message.clone());
                    if reason.is_some() && reason != last_reason {
                        eprintln!("job {}: pending: {}", j.id, reason.as_deref().unwrap_or(""));
                        last_reason = reason;
                    }
                    if j.state.is_terminal() {
                        break anyhow::Ok(j);
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            };
            let (followed, job) = tokio::join!(follow, watch);
            let job = job?;
            followed?;
            if output.is_document() {
                print(output, &job, |_| String::new())?;
            } else {
                eprintln!(
                    "job {} {}{}",
                    job.id,
                    job.state,
                    job.message
                        .as_ref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                );
            }
            Ok(exit_status(&job))
        }
        JobCmd::Get { id, output, watch } => {
            let path = format!("/api/v1/jobs/{id}");
            watch
                .run(&format!("allot job get {id}"), || async {
                    let j: JobView = client.get(&path, &[]).await?;
                    crate::output::render(output, &j, describe)
                })
                .await?;
            Ok(0)
        }
        JobCmd::Resubmit { id, name, output } => {
            let old: JobView = client.get(&format!("/api/v1/jobs/{id}"), &[]).await?;
            let body = resubmission(&old, name);
            let job: JobView = client
                .call(Method::POST, "/api/v1/jobs", Some(&body))
                .await?;
            print(output, &job, |j| {
                format!("job {} submitted again as {}", old.id, j.id)
            })?;
            Ok(0)
        }
        JobCmd::List {
            tenant,
            state,
            name,
            node,
            limit,
            all,
            page_token,
            output,
            watch,
        } => {
            let mut query = Vec::new();
            if let Some(t) = tenant {
                query.push(("tenant", t));
            }
            if let Some(n) = name {
                query.push(("name", n));
            }
            if let Some(s) = state {
                query.push(("state", s));
            }
            if let Some(n) = node {
                let found: serde_json::Value =
                    client.get(&format!("/api/v1/nodes/{n}"), &[]).await?;
                let id = found["id"].as_str().context("the node's id")?;
                query.push(("node", id.to_owned()));
            }
            let wanted = if all { u64::MAX } else { limit };
            let columns = job_columns();
            output.columns(&columns)?;
            let watching = watch.watch;
            watch
                .run("allot job list", || async {
                    let list = list_jobs(client, query.clone(), wanted, page_token.clone()).await?;
                    let text = output.render(&list, &list.items, &columns)?;
                    let table = !output.output.is_document() || output.format.is_some();
                    if let Some(token) =
                        list.next_page_token.as_ref().filter(|_| table && !watching)
                    {
                        eprintln!(
                            "(more jobs match: --page-token {token} goes on, --all shows them all)"
                        );
                    }
                    Ok(text)
                })
                .await?;
            Ok(0)
        }
        JobCmd::Resize {
            id,
            gpus,
            gpu_memory,
            output,
        } => {
            if gpus.is_none() && gpu_memory.is_none() {
                bail!("give --gpus, --gpu-memory or both");
            }
            if let Some(m) = gpus
                && !(1..1000).contains(&m)
            {
                bail!("--gpus {}: a share of one GPU, under 1", show_milli(m));
            }
            let body = json!({ "gpu_milli": gpus, "gpu_memory_bytes": gpu_memory });
            let j: JobView = client
                .call(
                    Method::POST,
                    &format!("/api/v1/jobs/{id}/resize"),
                    Some(&body),
                )
                .await?;
            print(output, &j, |j| {
                format!(
                    "job {} now holds {}{}",
                    j.id,
                    gpus_of(j),
                    j.gpu_memory_bytes
                        .map(|b| format!(" with {}", format_bytes(b)))
                        .unwrap_or_default()
                )
            })?;
            Ok(0)
        }
        JobCmd::Cancel { id, output } => {
            let j: JobView = client
                .call::<(), _>(Method::POST, &format!("/api/v1/jobs/{id}/cancel"), None)
                .await?;
            if !j.state.is_terminal() && !j.cancel_requested {
                bail!("job {} is {} and was not cancelled", j.id, j.state);
            }
            print(output, &j, |j| {
                if j.state.is_terminal() {
                    format!("job {} {}", j.id, j.state)
                } else {
                    format!(
                        "job {}: cancellation requested; its node is stopping it",
                        j.id
                    )
                }
            })?;
            Ok(0)
        }
        JobCmd::Logs {
            id,
            follow,
            attempt,
            replica,
            raw,
            output,
        } => {
            // A replica's output is its own record's.
            let id = match replica {
                None => id,
                Some(rank) => {
                    let gang: JobView = client.get(&format!("/api/v1/jobs/{id}"), &[]).await?;
                    let replicas = gang.gang.unwrap_or_default();
                    match replicas.iter().find(|r| r.rank == rank) {
                        Some(r) => r.id.clone(),
                        None if replicas.is_empty() => {
                            anyhow::bail!("--replica: job {} is not a multi-node job", gang.id)
                        }
                        None => anyhow::bail!(
                            "--replica: job {} has replicas 0 to {}",
                            gang.id,
                            replicas.len() - 1
                        ),
                    }
                }
            };
            if follow {
                let mode = match (output.is_document(), raw) {
                    (true, _) => LogMode::Json,
                    (false, true) => LogMode::Raw,
                    (false, false) => LogMode::Safe,
                };
                follow_log(client, &id, attempt, mode).await?;
                return Ok(0);
            }
            let query: Vec<(&str, String)> = attempt
                .map(|a| ("attempt", a.to_string()))
                .into_iter()
                .collect();
            let bytes = client
                .get_bytes(&format!("/api/v1/jobs/{id}/log"), &query)
                .await?;
            if bytes.is_empty() && !output.is_document() {
                // Nothing yet: say why, rather than print nothing.
                let j: JobView = client.get(&format!("/api/v1/jobs/{id}"), &[]).await?;
                if attempt.is_none() && j.started_at.is_none() && !j.state.is_terminal() {
                    let waiting = j.pending_reason.as_ref().map_or_else(
                        || j.state.to_string(),
                        |r| format!("{}: {}", j.state, r.message),
                    );
                    let earlier = if j.attempt > 1 {
                        format!(
                            "; `--attempt {}` shows the last attempt's output",
                            j.attempt - 1
                        )
                    } else {
                        String::new()
                    };
                    eprintln!(
                        "job {} has not started yet ({waiting}); `allot job logs {} -f` waits for its output{earlier}",
                        j.id, j.id
                    );
                } else {
                    eprintln!("job {} has written no output", j.id);
                }
                return Ok(0);
            }
            if raw {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                out.write_all(&bytes)?;
                out.flush()?;
                return Ok(0);
            }
            let log = String::from_utf8_lossy(&bytes).into_owned();
            if output.is_document() {
                print(output, &json!({ "job": id, "log": log }), |_| String::new())?;
            } else {
                print!("{}", crate::output::terminal_safe(&log));
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{GpuMemory, Gpus, gpu_fields, parse_gpu_memory, parse_gpus, parse_time_limit};

    #[test]
    fn gpus_read_as_counts_shares_or_auto() {
        assert_eq!(parse_gpus("2"), Ok(Gpus::Milli(2000)));
        assert_eq!(parse_gpus("0.25"), Ok(Gpus::Milli(250)));
        assert_eq!(parse_gpus("auto"), Ok(Gpus::Auto(None)));
        assert_eq!(parse_gpus("auto:0.5"), Ok(Gpus::Auto(Some(500))));
        assert_eq!(parse_gpus("auto:1"), Ok(Gpus::Auto(Some(1000))));
        for bad in [
            "auto:0",
            "auto:0.01",
            "auto:2",
            "auto0.5",
            "auto:",
            "autox",
            "AUTO",
        ] {
            assert!(parse_gpus(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_gpu_memory("auto"), Ok(GpuMemory::Auto));
        assert_eq!(parse_gpu_memory("1GiB"), Ok(GpuMemory::Bytes(1 << 30)));
    }

    #[test]
    fn auto_sizes_memory_too_unless_it_is_given() {
        let body = gpu_fields(Gpus::Auto(Some(500)), None).expect("auto");
        assert_eq!(body["gpus"], 1);
        assert_eq!(body["gpu_sizing"]["compute"], true);
        assert_eq!(body["gpu_sizing"]["max_milli"], 500);
        assert_eq!(body["gpu_sizing"]["memory"], true);
        let body = gpu_fields(Gpus::Auto(None), Some(GpuMemory::Bytes(1 << 30))).expect("auto");
        assert_eq!(body["gpu_sizing"]["memory"], false);
        assert_eq!(body["gpu_memory_bytes"], 1u64 << 30);
        let body = gpu_fields(Gpus::Milli(300), Some(GpuMemory::Auto)).expect("memory");
        assert_eq!(body["gpu_sizing"]["memory"], true);
        assert_eq!(body["gpu_milli"], 300);
        let err = gpu_fields(Gpus::Milli(2000), Some(GpuMemory::Auto)).expect_err("whole GPUs");
        assert!(err.to_string().contains("--gpu-memory auto"), "{err}");
    }

    #[test]
    fn time_limits_read_as_slurm_and_people_write_them() {
        assert_eq!(parse_time_limit("90m"), Ok(5400));
        assert_eq!(parse_time_limit("2h"), Ok(7200));
        assert_eq!(parse_time_limit("1d12h"), Ok(129_600));
        assert_eq!(parse_time_limit("45s"), Ok(45));
        assert_eq!(parse_time_limit("1-12:00:00"), Ok(129_600));
        assert_eq!(parse_time_limit("00:30:00"), Ok(1800));
        for bad in ["", "90", "0m", "2x", "1:2", "00:61:00", "h", "-1h"] {
            assert!(parse_time_limit(bad).is_err(), "{bad}");
        }
    }
}
