use std::collections::BTreeMap;
use std::time::Duration;

use allot_api::views::{JobList, JobView};
use allot_domain::job::Elapsed;
use allot_domain::{
    GpuCompute, Isolation, WorkloadClass, format_bytes, format_duration, parse_memory,
    parse_priority,
};
use anyhow::{Context, bail};
use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

use crate::client::Client;
use crate::cmd::{opt, parse_milli, show_milli};
use crate::output::{Column, Format, ListOutput, Watch, fields, print, table};

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
        /// with exponential backoff from 1 s.
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

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

fn short(ts: Option<chrono::DateTime<chrono::Utc>>) -> String {
    opt(ts.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string()))
}

/// What Allot sizes of the job's share: its share and memory, or `-`. Each resize and
/// why is in the history below.
fn sizing_of(j: &JobView) -> String {
    let Some(s) = j.gpu_sizing else {
        return "-".into();
    };
    let mut what = Vec::new();
    if s.compute {
        what.push(format!(
            "share (up to {} of a GPU)",
            show_milli(u64::from(s.max_milli.unwrap_or(allot_domain::GPU_MILLI)))
        ));
    }
    if s.memory {
        what.push("GPU memory".to_owned());
    }
    format!("{} (resizes below, with why)", what.join(" and "))
}

