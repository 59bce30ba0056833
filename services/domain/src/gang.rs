//! Gangs: a job of several replicas (multi-node training) that run together or not at all.
//!
//! Each replica is a job record of its own (its node, GPUs, attempt, reports and log, so
//! everything that fences a single job fences each replica), tied to the gang by
//! [`crate::Replica`]; replica 0's record is the gang's, the id its submitter sees. What
//! makes them one job:
//! - they are placed in one pass, all or none, and only when every replica is pending at
//!   the same attempt: no replica of an attempt runs beside one of the next;
//! - when one replica is requeued (its node lost, its GPU faulted, preempted, or it failed
//!   with retries left), the others are stopped and requeued as the same next attempt
//!   ([`reconcile`]), and their own ends on the way are part of that requeue, not failures
//!   of their own ([`attempt_over`]);
//! - a replica that finished (exit 0) before another's end requeued the attempt runs again
//!   with the gang's next attempt: an attempt of a gang succeeds only whole;
//! - a failure counts against the gang's retries once ([`failures`]), and once one replica
//!   failed for good, or was cancelled, the others are cancelled;
//! - cancelling any replica cancels the gang; preemption takes the gang whole.

use crate::job::{Job, JobState};

/// The gang's state as one job: failed if a replica failed, cancelled if one was, timed out
/// if one reached the time limit, succeeded when all did, else the furthest along of
/// running, scheduled and pending.
pub fn state(members: &[Job]) -> JobState {
    let any = |s: JobState| members.iter().any(|m| m.state == s);
    if any(JobState::Failed) {
        JobState::Failed
    } else if any(JobState::Cancelled) {
        JobState::Cancelled
    } else if any(JobState::TimedOut) {
        JobState::TimedOut
    } else if !members.is_empty() && members.iter().all(|m| m.state == JobState::Succeeded) {
        JobState::Succeeded
    } else if any(JobState::Running) || any(JobState::Succeeded) {
        JobState::Running
    } else if any(JobState::Scheduled) {
        JobState::Scheduled
    } else {
        JobState::Pending
    }
}

/// The gang's failures so far: each replica counts only the failures that ended an
/// attempt of the gang (the first end of each attempt), so together they count each
/// failed attempt once.
pub fn failures(members: &[Job]) -> u32 {
    members.iter().map(|m| m.failures).sum()
}

/// Whether `job`'s attempt of the gang has already ended through another replica: one of
/// them is already on a later attempt, or ended for good without succeeding. Its own end
/// then belongs to that, and counts for nothing.
pub fn attempt_over(job: &Job, members: &[Job]) -> bool {
    members
        .iter()
        .filter(|m| m.id != job.id)
        .any(|m| m.attempt > job.attempt || ended_for_good(m.state))
}

/// Whether a replica in `state` ended its gang for good (without succeeding).
fn ended_for_good(state: JobState) -> bool {
    matches!(
        state,
        JobState::Failed | JobState::Cancelled | JobState::TimedOut
    )
}

/// Whether the gang may run again after a failure: retries left.
pub fn may_retry(members: &[Job], max_retries: u32) -> bool {
    failures(members) < max_retries
}

/// What keeping a gang whole asks of one of its replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop it and requeue it as the gang's next attempt.
    Stop { job_id: String, reason: String },
    /// Cancel it: the gang has ended.
    Cancel { job_id: String, reason: String },
    /// It finished, but its gang's attempt did not: it runs again with the gang's next
    /// attempt (`attempt`).
    Rerun {
        job_id: String,
        attempt: u32,
        reason: String,
    },
}

fn rank(m: &Job) -> u32 {
    m.replica.as_ref().map_or(0, |r| r.rank)
}

