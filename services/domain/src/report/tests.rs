use chrono::{DateTime, Duration, Utc};

use super::*;
use crate::Replica;
use crate::job::tests::stored;

fn now() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(1_790_000_100, 0).expect("time")
}

/// A job of `state` at attempt 1 on node `n1`, allowed `retries`.
fn on_node(state: JobState, retries: u32) -> Job {
    let mut j = stored("j", state);
    j.node_id = Some("n1".into());
    j.spec.max_retries = retries;
    j
}

fn report(phase: Reported) -> Report<'static> {
    Report {
        node_id: "n1",
        node_name: "gpu-a",
        lease_expires_at: now() + Duration::seconds(10),
        attempt: 1,
        phase,
        message: "exit 3",
    }
}

fn requeued(v: &Verdict) -> Option<RequeueCode> {
    match v {
        Verdict::Requeue(r) => Some(r.code),
        _ => None,
    }
}

#[test]
fn a_report_about_another_attempt_or_from_another_node_changes_nothing() {
    let job = on_node(JobState::Running, 0);
    let mut late = report(Reported::Failed);
    late.attempt = 2;
    assert_eq!(
        judge(&job, None, &late, now()),
        Verdict::Stale { current: 1 }
    );
    let mut other = report(Reported::Succeeded);
    other.node_id = "n2";
    assert_eq!(judge(&job, None, &other, now()), Verdict::NotAssigned);
    // Negative control: the same report from the node holding it is recorded.
    assert!(matches!(
        judge(&job, None, &report(Reported::Succeeded), now()),
        Verdict::Record {
            to: JobState::Succeeded,
            ..
        }
    ));
}

#[test]
fn a_start_is_allowed_only_to_a_placed_job_on_a_node_whose_lease_holds() {
    let job = on_node(JobState::Scheduled, 0);
    assert_eq!(
        judge(&job, None, &report(Reported::Starting), now()),
        Verdict::MayStart
    );
    let mut lapsed = report(Reported::Starting);
    lapsed.lease_expires_at = now();
    assert!(matches!(
        judge(&job, None, &lapsed, now()),
        Verdict::MayNotStart(why) if why.contains("lease of node gpu-a has lapsed")
    ));
    let cancelled = on_node(JobState::Cancelled, 0);
    assert!(matches!(
        judge(&cancelled, None, &report(Reported::Starting), now()),
        Verdict::MayNotStart(why) if why.contains("is cancelled")
    ));
}

#[test]
fn a_retried_report_or_one_about_an_ended_job_already_landed() {
    let running = on_node(JobState::Running, 0);
    assert_eq!(
        judge(&running, None, &report(Reported::Running), now()),
        Verdict::AlreadyLanded
    );
    let ended = on_node(JobState::Succeeded, 3);
    assert_eq!(
        judge(&ended, None, &report(Reported::Failed), now()),
        Verdict::AlreadyLanded
    );
}

#[test]
fn stopped_for_the_clusters_sake_a_job_is_requeued_uncounted() {
    let job = on_node(JobState::Running, 0);
    for (phase, code) in [
        (Reported::Lost, RequeueCode::NodeLost),
        (Reported::DeviceFault, RequeueCode::DeviceFault),
        (Reported::AgentShutdown, RequeueCode::AgentShutdown),
    ] {
        match judge(&job, None, &report(phase), now()) {
            Verdict::Requeue(r) => {
                assert_eq!(r.code, code);
                assert_eq!(r.retry_at, None, "{phase:?} is not counted");
            }
            v => panic!("{phase:?}: {v:?}"),
        }
    }
    let mut preempted = on_node(JobState::Running, 0);
    preempted.preempt_reason = Some("a priority 10 job needs the GPU".into());
    let v = judge(&preempted, None, &report(Reported::Cancelled), now());
    assert!(matches!(&v, Verdict::Requeue(r)
        if r.code == RequeueCode::Preempted && r.message.contains("priority 10")));
}

#[test]
fn a_failure_with_retries_left_is_retried_after_a_backoff_and_without_none_left_ends() {
    let mut job = on_node(JobState::Running, 2);
    job.failures = 1;
    match judge(&job, None, &report(Reported::Failed), now()) {
        Verdict::Requeue(r) => {
            assert_eq!(r.code, RequeueCode::RetryBackoff);
            assert_eq!(r.retry_at, Some(now() + Duration::seconds(2)));
            assert_eq!(r.message, "exit 3; retry 2 of 2 in 2 s");
        }
        v => panic!("{v:?}"),
    }
    job.failures = 2;
    assert_eq!(
        judge(&job, None, &report(Reported::Failed), now()),
        Verdict::Record {
            via_running: false,
            to: JobState::Failed,
            message: Some("exit 3".into()),
        }
    );
}

