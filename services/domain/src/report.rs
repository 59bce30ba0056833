//! What a node's report about a job means for the job: the decision, apart from the gRPC
//! that carries the report and the store that records the outcome.
//!
//! A report names a job, the attempt it is about and a phase. The attempt is its fencing
//! token: a report about any attempt but the current one changes nothing, and a node may
//! report only jobs it holds. A job that stopped for the cluster's sake (its node lost its
//! lease, its GPU faulted, its agent shut down, it was preempted or moved, its gang was
//! requeued) goes back to the queue as its next attempt without counting as a failure; one
//! that failed on its own with retries left goes back after a backoff, counted; one whose
//! gang already ended without it ends with the gang; anything else is recorded as reported,
//! a cancelled job that was stopped at its time limit as timed out.

use chrono::{DateTime, Utc};

use crate::gang;
use crate::job::{Job, JobState};

/// Why a job went back to the queue: the code of the pending reason it waits with, and
/// what the store does beside (a lost node and a faulted GPU are avoided for a while).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequeueCode {
    /// Its node was lost (lease lapsed, agent restarted, or it stopped the job for want of
    /// a lease): that node is avoided for a while.
    NodeLost,
    /// Its GPU faulted: those GPUs are avoided for a while.
    DeviceFault,
    /// Its node's agent shut down cleanly; the node may well come back.
    AgentShutdown,
    /// Preempted (or moved) by the scheduler.
    Preempted,
    /// Stopped with its gang, which another replica's end requeued.
    GangRequeued,
    /// Failed on its own with retries left: again after a backoff (counted).
    RetryBackoff,
}

impl RequeueCode {
    /// The pending reason's code, as the API and CLI show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeLost => "NodeLost",
            Self::DeviceFault => "DeviceFault",
            Self::AgentShutdown => "AgentShutdown",
            Self::Preempted => "Preempted",
            Self::GangRequeued => "GangRequeued",
            Self::RetryBackoff => "RetryBackoff",
        }
    }
}

impl std::fmt::Display for RequeueCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The phase a node reports an attempt in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// About to start it: may it?
    Starting,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// Stopped by its own agent for want of a lease.
    Lost,
    /// Stopped for a faulted GPU.
    DeviceFault,
    /// Stopped because the agent shuts down.
    AgentShutdown,
}

impl Reported {
    /// Whether the attempt stopped without succeeding (the gang of a replica matters then).
    pub fn stopped(self) -> bool {
        matches!(
            self,
            Self::Failed | Self::Cancelled | Self::Lost | Self::DeviceFault | Self::AgentShutdown
        )
    }
}

/// A node's report about one attempt of a job.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    /// The reporting node (authenticated by its certificate).
    pub node_id: &'a str,
    pub node_name: &'a str,
    /// Until when the node's lease holds.
    pub lease_expires_at: DateTime<Utc>,
    pub attempt: u32,
    pub phase: Reported,
    /// What the agent says of it (an exit's or a fault's description; may be empty).
    pub message: &'a str,
}

/// Back to the queue as the job's next attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeue {
    pub code: RequeueCode,
    pub message: String,
    /// For a failure with retries left: not before then (and the failure is counted).
    pub retry_at: Option<DateTime<Utc>>,
}

/// What a report does to its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// About an attempt that is not the job's current one: changes nothing.
    Stale { current: u32 },
    /// About a job this node does not hold: refused, and worth auditing.
    NotAssigned,
    /// A start asked about: the node may start the attempt now.
    MayStart,
    /// A start asked about and refused: why.
    MayNotStart(String),
    /// A retried report that already landed, or about a job that already ended.
    AlreadyLanded,
    /// Back to the queue as the next attempt.
    Requeue(Requeue),
    /// Recorded: the job goes to `to` (through `Running` first when `via_running`: it ran
    /// and ended before its start was recorded), with `message` as its message when given.
    Record {
        via_running: bool,
        to: JobState,
        message: Option<String>,
    },
}

/// How long a job waits before retry `failures + 1`: 1 s, doubling, at most 5 minutes.
pub fn retry_backoff(failures: u32) -> std::time::Duration {
    let secs = 1u64 << failures.min(9);
    std::time::Duration::from_secs(secs.min(300))
}

/// When `job`'s attempt reaches its time limit, if it has one and has started.
pub fn deadline(job: &Job) -> Option<DateTime<Utc>> {
    Some(job.started_at? + job.spec.time_limit()?)
}

/// The end message of a job stopped at its time limit: "time limit of 2h 0m reached".
pub fn time_limit_reached(job: &Job) -> Option<String> {
    Some(format!(
        "time limit of {} reached",
        crate::format_duration(job.spec.time_limit()?.num_seconds())
    ))
}

/// The gang whose replicas [`judge`] needs for `report`, if any: a replica's, when the
/// report is about its current attempt, from the node holding it, and says it stopped.
pub fn gang_to_read<'j>(job: &'j Job, report: &Report<'_>) -> Option<&'j str> {
    let replica = job.replica.as_ref()?;
    (report.phase.stopped()
        && report.attempt == job.attempt
        && job.node_id.as_deref() == Some(report.node_id))
    .then_some(replica.gang_id.as_str())
}