fn describe(j: &JobView) -> String {
    let mut out = fields(&[
        ("ID", allot_domain::job::short_id(&j.id).to_owned()),
        ("UUID", j.id.clone()),
        ("Name", j.name.clone()),
        ("Tenant", j.tenant.clone()),
        ("State", j.state.to_string()),
        (
            "Reason",
            opt(j
                .pending_reason
                .as_ref()
                .map(|r| format!("{} ({})", r.message, r.code))),
        ),
        ("Queue", queue_of(j)),
        ("Estimated start", start_of(j)),
        ("Elapsed", elapsed(j, chrono::Utc::now())),
        (
            "Time limit",
            opt(j
                .time_limit_secs
                .map(|s| format_duration(i64::try_from(s).unwrap_or(i64::MAX)))),
        ),
        ("GPUs", gpus_of(j)),
        (
            "Replicas",
            match (&j.gang_id, j.rank) {
                (Some(g), Some(r)) => format!("replica {r} of {} of job {g}", j.replicas),
                _ => j.replicas.to_string(),
            },
        ),
        (
            "GPU memory",
            match (j.gpu_memory_bytes, j.gpu_sizing.is_some_and(|s| s.memory)) {
                (Some(b), true) => format!("{} (sized by Allot)", format_bytes(b)),
                (Some(b), false) => format_bytes(b),
                (None, true) => "its share of the GPU's memory, until Allot sizes it".into(),
                (None, false) => "-".into(),
            },
        ),
        (
            "GPU models",
            if j.gpu_models.is_empty() {
                "any".into()
            } else {
                j.gpu_models.join(",")
            },
        ),
        ("CPUs", show_milli(u64::from(j.cpu_milli))),
        ("Memory", format_bytes(j.memory_bytes)),
        ("Priority", j.priority.to_string()),
        ("Preemptible", j.preemptible.to_string()),
        ("Isolation", opt(j.isolation)),
        ("MIG profile", opt(j.mig_profile.as_ref())),
        ("GPU compute", opt(j.gpu_compute)),
        ("Sized by Allot", sizing_of(j)),
        ("Class", opt(j.class)),
        ("Attempt", j.attempt.to_string()),
        (
            "Retries",
            format!("{} of {} used", j.failures, j.max_retries),
        ),
        ("Borrowing", j.borrowing.to_string()),
        ("Preempting", opt(j.preempt_reason.clone())),
        ("Command", j.command.join(" ")),
        (
            "Node",
            match (&j.node_name, &j.node_id) {
                (Some(name), Some(id)) => format!("{name} ({id})"),
                (_, id) => opt(id.clone()),
            },
        ),
        (
            "NVLink domains",
            if j.nvlink_domains.is_empty() {
                "-".into()
            } else {
                j.nvlink_domains
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ),
        (
            "Pack",
            j.pack.as_ref().map_or("-".into(), |p| {
                format!(
                    "within one {} ({})",
                    p.label,
                    if p.required { "required" } else { "preferred" }
                )
            }),
        ),
        (
            "GPU UUIDs",
            if j.gpu_uuids.is_empty() {
                "-".into()
            } else {
                j.gpu_uuids.join(",")
            },
        ),
        ("PID", opt(j.pid)),
        ("Exit code", opt(j.exit_code)),
        ("Message", opt(j.message.clone())),
        ("Created", short(Some(j.created_at))),
        ("Started", short(j.started_at)),
        ("Finished", short(j.finished_at)),
    ]);
    if let Some(gang) = &j.gang {
        let rows: Vec<_> = gang
            .iter()
            .map(|r| {
                vec![
                    r.rank.to_string(),
                    r.id.clone(),
                    r.state.to_string(),
                    r.attempt.to_string(),
                    opt(r.node_name.clone().or(r.node_id.clone())),
                    opt(r.exit_code),
                    opt(r.message.clone()),
                ]
            })
            .collect();
        out.push_str("\n\nReplicas:\n");
        out.push_str(&table(
            &["RANK", "ID", "STATE", "ATTEMPT", "NODE", "EXIT", "MESSAGE"],
            &rows,
        ));
    }
    if let Some(events) = &j.events {
        let rows: Vec<_> = events
            .iter()
            .map(|e| {
                vec![
                    e.at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                    opt(e.from.clone()),
                    e.to.clone(),
                    opt(e.message.clone()),
                ]
            })
            .collect();
        out.push_str("\n\nEvents:\n");
        out.push_str(&table(&["TIME", "FROM", "TO", "MESSAGE"], &rows));
    }
    out
}

/// A pending job's place in its tenant's queue: "2 of 7 in ml's queue".
fn queue_of(j: &JobView) -> String {
    match (j.queue_position, j.queue_length) {
        (Some(p), Some(n)) => format!("{p} of {n} in {}'s queue", j.tenant),
        _ => "-".into(),
    }
}

/// A pending job's estimated start, and how far off it is.
fn start_of(j: &JobView) -> String {
    match j.estimated_start {
        Some(t) => {
            let wait = (t - chrono::Utc::now()).num_seconds();
            if wait <= 0 {
                format!("{} (now: GPUs are free for it)", short(Some(t)))
            } else {
                format!("{} (in {})", short(Some(t)), format_duration(wait))
            }
        }
        None if j.state == allot_domain::JobState::Pending => {
            "unknown (a job it waits behind has no time limit, or it asks for no GPU)".into()
        }
        None => "-".into(),
    }
}

/// `--pack`: `rack` (required) or `rack:preferred`.
fn parse_pack(s: &str) -> Result<serde_json::Value, String> {
    let (label, required) = match s.split_once(':') {
        None => (s, true),
        Some((l, "preferred")) => (l, false),
        Some((l, "required")) => (l, true),
        Some(_) => return Err("expected LABEL, LABEL:required or LABEL:preferred".into()),
    };
    allot_domain::node::check_label_name(label)?;
    Ok(json!({ "label": label, "required": required }))
}

/// `--time-limit`: `90m`, `2h`, `1d12h`, `45s`, or Slurm's `[D-]HH:MM:SS`, as seconds.
fn parse_time_limit(s: &str) -> Result<u64, String> {
    let bad =
        || format!("`{s}` is not a time limit: give units (90m, 2h, 1d12h, 45s) or [D-]HH:MM:SS");
    let s = s.trim();
    let secs = if s.contains(':') {
        let (days, clock) = match s.split_once('-') {
            Some((d, c)) => (d.parse::<u64>().map_err(|_| bad())?, c),
            None => (0, s),
        };
        let parts: Vec<u64> = clock
            .split(':')
            .map(|p| p.parse::<u64>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let [h, m, sec] = parts[..] else {
            return Err(bad());
        };
        if m >= 60 || sec >= 60 {
            return Err(bad());
        }
        days * 86_400 + h * 3600 + m * 60 + sec
    } else {
        let mut total = 0u64;
        let mut digits = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return Err(bad()),
            };
            let n: u64 = digits.parse().map_err(|_| bad())?;
            total = n
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(bad)?;
            digits.clear();
        }
        if !digits.is_empty() {
            return Err(bad());
        }
        total
    };
    if secs == 0 {
        return Err(bad());
    }
    Ok(secs)
}