#[test]
fn the_backoff_doubles_from_one_second_to_five_minutes() {
    let secs: Vec<u64> = [0, 1, 2, 8, 9, 30]
        .into_iter()
        .map(|f| retry_backoff(f).as_secs())
        .collect();
    assert_eq!(secs, vec![1, 2, 4, 256, 300, 300]);
}

#[test]
fn a_job_being_cancelled_is_not_requeued_and_ends_timed_out_at_its_limit() {
    let mut job = on_node(JobState::Running, 5);
    job.cancel_requested = true;
    assert_eq!(
        judge(&job, None, &report(Reported::Lost), now()),
        Verdict::Record {
            via_running: false,
            to: JobState::Cancelled,
            message: Some("exit 3".into()),
        }
    );
    job.spec.time_limit_secs = Some(60);
    job.started_at = Some(now() - Duration::seconds(61));
    assert_eq!(
        judge(&job, None, &report(Reported::Cancelled), now()),
        Verdict::Record {
            via_running: false,
            to: JobState::TimedOut,
            message: Some("time limit of 1m 0s reached".into()),
        }
    );
    // Negative control: before its limit, a cancel is a cancel.
    job.started_at = Some(now() - Duration::seconds(30));
    assert!(matches!(
        judge(&job, None, &report(Reported::Cancelled), now()),
        Verdict::Record {
            to: JobState::Cancelled,
            ..
        }
    ));
}

#[test]
fn a_job_that_ran_and_ended_before_its_start_was_recorded_goes_through_running() {
    let job = on_node(JobState::Scheduled, 0);
    assert_eq!(
        judge(&job, None, &report(Reported::Succeeded), now()),
        Verdict::Record {
            via_running: true,
            to: JobState::Succeeded,
            message: Some("exit 3".into()),
        }
    );
}

fn replica(rank: u32, state: JobState, attempt: u32) -> Job {
    let mut j = stored(&format!("j{rank}"), state);
    j.attempt = attempt;
    j.node_id = Some("n1".into());
    j.spec.max_retries = 1;
    j.replica = Some(Replica {
        gang_id: "j0".into(),
        rank,
    });
    j
}

#[test]
fn only_a_stop_of_a_replicas_current_attempt_on_its_node_needs_its_gang() {
    let me = replica(1, JobState::Running, 1);
    assert_eq!(gang_to_read(&me, &report(Reported::Failed)), Some("j0"));
    assert_eq!(gang_to_read(&me, &report(Reported::Running)), None);
    let mut late = report(Reported::Failed);
    late.attempt = 2;
    assert_eq!(gang_to_read(&me, &late), None);
    let mut other = report(Reported::Lost);
    other.node_id = "n2";
    assert_eq!(gang_to_read(&me, &other), None);
    assert_eq!(
        gang_to_read(&on_node(JobState::Running, 0), &report(Reported::Failed)),
        None
    );
}

#[test]
fn a_replica_ends_with_its_gang_and_counts_its_failures_once() {
    let me = replica(1, JobState::Running, 1);
    // Another replica already on the next attempt: this end is part of that requeue.
    let gang = vec![replica(0, JobState::Pending, 2), me.clone()];
    assert_eq!(
        requeued(&judge(&me, Some(&gang), &report(Reported::Failed), now())),
        Some(RequeueCode::GangRequeued)
    );
    // Another replica failed for good: this one ends with the gang.
    let gang = vec![replica(0, JobState::Failed, 1), me.clone()];
    assert!(matches!(
        judge(&me, Some(&gang), &report(Reported::Lost), now()),
        Verdict::Record {
            to: JobState::Cancelled,
            ..
        }
    ));
    // The gang's failures count: one failure elsewhere used its only retry.
    let mut other = replica(0, JobState::Pending, 2);
    other.failures = 1;
    let mut me2 = replica(1, JobState::Running, 2);
    me2.attempt = 2;
    let mut r = report(Reported::Failed);
    r.attempt = 2;
    let gang = vec![other, me2.clone()];
    assert!(matches!(
        judge(&me2, Some(&gang), &r, now()),
        Verdict::Record {
            to: JobState::Failed,
            ..
        }
    ));
    // Negative control: alone (no gang), the same job has its retry left.
    assert_eq!(
        requeued(&judge(&me2, None, &r, now())),
        Some(RequeueCode::RetryBackoff)
    );
}

#[test]
fn a_job_lost_with_its_agent_is_requeued_unless_it_was_being_cancelled() {
    let mut job = on_node(JobState::Running, 0);
    let (to, code, _) = lost_with_its_agent(&job);
    assert_eq!((to, code), (JobState::Pending, Some(RequeueCode::NodeLost)));
    job.cancel_requested = true;
    let (to, code, _) = lost_with_its_agent(&job);
    assert_eq!((to, code), (JobState::Cancelled, None));
}