/// What to do so that the gang of `members` stays whole: the replicas to stop because
/// another was requeued, and those to cancel because the gang has ended. Replicas already
/// being stopped or cancelled are left alone, so the same state asks for nothing twice.
pub fn reconcile(members: &[Job]) -> Vec<Action> {
    let live = |m: &&Job| !m.state.is_terminal() && !m.cancel_requested;
    let ended = members
        .iter()
        .find(|m| ended_for_good(m.state))
        .map(|m| format!("replica {} of its gang {}", rank(m), m.state));
    if let Some(why) = ended {
        return members
            .iter()
            .filter(live)
            .map(|m| Action::Cancel {
                job_id: m.id.clone(),
                reason: why.clone(),
            })
            .collect();
    }
    let Some(newest) = members
        .iter()
        .filter(|m| m.state == JobState::Pending)
        .max_by_key(|m| m.attempt)
    else {
        return Vec::new();
    };
    let why = format!(
        "replica {} of its gang was requeued{}",
        rank(newest),
        newest
            .pending_reason
            .as_ref()
            .map(|r| format!(" ({})", r.code))
            .unwrap_or_default()
    );
    let mut actions: Vec<Action> = members
        .iter()
        .filter(live)
        .filter(|m| m.state.holds_resources() && m.attempt < newest.attempt)
        .filter(|m| m.preempt_reason.is_none())
        .map(|m| Action::Stop {
            job_id: m.id.clone(),
            reason: why.clone(),
        })
        .collect();
    actions.extend(
        members
            .iter()
            .filter(|m| m.state == JobState::Succeeded && m.attempt < newest.attempt)
            .map(|m| Action::Rerun {
                job_id: m.id.clone(),
                attempt: m.attempt,
                reason: format!(
                    "{why}; its gang runs again whole as attempt {}",
                    newest.attempt
                ),
            }),
    );
    actions
}

/// The port replica 0 listens on for the gang's rendezvous (`MASTER_PORT`): from the gang
/// and the attempt, in 29500–32499 (below Linux's ephemeral ports), so replicas agree on it
/// without asking, and a new attempt does not meet the last one's sockets.
pub fn master_port(gang_id: &str, attempt: u32) -> u16 {
    // FNV-1a: stable across builds and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in gang_id.bytes().chain(attempt.to_le_bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    29_500 + u16::try_from(h % 3_000).unwrap_or(0)
}

/// Where a replica stands in its gang and where the replicas meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place<'a> {
    pub gang_id: &'a str,
    pub rank: u32,
    pub size: u32,
    pub master_addr: &'a str,
    pub master_port: u16,
    /// GPUs of this replica (one process per GPU under `torchrun`).
    pub gpus: u32,
}