/// How long `j` has been in its phase, and which (see `allot_domain::job::elapsed`); none
/// for a state this client does not know.
fn elapsed_of(
    j: &JobView,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<(Elapsed, chrono::Duration)> {
    Some(allot_domain::job::elapsed(
        j.state,
        j.attempt,
        j.created_at,
        j.updated_at,
        j.started_at,
        j.finished_at,
        now,
    ))
}

/// How long a job has been in its phase as people read it: "running 3m 5s", "ran 2h 0m",
/// "waiting 42s".
fn elapsed(j: &JobView, now: chrono::DateTime<chrono::Utc>) -> String {
    let Some((phase, span)) = elapsed_of(j, now) else {
        return "-".into();
    };
    let what = match phase {
        Elapsed::Running => "running",
        Elapsed::Ran => "ran",
        Elapsed::EndedUnstarted => "ended after",
        Elapsed::Waiting => "waiting",
        Elapsed::InState => "for",
    };
    format!("{what} {}", format_duration(span.num_seconds()))
}

/// The TIME column: how long it ran, runs or waits, as squeue shows it (D-HH:MM:SS).
fn time_cell(j: &JobView) -> String {
    match elapsed_of(j, chrono::Utc::now()) {
        Some((Elapsed::Running | Elapsed::Ran | Elapsed::Waiting, span)) => {
            clock(span.num_seconds())
        }
        _ => "-".into(),
    }
}

/// Seconds as D-HH:MM:SS (days only when there are some), as Slurm shows times.
fn clock(secs: i64) -> String {
    let s = secs.max(0);
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// What `job list` can show of a job (`--format` names, `-o wide` all).
fn job_columns() -> [Column<JobView>; 22] {
    [
        Column::new("id", "ID", |j| {
            allot_domain::job::short_id(&j.id).to_owned()
        }),
        Column::new("tenant", "TENANT", |j| j.tenant.clone()),
        Column::new("name", "NAME", |j| j.name.clone()),
        Column::new("state", "STATE", |j| j.state.to_string()),
        Column::new("gpus", "GPUS", gpus_cell),
        Column::new("time", "TIME", time_cell),
        Column::new("created", "CREATED", |j| short(Some(j.created_at))),
        Column::wide("queue", "QUEUE", |j| {
            match (j.queue_position, j.queue_length) {
                (Some(p), Some(n)) => format!("{p}/{n}"),
                _ => "-".into(),
            }
        }),
        Column::wide("node", "NODE", |j| {
            opt(j.node_name.clone().or(j.node_id.clone()))
        }),
        Column::wide("priority", "PRIORITY", |j| j.priority.to_string()),
        Column::wide("class", "CLASS", |j| opt(j.class)),
        Column::wide("cpus", "CPUS", |j| show_milli(u64::from(j.cpu_milli))),
        Column::wide("memory", "MEMORY", |j| format_bytes(j.memory_bytes)),
        Column::wide("gpu_memory", "GPU MEMORY", |j| {
            opt(j.gpu_memory_bytes.map(format_bytes))
        }),
        Column::wide("start", "EST. START", |j| match j.estimated_start {
            Some(t) => short(Some(t)),
            None => "-".into(),
        }),
        Column::wide("limit", "LIMIT", |j| {
            opt(j
                .time_limit_secs
                .map(|s| clock(i64::try_from(s).unwrap_or(i64::MAX))))
        }),
        Column::wide("attempt", "ATTEMPT", |j| j.attempt.to_string()),
        Column::wide("image", "IMAGE", |j| opt(j.image.clone())),
        Column::wide("started", "STARTED", |j| short(j.started_at)),
        Column::wide("finished", "FINISHED", |j| short(j.finished_at)),
        Column::wide("uuid", "UUID", |j| j.id.clone()),
        Column::new("detail", "DETAIL", |j| {
            match (&j.pending_reason, j.exit_code) {
                (Some(r), _) => r.message.clone(),
                (None, Some(c)) => format!("exit {c}"),
                (None, None) => j.message.clone().unwrap_or_default(),
            }
        }),
    ]
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

/// "2", "0.25 of a shared GPU" (what the placement holds, once placed), a MIG instance as
/// its compute slices of seven, a gang as replicas × each = all.
fn gpus_of(j: &JobView) -> String {
    if let Some(profile) = &j.mig_profile {
        return match allot_domain::mig::profile_named(profile) {
            Some(p) => format!(
                "{} of a GPU (a MIG instance {profile}: {} of its 7 compute slices)",
                allot_domain::GpuParts::slices(p.compute_slices),
                p.compute_slices
            ),
            None => format!("a MIG instance {profile}"),
        };
    }
    let share = j.held_gpu_milli.or(j.gpu_milli).unwrap_or(1000);
    let each = if j.gpu_compute == Some(GpuCompute::BestEffort) {
        "best-effort on one shared GPU (no share of its own: what its other jobs leave)".into()
    } else if j.gpu_sizing.is_some_and(|s| s.compute) {
        format!(
            "{} of a shared GPU, sized by Allot",
            show_milli(u64::from(share))
        )
    } else if j.gpus == 1 && share < 1000 {
        format!("{} of a shared GPU", show_milli(u64::from(share)))
    } else {
        j.gpus.to_string()
    };
    if j.replicas > 1 {
        format!("{} ({each} for each replica)", gpus_cell(j))
    } else {
        each
    }
}

/// The GPUS column of `job list`: "2", "0.25" for a share of one GPU, the profile for a
/// MIG instance ("1g.18gb"), and for a gang its replicas × each = all ("4 × 8 = 32").
/// A share Allot sizes reads "0.25 auto" (sized to a quarter now), best-effort work "be".
fn gpus_cell(j: &JobView) -> String {
    if let Some(profile) = &j.mig_profile {
        return profile.clone();
    }
    if j.gpu_compute == Some(GpuCompute::BestEffort) {
        return "be".into();
    }
    let size =
        allot_domain::GangSize::new(j.replicas, j.gpus, j.held_gpu_milli.or(j.gpu_milli), None)
            .to_string();
    if j.gpu_sizing.is_some_and(|s| s.compute) {
        format!("{size} auto")
    } else {
        size
    }
}

/// `--gpus` as the API's GPU count and per-GPU share.
/// What `--gpus` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpus {
    /// Thousandths: whole GPUs (multiples of 1000) or a share of one.
    Milli(u64),
    /// A share Allot sizes, up to this many thousandths (a whole GPU when not said).
    Auto(Option<u64>),
}

fn parse_gpus(s: &str) -> Result<Gpus, String> {
    match s.trim().strip_prefix("auto") {
        None if s.trim().eq_ignore_ascii_case("auto") => {
            Err(format!("`{s}`: write auto in lowercase"))
        }
        Some("") => Ok(Gpus::Auto(None)),
        Some(rest) => {
            let max = rest.strip_prefix(':').ok_or_else(|| {
                format!("`{s}`: write auto, or auto:MAX with MAX a share like 0.5")
            })?;
            match parse_milli(max)? {
                m @ 20..=1000 => Ok(Gpus::Auto(Some(m))),
                _ => Err(format!(
                    "`{s}`: auto:MAX takes a ceiling from 0.02 (the smallest share Allot sizes \
                     a job to) to 1 (a whole GPU)"
                )),
            }
        }
        None => parse_milli(s).map(Gpus::Milli),
    }
}

/// What `--gpu-memory` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMemory {
    Bytes(u64),
    Auto,
}

fn parse_gpu_memory(s: &str) -> Result<GpuMemory, String> {
    if s.trim() == "auto" {
        Ok(GpuMemory::Auto)
    } else {
        parse_memory(s).map(GpuMemory::Bytes)
    }
}

/// The submit body's `gpus`, `gpu_milli`, `gpu_memory_bytes` and `gpu_sizing`.
fn gpu_fields(gpus: Gpus, memory: Option<GpuMemory>) -> anyhow::Result<serde_json::Value> {
    let bytes = match memory {
        Some(GpuMemory::Bytes(b)) => Some(b),
        _ => None,
    };
    let memory_auto = memory == Some(GpuMemory::Auto);
    Ok(match gpus {
        Gpus::Auto(max) => json!({
            "gpus": 1, "gpu_memory_bytes": bytes,
            "gpu_sizing": { "compute": true, "max_milli": max, "memory": memory_auto || bytes.is_none() },
        }),
        Gpus::Milli(milli) => {
            let (gpus, gpu_milli) = gpu_request(milli)?;
            if memory_auto && gpu_milli.is_none() {
                bail!(
                    "--gpu-memory auto sizes the memory of a share of one GPU: ask for --gpus \
                     auto or a share under 1"
                );
            }
            json!({
                "gpus": gpus, "gpu_milli": gpu_milli, "gpu_memory_bytes": bytes,
                "gpu_sizing": memory_auto.then(|| json!({ "memory": true })),
            })
        }
    })
}

fn gpu_request(milli: u64) -> anyhow::Result<(u64, Option<u64>)> {
    match milli {
        0 => Ok((0, None)),
        m if m < 1000 => Ok((1, Some(m))),
        m if m % 1000 == 0 => Ok((m / 1000, None)),
        m => bail!(
            "--gpus {}: ask for whole GPUs, or a fraction of one GPU (under 1)",
            show_milli(m)
        ),
    }
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

/// `NAME=VAR` or `NAME=/run/secrets/FILE` as the API's secret use.
fn parse_secret(s: &str) -> Result<serde_json::Value, String> {
    match s.split_once('=') {
        Some((secret, to)) if !secret.is_empty() && to.starts_with('/') => {
            Ok(json!({ "secret": secret, "file": to }))
        }
        Some((secret, to)) if !secret.is_empty() && !to.is_empty() => {
            Ok(json!({ "secret": secret, "env": to }))
        }
        _ => Err("expected NAME=VAR or NAME=/run/secrets/FILE".into()),
    }
}

/// `NAME:PATH[:ro]` as the API's volume mount.
fn parse_volume(s: &str) -> Result<serde_json::Value, String> {
    let mut parts = s.splitn(3, ':');
    let (Some(volume), Some(path)) = (parts.next(), parts.next()) else {
        return Err("expected NAME:PATH or NAME:PATH:ro".into());
    };
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(other) => return Err(format!("`{other}`: the mode is ro or rw")),
    };
    if volume.is_empty() || path.is_empty() {
        return Err("expected NAME:PATH or NAME:PATH:ro".into());
    }
    Ok(json!({ "volume": volume, "path": path, "read_only": read_only }))
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