/// What `report` does to `job`, at `now`. `gang` holds every replica of the gang
/// [`gang_to_read`] names (`None` when it names none).
pub fn judge(job: &Job, gang: Option<&[Job]>, report: &Report<'_>, now: DateTime<Utc>) -> Verdict {
    if report.attempt != job.attempt {
        return Verdict::Stale {
            current: job.attempt,
        };
    }
    if job.node_id.as_deref() != Some(report.node_id) {
        return Verdict::NotAssigned;
    }
    let to = match report.phase {
        Reported::Starting => return may_start(job, report, now),
        Reported::Running => JobState::Running,
        Reported::Succeeded => JobState::Succeeded,
        Reported::Failed => JobState::Failed,
        Reported::Cancelled => JobState::Cancelled,
        // Stopped by its own agent: back to the queue, below.
        Reported::Lost | Reported::DeviceFault | Reported::AgentShutdown => JobState::Pending,
    };
    if job.state == to || job.state.is_terminal() {
        return Verdict::AlreadyLanded;
    }
    if report.phase.stopped()
        && !job.cancel_requested
        && let Some(requeue) = requeue(job, gang, report, now)
    {
        return Verdict::Requeue(requeue);
    }
    // Lost while being cancelled (or while its gang ended): it is stopped, as asked.
    let to = if to == JobState::Pending {
        JobState::Cancelled
    } else {
        to
    };
    let reported = (!report.message.is_empty()).then(|| report.message.to_owned());
    // Stopped because it reached its time limit: it ended timed out, and says so.
    if to == JobState::Cancelled && job.cancel_requested && deadline(job).is_some_and(|d| d <= now)
    {
        return Verdict::Record {
            via_running: false,
            to: JobState::TimedOut,
            message: time_limit_reached(job),
        };
    }
    Verdict::Record {
        via_running: job.state == JobState::Scheduled && to == JobState::Succeeded,
        to,
        message: reported,
    }
}

/// Whether the node may start the attempt now: while the job is scheduled or running and
/// the node's lease holds. Once told yes, the attempt can only be requeued elsewhere after
/// that lease lapses, and the agent stops its jobs before that.
fn may_start(job: &Job, report: &Report<'_>, now: DateTime<Utc>) -> Verdict {
    if !matches!(job.state, JobState::Scheduled | JobState::Running) {
        return Verdict::MayNotStart(format!(
            "job {} is {}: attempt {} is not to start",
            job.id, job.state, report.attempt
        ));
    }
    if now >= report.lease_expires_at {
        return Verdict::MayNotStart(format!(
            "the lease of node {} has lapsed: it starts nothing until it renews it",
            report.node_name
        ));
    }
    Verdict::MayStart
}

/// The requeue of a stopped attempt, if it goes back to the queue (`None`: it ends).
fn requeue(
    job: &Job,
    gang: Option<&[Job]>,
    report: &Report<'_>,
    now: DateTime<Utc>,
) -> Option<Requeue> {
    // A replica of a gang: the gang's failures, and whether its attempt already ended
    // through another replica (then this end is part of that, and counts for nothing).
    let failures = gang.map_or(job.failures, gang::failures);
    let may_retry = match gang {
        Some(members) => gang::may_retry(members, job.spec.max_retries),
        None => job.failures < job.spec.max_retries,
    };
    let gang_over = gang.filter(|m| gang::attempt_over(job, m)).map(gang::state);
    let node = report.node_name;
    let (code, message, retry_at) = match (&job.preempt_reason, report.phase) {
        // The gang ended without this replica: it ends too.
        _ if matches!(
            gang_over,
            Some(JobState::Failed | JobState::Cancelled | JobState::TimedOut)
        ) =>
        {
            return None;
        }
        _ if gang_over.is_some() && job.preempt_reason.is_none() => (
            RequeueCode::GangRequeued,
            "stopped with its gang, which was requeued; requeued".to_owned(),
            None,
        ),
        (_, Reported::Lost) => (
            RequeueCode::NodeLost,
            format!("node {node} lost its lease and stopped the job; requeued"),
            None,
        ),
        (_, Reported::DeviceFault) => (
            RequeueCode::DeviceFault,
            format!("{} on node {node}; requeued elsewhere", report.message),
            None,
        ),
        // The node may well come back: no avoidance, and not counted.
        (_, Reported::AgentShutdown) => (
            RequeueCode::AgentShutdown,
            format!("the agent of node {node} shut down; requeued"),
            None,
        ),
        (Some(reason), _) => (RequeueCode::Preempted, format!("preempted: {reason}"), None),
        // Failed on its own, with retries left: again, after a backoff.
        (None, Reported::Failed) if may_retry => {
            let wait = retry_backoff(failures);
            let said = if report.message.is_empty() {
                "failed"
            } else {
                report.message
            };
            (
                RequeueCode::RetryBackoff,
                format!(
                    "{said}; retry {} of {} in {} s",
                    failures + 1,
                    job.spec.max_retries,
                    wait.as_secs()
                ),
                Some(now + chrono::Duration::from_std(wait).unwrap_or_default()),
            )
        }
        (None, _) => return None,
    };
    Some(Requeue {
        code,
        message,
        retry_at,
    })
}

/// What becomes of a job the record says runs on a node whose agent registered again
/// without it (the agent restarted; its process is gone through no fault of its own): back
/// to the queue as lost with its node, or cancelled if it was being cancelled.
pub fn lost_with_its_agent(job: &Job) -> (JobState, Option<RequeueCode>, &'static str) {
    if job.cancel_requested {
        (
            JobState::Cancelled,
            None,
            "the node agent restarted; the process is gone",
        )
    } else {
        (
            JobState::Pending,
            Some(RequeueCode::NodeLost),
            "the node agent restarted and the process was lost; requeued",
        )
    }
}

#[cfg(test)]
mod tests;