/// The variables a replica gets: what PyTorch's launchers read, as Kubeflow's training
/// operator sets them (a replica is a node: `WORLD_SIZE` replicas, `RANK` and `NODE_RANK`
/// its index), the `PET_*` defaults `torchrun` takes its `--nnodes`, `--node-rank`,
/// `--nproc-per-node`, `--master-addr` and `--master-port` from (so `torchrun train.py`
/// runs unchanged; it sets each worker's own `RANK` and `WORLD_SIZE`), and Allot's own.
pub fn launcher_env(p: &Place<'_>) -> Vec<(String, String)> {
    let per_node = p.gpus.max(1).to_string();
    let (rank, size, port) = (
        p.rank.to_string(),
        p.size.to_string(),
        p.master_port.to_string(),
    );
    [
        ("WORLD_SIZE", size.clone()),
        ("RANK", rank.clone()),
        ("NODE_RANK", rank.clone()),
        ("LOCAL_WORLD_SIZE", per_node.clone()),
        ("MASTER_ADDR", p.master_addr.to_owned()),
        ("MASTER_PORT", port.clone()),
        ("PET_NNODES", size.clone()),
        ("PET_NODE_RANK", rank.clone()),
        ("PET_NPROC_PER_NODE", per_node),
        ("PET_MASTER_ADDR", p.master_addr.to_owned()),
        ("PET_MASTER_PORT", port.clone()),
        ("ALLOT_GANG_ID", p.gang_id.to_owned()),
        ("ALLOT_REPLICA", rank),
        ("ALLOT_REPLICAS", size),
        ("ALLOT_MASTER_ADDR", p.master_addr.to_owned()),
        ("ALLOT_MASTER_PORT", port),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::tests::stored;
    use crate::{PendingReason, Replica};

    fn member(rank: u32, state: JobState, attempt: u32) -> Job {
        let mut j = stored(&format!("j{rank}"), state);
        j.attempt = attempt;
        j.replica = Some(Replica {
            gang_id: "j0".into(),
            rank,
        });
        j
    }

    #[test]
    fn one_requeued_replica_stops_the_others_once() {
        let mut requeued = member(1, JobState::Pending, 2);
        requeued.pending_reason = Some(PendingReason {
            code: "NodeLost".into(),
            message: String::new(),
        });
        let mut gang = vec![
            member(0, JobState::Running, 1),
            requeued,
            member(2, JobState::Scheduled, 1),
        ];
        let actions = reconcile(&gang);
        assert_eq!(
            actions,
            vec![
                Action::Stop {
                    job_id: "j0".into(),
                    reason: "replica 1 of its gang was requeued (NodeLost)".into()
                },
                Action::Stop {
                    job_id: "j2".into(),
                    reason: "replica 1 of its gang was requeued (NodeLost)".into()
                },
            ]
        );
        // Being stopped: nothing more is asked.
        gang[0].preempt_reason = Some("stopping".into());
        gang[2].preempt_reason = Some("stopping".into());
        assert!(reconcile(&gang).is_empty());
        // Their ends belong to the requeue.
        assert!(attempt_over(&gang[0], &gang));
        assert!(!attempt_over(&gang[1], &gang));
        assert_eq!(state(&gang), JobState::Running);
    }

    #[test]
    fn a_failed_or_cancelled_replica_ends_the_gang() {
        for end in [JobState::Failed, JobState::Cancelled] {
            let gang = vec![
                member(0, JobState::Running, 1),
                member(1, end, 1),
                member(2, JobState::Pending, 1),
            ];
            let cancelled: Vec<_> = reconcile(&gang)
                .into_iter()
                .map(|a| match a {
                    Action::Cancel { job_id, .. } => job_id,
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(cancelled, ["j0", "j2"]);
            assert_eq!(state(&gang), end);
            assert!(attempt_over(&gang[0], &gang));
        }
    }

    #[test]
    fn a_finished_replica_runs_again_when_its_gangs_attempt_is_requeued() {
        let mut gang = vec![
            member(0, JobState::Succeeded, 1),
            member(1, JobState::Running, 1),
        ];
        assert!(reconcile(&gang).is_empty(), "finishing: nothing to do");
        assert_eq!(state(&gang), JobState::Running);
        assert!(may_retry(&gang, 3));
        // Replica 1's node is lost: replica 0 runs again with attempt 2.
        gang[1] = member(1, JobState::Pending, 2);
        match reconcile(&gang).as_slice() {
            [
                Action::Rerun {
                    job_id, attempt, ..
                },
            ] => {
                assert_eq!((job_id.as_str(), *attempt), ("j0", 1));
            }
            other => panic!("{other:?}"),
        }
        gang[1].state = JobState::Succeeded;
        gang[0].attempt = 2;
        assert_eq!(state(&gang), JobState::Succeeded);
    }

    #[test]
    fn failures_count_once_per_failed_attempt() {
        let mut gang = vec![
            member(0, JobState::Running, 2),
            member(1, JobState::Running, 2),
        ];
        gang[1].failures = 1;
        assert_eq!(failures(&gang), 1);
        assert!(may_retry(&gang, 2));
        assert!(!may_retry(&gang, 1));
    }

    #[test]
    fn a_replica_is_told_what_torchrun_reads() {
        let env: std::collections::BTreeMap<_, _> = launcher_env(&Place {
            gang_id: "g",
            rank: 2,
            size: 4,
            master_addr: "10.0.0.7",
            master_port: 29_611,
            gpus: 8,
        })
        .into_iter()
        .collect();
        for (k, v) in [
            ("WORLD_SIZE", "4"),
            ("RANK", "2"),
            ("NODE_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "10.0.0.7"),
            ("MASTER_PORT", "29611"),
            ("PET_NNODES", "4"),
            ("PET_NODE_RANK", "2"),
            ("PET_NPROC_PER_NODE", "8"),
            ("ALLOT_REPLICA", "2"),
        ] {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
    }

    #[test]
    fn the_master_port_is_stable_and_below_the_ephemeral_range() {
        assert_eq!(master_port("abc", 1), master_port("abc", 1));
        assert_ne!(master_port("abc", 1), master_port("abc", 2));
        for a in 0..1000 {
            let p = master_port("0197a-gang", a);
            assert!((29_500..32_500).contains(&p), "{p}");
        }
    }
}
