//! What a job looks like: `job get`'s description and `job list`'s columns.

use allot_api::views::JobView;
use allot_domain::job::Elapsed;
use allot_domain::{GpuCompute, JobState, format_bytes, format_clock, format_duration};

use crate::cmd::{opt, show_milli};
use crate::output::{Column, fields, table};

pub(super) fn short(ts: Option<chrono::DateTime<chrono::Utc>>) -> String {
    opt(ts.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string()))
}

/// What Allot sizes of the job's share: its share and memory, or `-`. Each resize and
/// why is in the history below.
pub(super) fn sizing_of(j: &JobView) -> String {
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

pub(super) fn describe(j: &JobView) -> String {
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
        ("Array", array_of(j)),
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
pub(super) fn queue_of(j: &JobView) -> String {
    match (j.queue_position, j.queue_length) {
        (Some(p), Some(n)) => format!("{p} of {n} in {}'s queue", j.tenant),
        _ => "-".into(),
    }
}

/// A pending job's estimated start, and how far off it is.
pub(super) fn start_of(j: &JobView) -> String {
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

/// How long `j` has been in its phase, and which (see `allot_domain::job::elapsed`); none
/// for a state this client does not know.
pub(super) fn elapsed_of(
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
pub(super) fn elapsed(j: &JobView, now: chrono::DateTime<chrono::Utc>) -> String {
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
pub(super) fn time_cell(j: &JobView) -> String {
    match elapsed_of(j, chrono::Utc::now()) {
        Some((Elapsed::Running | Elapsed::Ran | Elapsed::Waiting, span)) => {
            format_clock(span.num_seconds())
        }
        _ => "-".into(),
    }
}

/// What `job list` can show of a job (`--format` names, `-o wide` all).
pub(super) fn job_columns() -> [Column<JobView>; 23] {
    [
        Column::new("id", "ID", |j| {
            allot_domain::job::short_id(&j.id).to_owned()
        }),
        Column::new("tenant", "TENANT", |j| j.tenant.clone()),
        Column::new("user", "USER", |j| opt(j.user.clone())),
        Column::new("name", "NAME", name_cell),
        Column::new("state", "STATE", |j| match &j.array_tasks {
            Some(counts) => array_state(counts).to_string(),
            None => j.state.to_string(),
        }),
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
                .map(|s| format_clock(i64::try_from(s).unwrap_or(i64::MAX))))
        }),
        Column::wide("attempt", "ATTEMPT", |j| j.attempt.to_string()),
        Column::wide("image", "IMAGE", |j| opt(j.image.clone())),
        Column::wide("started", "STARTED", |j| short(j.started_at)),
        Column::wide("finished", "FINISHED", |j| short(j.finished_at)),
        Column::wide("uuid", "UUID", |j| j.id.clone()),
        Column::new("detail", "DETAIL", |j| {
            if let Some(counts) = &j.array_tasks {
                return array_counts(counts);
            }
            match (&j.pending_reason, j.exit_code) {
                (Some(r), _) => r.message.clone(),
                (None, Some(c)) => format!("exit {c}"),
                (None, None) => j.message.clone().unwrap_or_default(),
            }
        }),
    ]
}

/// A job's name; an array's (listed whole) with its tasks (`sweep[0-199%16]`), a task's
/// with its index (`sweep[7]`).
pub(super) fn name_cell(j: &JobView) -> String {
    match (&j.array_tasks, &j.array, j.array_index) {
        (Some(_), Some(spec), _) => format!("{}[{spec}]", j.name),
        (None, _, Some(i)) => format!("{}[{i}]", j.name),
        _ => j.name.clone(),
    }
}

/// Where a job stands in its array: for the array's first task (whose id is the array's),
/// the array's tasks by state too.
fn array_of(j: &JobView) -> String {
    let (Some(array), Some(index)) = (&j.array_id, j.array_index) else {
        return "-".into();
    };
    let array = allot_domain::job::short_id(array);
    let spec = j.array.as_deref().unwrap_or("?");
    match &j.array_tasks {
        Some(counts) => format!(
            "{array} [{spec}], this its task {index}; {} (`allot job list --array {array} -x` lists each)",
            array_counts(counts)
        ),
        None => format!("task {index} of array {array} [{spec}]"),
    }
}

/// An array's state, as one word: the furthest along of its unfinished tasks (running,
/// scheduled, pending), else how they ended (failed if any did, else cancelled, timed out,
/// succeeded).
pub(super) fn array_state(counts: &std::collections::BTreeMap<JobState, u64>) -> JobState {
    use JobState::*;
    [
        Running, Scheduled, Pending, Failed, Cancelled, TimedOut, Succeeded,
    ]
    .into_iter()
    .find(|s| counts.get(s).copied().unwrap_or(0) > 0)
    .unwrap_or(Pending)
}

/// "tasks: 16 running, 150 pending, 34 succeeded".
pub(super) fn array_counts(counts: &std::collections::BTreeMap<JobState, u64>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    format!("tasks: {}", parts.join(", "))
}

/// "2", "0.25 of a shared GPU" (what the placement holds, once placed), a MIG instance as
/// its compute slices of seven, a gang as replicas × each = all.
pub(super) fn gpus_of(j: &JobView) -> String {
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
pub(super) fn gpus_cell(j: &JobView) -> String {
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
