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

mod batch;
mod bulk;
mod flags;
mod show;

use flags::*;
use show::*;

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum JobCmd {
    /// Submit a job: `allot job submit --tenant T --gpus 1 -- python train.py`, or a batch
    /// script: `allot job submit train.sh` (its #SBATCH and #ALLOT directives read).
    // A flag given twice takes its last value: a script's directives come first, so the
    // command line's win.
    #[command(args_override_self = true)]
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
        #[arg(long, value_parser = flags::parse_cpus)]
        cpus: Option<u64>,
        /// Memory reserved on the node and the job's memory limit, e.g. 16GiB (default: the
        /// tenant's).
        #[arg(long, value_parser = flags::parse_job_memory)]
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
        /// Submit an array of tasks, as Slurm's --array: 0-199, 1,3,5-9 or 0-99:10, with %N
        /// to run at most N at once (0-199%16). Each task is a job told its index in
        /// ALLOT_ARRAY_TASK_ID (and SLURM_ARRAY_TASK_ID); the array's id is its first task's.
        #[arg(long, short = 'a')]
        array: Option<String>,
        /// Start only after these jobs succeeded (ids, short ids or names, comma-separated;
        /// an array's id stands for all its tasks). If one fails, this job is cancelled.
        #[arg(long, value_delimiter = ',')]
        after_ok: Vec<String>,
        /// Start only after these jobs ended, however they ended.
        #[arg(long, value_delimiter = ',')]
        after_any: Vec<String>,
        /// Start only after these jobs ended without succeeding (failed, cancelled, timed
        /// out). If one succeeds, this job is cancelled.
        #[arg(long, value_delimiter = ',')]
        after_not_ok: Vec<String>,
        /// Slurm's --dependency: afterok:ID[:ID…][,afterany:ID…][,afternotok:ID…].
        #[arg(long, short = 'd')]
        dependency: Option<String>,
        /// A batch script's directives it does not know (#SBATCH --partition …) are
        /// skipped, each said on standard error, rather than refused.
        #[arg(long)]
        ignore_unknown_directives: bool,
        /// Wait for the job to finish, print its output, and exit with its status.
        #[arg(long)]
        wait: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
        /// A batch script to run: its #ALLOT directives (any of these flags) and the common
        /// #SBATCH ones (--gres=gpu:N, --gpus, -c, --mem, -t, -J, -a, -d, -N, --exclusive;
        /// -o and -e accepted and not applied, as Allot keeps each job's output) are read
        /// from its header, the flags given here taking precedence; the script runs with
        /// its own interpreter (its #! line, else sh), given the arguments after `--`.
        #[arg(conflicts_with = "image")]
        script: Option<std::path::PathBuf>,
        /// The program and its arguments (required without --image or a script).
        #[arg(required_unless_present_any = ["image", "script"], last = true)]
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
        /// Only jobs of this name, or matching this glob (`*` any run of characters, `?`
        /// any one): 'sweep-*'.
        #[arg(long)]
        name: Option<String>,
        /// Only jobs placed on this node (its name or id).
        #[arg(long)]
        node: Option<String>,
        /// Only jobs submitted by this person or token (the USER column).
        #[arg(long)]
        user: Option<String>,
        /// Only the tasks of this array (its id or a unique prefix), each listed.
        #[arg(long)]
        array: Option<String>,
        /// List each task of an array, rather than the array once with its tasks' counts.
        #[arg(long, short = 'x')]
        expand: bool,
        /// Order by these columns, comma-separated, `-` first for descending (e.g.
        /// -priority,submitted): id, name, user, tenant, state, priority, submitted, gpus.
        /// Sorts what is listed (with --all, everything that matches).
        #[arg(long, value_parser = parse_sort, allow_hyphen_values = true)]
        sort: Option<SortKeys>,
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
        /// Of an array: submit again only its tasks that failed, cancelled or timed out,
        /// as a new array of those indices (with the same cap).
        #[arg(long)]
        failed: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Cancel jobs: by id (one or more), or every unfinished job a selection matches
    /// (`--name 'sweep-*'`, `--state`, `--tenant`, `--user`, `--array`), after saying how
    /// many and asking (`--yes` for scripts).
    Cancel {
        /// Jobs by id, unique prefix or name.
        #[arg(required_unless_present_any = ["name", "state", "tenant", "user", "array"])]
        ids: Vec<String>,
        #[command(flatten)]
        selection: bulk::Selection,
        /// Cancel what the selection matches without asking.
        #[arg(long, short = 'y')]
        yes: bool,
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
        /// Only the last N lines (following: then what comes).
        #[arg(long, short = 'n')]
        tail: Option<usize>,
        /// Only what it wrote in the last while, e.g. 10m or 2h, or since a time (RFC 3339,
        /// 2026-12-05T12:00:00Z): from the first output the control plane received since
        /// (it arrives every half second or so).
        #[arg(long, value_parser = flags::parse_since)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Start each line with when the control plane received it (RFC 3339, UTC; output
        /// arrives every half second or so, so that is how close it is to when it was written).
        #[arg(long)]
        timestamps: bool,
        /// `json`: the log as one JSON string, with the job's id (following: one such
        /// object per line as output comes).
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

/// The tasks of each array together, in index order, where the first of them was (the
/// rest stay in the order given).
fn tasks_in_order(jobs: &mut Vec<JobView>) {
    let mut first: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut keyed: Vec<((usize, u32), JobView)> = std::mem::take(jobs)
        .into_iter()
        .enumerate()
        .map(|(i, j)| {
            let key = match &j.array_id {
                Some(a) => (
                    *first.entry(a.clone()).or_insert(i),
                    j.array_index.unwrap_or(0),
                ),
                None => (i, 0),
            };
            (key, j)
        })
        .collect();
    keyed.sort_by_key(|(k, _)| *k);
    jobs.extend(keyed.into_iter().map(|(_, j)| j));
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
    offset: Option<u64>,
    mode: LogMode,
    timestamps: bool,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut query = vec![("follow", "true".to_owned())];
    if timestamps {
        query.push(("timestamps", "true".to_owned()));
    }
    if let Some(a) = attempt {
        query.push(("attempt", a.to_string()));
    }
    if let Some(o) = offset {
        query.push(("offset", o.to_string()));
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

/// For `allot job submit SCRIPT`: the command line `argv` with the script's directives
/// put right after `submit`, so that the flags given there override them; `None` when it
/// submits no script.
pub fn with_directives(
    argv: &[std::ffi::OsString],
) -> anyhow::Result<Option<Vec<std::ffi::OsString>>> {
    let Some(submit) = argv
        .windows(2)
        .position(|w| w[0] == "job" && w[1] == "submit")
        .map(|i| i + 1)
    else {
        return Ok(None);
    };
    // The script is the one positional before `--`; find it as clap did.
    let rest = &argv[submit + 1..];
    let ignore = rest.iter().any(|a| a == "--ignore-unknown-directives");
    let Some(path) = script_of(rest) else {
        return Ok(None);
    };
    let script = batch::Script::read(&path)?;
    let allowed = submit_flags();
    let flags = batch::directives(&script.text, ignore, &|f| allowed.contains(f))
        .with_context(|| format!("{}", path.display()))?;
    let mut out = argv[..=submit].to_vec();
    out.extend(flags.into_iter().map(Into::into));
    out.extend(rest.iter().cloned());
    Ok(Some(out))
}

/// The `allot job` commands alone, without the top-level command's global options: what
/// a batch script's directives are read against.
#[derive(clap::Parser)]
struct JobOnly {
    #[command(subcommand)]
    cmd: JobCmd,
}

/// `allot job submit`'s own flags (`--priority`, `-e`, …): what a script may set. The
/// global ones (`--server`, `--token`, `--ca-cert`, …) are the top-level command's, not
/// in it.
fn submit_flags() -> std::collections::HashSet<String> {
    let cmd = <JobOnly as clap::CommandFactory>::command();
    let Some(submit) = cmd.find_subcommand("submit") else {
        return Default::default();
    };
    submit
        .get_arguments()
        .flat_map(|a| {
            a.get_long()
                .map(|l| format!("--{l}"))
                .into_iter()
                .chain(a.get_short().map(|c| format!("-{c}")))
        })
        .filter(|f| !matches!(f.as_str(), "--help" | "-h"))
        .collect()
}

/// The script positional of `allot job submit`'s arguments, as parsed.
fn script_of(rest: &[std::ffi::OsString]) -> Option<std::path::PathBuf> {
    use clap::FromArgMatches;
    let mut argv: Vec<std::ffi::OsString> = vec!["allot-job".into(), "submit".into()];
    argv.extend(rest.iter().cloned());
    let matches = <JobOnly as clap::CommandFactory>::command()
        .ignore_errors(true)
        .try_get_matches_from(argv)
        .ok()?;
    match JobOnly::from_arg_matches(&matches).ok()?.cmd {
        JobCmd::Submit { script, .. } => script,
        _ => None,
    }
}

/// A column `job list --sort` orders by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Id,
    Name,
    User,
    Tenant,
    State,
    Priority,
    Submitted,
    Gpus,
}

/// What `--sort` orders by: each key, and whether descending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKeys(Vec<(SortKey, bool)>);

/// `-priority,submitted`: each key, and whether descending.
fn parse_sort(s: &str) -> Result<SortKeys, String> {
    s.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(|k| {
            let (desc, name) = match k.strip_prefix('-') {
                Some(n) => (true, n),
                None => (false, k.strip_prefix('+').unwrap_or(k)),
            };
            let key = match name {
                "id" => SortKey::Id,
                "name" => SortKey::Name,
                "user" => SortKey::User,
                "tenant" => SortKey::Tenant,
                "state" => SortKey::State,
                "priority" => SortKey::Priority,
                "submitted" | "created" => SortKey::Submitted,
                "gpus" => SortKey::Gpus,
                other => {
                    return Err(format!(
                        "`{other}`: sort by id, name, user, tenant, state, priority, submitted or gpus"
                    ));
                }
            };
            Ok((key, desc))
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|keys| {
            if keys.is_empty() {
                Err("name a column to sort by".into())
            } else {
                Ok(SortKeys(keys))
            }
        })
}

/// Orders `jobs` by `keys` (stable: the server's order breaks ties).
fn sort_jobs(jobs: &mut [JobView], keys: &[(SortKey, bool)]) {
    use std::cmp::Ordering;
    jobs.sort_by(|a, b| {
        for &(key, desc) in keys {
            let o = match key {
                SortKey::Id => a.id.cmp(&b.id),
                SortKey::Name => a.name.cmp(&b.name),
                SortKey::User => a.user.cmp(&b.user),
                SortKey::Tenant => a.tenant.cmp(&b.tenant),
                SortKey::State => a.state.cmp(&b.state),
                SortKey::Priority => a.priority.cmp(&b.priority),
                SortKey::Submitted => a.created_at.cmp(&b.created_at),
                SortKey::Gpus => (u64::from(a.gpus) * u64::from(a.gpu_milli.unwrap_or(1000)))
                    .cmp(&(u64::from(b.gpus) * u64::from(b.gpu_milli.unwrap_or(1000)))),
            };
            let o = if desc { o.reverse() } else { o };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    });
}

/// The dependencies the flags give, as the API takes them.
fn dependencies(
    after_ok: &[String],
    after_any: &[String],
    after_not_ok: &[String],
    slurm: Option<&str>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    use allot_domain::workflow::{DependencyKind, parse_slurm_dependency};
    let mut out: Vec<(DependencyKind, String)> = Vec::new();
    for (kind, ids) in [
        (DependencyKind::AfterOk, after_ok),
        (DependencyKind::AfterAny, after_any),
        (DependencyKind::AfterNotOk, after_not_ok),
    ] {
        out.extend(
            ids.iter()
                .map(|i| i.trim())
                .filter(|i| !i.is_empty())
                .map(|i| (kind, i.to_owned())),
        );
    }
    if let Some(d) = slurm {
        out.extend(parse_slurm_dependency("--dependency", d).map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    Ok(out
        .into_iter()
        .map(|(kind, job)| json!({ "kind": kind.as_str(), "job": job }))
        .collect())
}

/// A span as people write it (`10m`, `2h`, `1d12h`, `45s`, `[D-]HH:MM:SS`), in seconds.
pub fn parse_duration_secs(s: &str) -> Result<u64, String> {
    parse_time_limit(s)
}

/// The last `n` lines of `bytes` (a last line without its newline counts).
fn last_lines(bytes: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &bytes[i + 1..];
            }
        }
    }
    bytes
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
            array,
            after_ok,
            after_any,
            after_not_ok,
            dependency,
            ignore_unknown_directives,
            wait,
            output,
            script,
            command,
        } => {
            // A batch script's directives were applied already (`with_directives`): what
            // runs is the script, given the arguments after `--`.
            let _ = ignore_unknown_directives;
            let (command, name) = match &script {
                Some(path) => {
                    let s = batch::Script::read(path)?;
                    (s.command(&command), name.or(Some(s.name.clone())))
                }
                None => (command, name),
            };
            let mut env: BTreeMap<_, _> = env.into_iter().collect();
            if script.is_some()
                && let Ok(dir) = std::env::current_dir()
            {
                // Where it was submitted from, as sbatch says it (a node that does not
                // share this file system has no such directory).
                env.entry("SLURM_SUBMIT_DIR".to_owned())
                    .or_insert_with(|| dir.display().to_string());
            }
            if wait && array.is_some() {
                bail!(
                    "--wait follows one job: with --array, watch the array instead (`allot job list --array ID --watch`)"
                );
            }
            let dependencies =
                dependencies(&after_ok, &after_any, &after_not_ok, dependency.as_deref())?;
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
                "array": array, "dependencies": dependencies,
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
                    follow_log(client, &job.id, None, None, LogMode::Safe, false).await
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
        JobCmd::Resubmit {
            id,
            name,
            failed,
            output,
        } => {
            let old: JobView = client.get(&format!("/api/v1/jobs/{id}"), &[]).await?;
            let mut body = resubmission(&old, name);
            let one_task = old.array_id.as_ref().is_some_and(|a| *a != old.id) && !failed;
            if one_task {
                // A task named by its own id is submitted again alone, keeping its index.
                body["array"] = json!(old.array_index.unwrap_or(0).to_string());
            } else if let Some(array) = &old.array_id {
                // An array is submitted again as one: all its tasks, or those that failed.
                let tasks = list_jobs(client, vec![("array", array.clone())], u64::MAX, None)
                    .await?
                    .items;
                let mut indices: Vec<u32> = tasks
                    .iter()
                    .filter(|t| {
                        !failed || matches!(t.state.as_str(), "failed" | "cancelled" | "timed_out")
                    })
                    .filter_map(|t| t.array_index)
                    .collect();
                indices.sort_unstable();
                if indices.is_empty() {
                    bail!("array {array}: no task failed, was cancelled or timed out");
                }
                let cap = old
                    .array
                    .as_deref()
                    .and_then(|a| a.split_once('%'))
                    .map(|(_, c)| format!("%{c}"))
                    .unwrap_or_default();
                body["array"] = json!(format!("{}{cap}", allot_domain::workflow::ranges(&indices)));
            } else if failed {
                bail!("--failed: job {} is not a task of an array", old.id);
            }
            let job: JobView = client
                .call(Method::POST, "/api/v1/jobs", Some(&body))
                .await?;
            print(output, &job, |j| {
                match (&old.array_id, j.array.as_deref()) {
                    (Some(array), Some(spec)) if one_task => format!(
                        "task {spec} of array {} submitted again, alone, as {}",
                        allot_domain::job::short_id(array),
                        j.id
                    ),
                    (Some(array), Some(spec)) => format!(
                        "array {} submitted again as {} (tasks {spec})",
                        allot_domain::job::short_id(array),
                        j.id
                    ),
                    _ => format!("job {} submitted again as {}", old.id, j.id),
                }
            })?;
            Ok(0)
        }
        JobCmd::List {
            tenant,
            state,
            name,
            node,
            user,
            array,
            expand,
            sort,
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
            let by_array = array.is_some();
            let selection = bulk::Selection {
                user,
                array,
                ..Default::default()
            };
            query.extend(selection.query(client, false).await?);
            if !expand && !by_array {
                query.push(("arrays", "whole".to_owned()));
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
                    let mut list =
                        list_jobs(client, query.clone(), wanted, page_token.clone()).await?;
                    if expand || by_array {
                        // Each task as itself (the first's id is also the array's), and an
                        // array's tasks in index order where its first one is listed.
                        for j in &mut list.items {
                            j.array_tasks = None;
                        }
                        tasks_in_order(&mut list.items);
                    }
                    if let Some(SortKeys(keys)) = &sort {
                        sort_jobs(&mut list.items, keys);
                    }
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
        JobCmd::Cancel {
            ids,
            selection,
            yes,
            output,
        } => {
            if !selection.is_empty() {
                if !ids.is_empty() {
                    bail!("give job ids or a selection (--name, --state, …), not both");
                }
                bulk::cancel(client, &selection, yes).await?;
                return Ok(0);
            }
            if ids.len() > 1 {
                for id in &ids {
                    let j: JobView = client
                        .call::<(), _>(Method::POST, &format!("/api/v1/jobs/{id}/cancel"), None)
                        .await?;
                    print(output, &j, |j| format!("job {} {}", j.id, j.state))?;
                }
                return Ok(0);
            }
            let id = ids.first().context("name a job")?;
            let j: JobView = client
                .call::<(), _>(Method::POST, &format!("/api/v1/jobs/{id}/cancel"), None)
                .await?;
            if !j.state.is_terminal() && !j.cancel_requested {
                bail!("job {} is {} and was not cancelled", j.id, j.state);
            }
            print(output, &j, |j| {
                if j.array_id.as_deref() == Some(j.id.as_str()) {
                    let short = allot_domain::job::short_id(&j.id);
                    format!(
                        "array {short}: every unfinished task cancelled (`allot job list --array {short}` shows them)"
                    )
                } else if j.state.is_terminal() {
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
            tail,
            since,
            timestamps,
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
            let mode = match (output.is_document(), raw) {
                (true, _) => LogMode::Json,
                (false, true) => LogMode::Raw,
                (false, false) => LogMode::Safe,
            };
            let since = since.map(|s| s.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
            if follow && tail.is_none() && since.is_none() {
                follow_log(client, &id, attempt, None, mode, timestamps).await?;
                return Ok(0);
            }
            let mut query: Vec<(&str, String)> = attempt
                .map(|a| ("attempt", a.to_string()))
                .into_iter()
                .collect();
            if let Some(s) = since {
                query.push(("since", s));
            }
            if timestamps {
                query.push(("timestamps", "true".to_owned()));
            }
            let (mut bytes, end) = client
                .get_bytes_with(&format!("/api/v1/jobs/{id}/log"), &query, "allot-log-end")
                .await?;
            if let Some(n) = tail {
                bytes = last_lines(&bytes, n).to_vec();
            }
            if follow {
                // The last lines, then what comes from where they end.
                use std::io::Write;
                if mode == LogMode::Raw {
                    std::io::stdout().write_all(&bytes)?;
                } else if mode == LogMode::Safe {
                    print!(
                        "{}",
                        crate::output::terminal_safe(&String::from_utf8_lossy(&bytes))
                    );
                } else {
                    println!(
                        "{}",
                        json!({ "job": id, "log": String::from_utf8_lossy(&bytes) })
                    );
                }
                std::io::stdout().flush()?;
                let offset = end.and_then(|e| e.parse::<u64>().ok());
                follow_log(client, &id, attempt, offset, mode, timestamps).await?;
                return Ok(0);
            }
            if bytes.is_empty() && !output.is_document() && tail != Some(0) {
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
    fn the_last_lines_are_the_tail() {
        use super::last_lines;
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(last_lines(b"a\n", 0), b"");
    }

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
