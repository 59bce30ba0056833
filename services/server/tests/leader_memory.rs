//! A change of leader changes no decision: the same trace of submits, starts, ends and
//! preemptions is scheduled once by one leader throughout and once with a failover in the
//! middle (a new term, a new scheduler, hub and elastic planner, taking up only what the
//! last leader saved in the database), and every pass decides the same placements and
//! preemptions. The negative control fails over without taking anything up, and decides
//! differently.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use allot_domain::report::RequeueCode;
use allot_domain::{
    AuditContext, Clock, FixedClock, GpuDevice, JobSpec, JobState, Quota, ResourceLimits,
    Resources, TenantName, WorkloadClass,
};
use allot_scheduler::LiveScheduler;
use allot_scheduler::engine::Config as EngineConfig;
use allot_server::elastic::ElasticShares;
use allot_server::hub::{AssignmentRx, Hub};
use allot_server::scheduling::{NodeLoss, PassState, pass};
use allot_store::testing::{Backend, TestDb};
use allot_store::{
    Admission, EnrollmentRepo, Fenced, JobFilter, JobRepo, JobUpdate, LeadershipRepo,
    NewBootstrapToken, NewJob, NewNodeCertificate, NodeRegistration, NodeRepo, Store, TenantRepo,
    TenantScope, Term,
};
use chrono::{TimeZone, Utc};

const STEPS: usize = 48;
const FAILOVER_AT: usize = 24;
const NODES: [&str; 2] = ["n1", "n2"];
const GPUS_PER_NODE: u32 = 8;

fn ctx() -> AuditContext {
    AuditContext::system("leader-memory-test")
}

/// How the second run changes leader at `FAILOVER_AT`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Failover {
    /// The same scheduler carries on (only the term changes).
    None,
    /// A new leader takes up what the last one saved.
    TakingUp,
    /// A new leader starting afresh: the negative control.
    Forgetting,
}

/// One pass's outcome: each job by name, with its state, node, GPUs and whether it is
/// being preempted.
type Outcome = BTreeMap<String, (JobState, Option<String>, Vec<String>, bool, u32)>;

fn spec(tenant: &str, name: &str, i: usize) -> JobSpec {
    // Whole GPUs, halves and quarters, by turns; some preemptible.
    let gpu_milli = match i % 3 {
        0 => None,
        1 => Some(500),
        _ => Some(250),
    };
    JobSpec {
        tenant: TenantName::parse("tenant", tenant).expect("name"),
        name: name.into(),
        cpu_milli: 2000,
        memory_bytes: 8 << 30,
        gpus: 1,
        gpu_milli: if tenant == "c" { None } else { gpu_milli },
        gpu_memory_bytes: None,
        gpu_models: vec![],
        priority: 100,
        preemptible: i.is_multiple_of(2),
        isolation: Some(allot_domain::Isolation::Shared),
        class: Some(if i.is_multiple_of(4) {
            WorkloadClass::Inference
        } else {
            WorkloadClass::Training
        }),
        max_retries: 0,
        command: vec!["sleep".into(), "1".into()],
        env: Default::default(),
        workdir: None,
        checkpoint_dir: None,
        volumes: vec![],
        secrets: vec![],
        mig_profile: None,
        gpu_compute: None,
        gpu_resizable: false,
        gpu_sizing: Default::default(),
        time_limit_secs: None,
        replicas: 1,
        pack: None,
        array: None,
        dependencies: vec![],
        image: None,
        network: Default::default(),
    }
}

/// How many passes a job runs once started.
fn runs_for(i: usize) -> usize {
    4 + (i * 7) % 9
}

fn scheduler() -> LiveScheduler {
    LiveScheduler::new(
        "allot",
        7,
        EngineConfig {
            min_runtime_secs: 0,
            gpu_limits: Default::default(),
        },
    )
    .expect("scheduler")
    .with_fair_share_half_life(Duration::from_secs(600))
}

fn elastic() -> ElasticShares {
    ElasticShares::new(allot_elastic::ElasticPolicy::builtin().expect("policy"))
}

struct Leader {
    store: Fenced,
    term: Term,
    hub: Hub,
    /// The nodes' assignment streams, kept open.
    _streams: Vec<AssignmentRx>,
    scheduler: LiveScheduler,
    state: PassState,
    elastic: ElasticShares,
    saved: allot_server::memory::Saved,
}

async fn take_office(store: &Store, holder: &str, nodes: &[String], take_up: bool) -> Leader {
    let term = store
        .acquire(holder, holder, "", chrono::Duration::days(1))
        .await
        .expect("lease read")
        .expect("lease taken");
    let fenced = store.fenced(&term);
    let hub = Hub::default();
    let mut streams = Vec::new();
    for n in nodes {
        let (_tx, rx, _) = hub.subscribe(n).expect("stream");
        streams.push(rx);
        hub.reconcile(n, &[]);
    }
    let mut scheduler = scheduler();
    let elastic = elastic();
    let saved = if take_up {
        allot_server::memory::take_up(
            &fenced,
            &mut scheduler,
            Some(&elastic),
            Duration::from_secs(300),
        )
        .await
    } else {
        Default::default()
    };
    Leader {
        store: fenced,
        term,
        hub,
        _streams: streams,
        scheduler,
        state: PassState::new(NodeLoss {
            since: store.clock().now(),
            outage_tolerance: Duration::from_secs(300),
        }),
        elastic,
        saved,
    }
}

async fn run(failover: Failover, elastic: bool) -> Vec<Outcome> {
    let db = TestDb::new(Backend::Sqlite).await.expect("database");
    let clock = Arc::new(FixedClock::new(
        Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0)
            .single()
            .expect("time"),
    ));
    let store = db.store(clock.clone()).await.expect("store");
    let mut tenants = BTreeMap::new();
    // a and b share the fleet by fair share alone (their past use decides who borrows
    // first); c's guarantee is reclaimed from them when it comes.
    for (t, guaranteed) in [("a", 0), ("b", 0), ("c", 6000)] {
        let quota = Quota {
            guaranteed: Resources {
                gpu_milli: guaranteed,
                cpu_milli: 16_000,
                memory_bytes: 64 << 30,
                gpu_memory_bytes: 0,
            },
            limit: ResourceLimits::default(),
            weight: 1,
            ..Default::default()
        };
        let tenant = store
            .create_tenant(
                &ctx(),
                &TenantName::parse("tenant", t).expect("name"),
                None,
                quota,
            )
            .await
            .expect("tenant");
        tenants.insert(t, tenant.id);
    }
    let mut node_ids = Vec::new();
    let mut node_names = BTreeMap::new();
    for (k, name) in NODES.iter().enumerate() {
        store
            .create_bootstrap_token(
                &ctx(),
                NewBootstrapToken {
                    secret_hash: format!("{k:02}").repeat(32),
                    description: "test".into(),
                    expires_at: clock.now() + chrono::Duration::days(1),
                    node_name: (*name).into(),
                    replace: false,
                },
            )
            .await
            .expect("token");
        let gpus = (0..GPUS_PER_NODE)
            .map(|i| GpuDevice {
                uuid: format!("GPU-{name}-{i}"),
                index: i,
                model: "H100".into(),
                memory_bytes: 80 << 30,
                healthy: true,
                degraded: false,
                memory_enforcement: Default::default(),
                nvlink_domain: Some(0),
                mig: None,
            })
            .collect();
        let node = store
            .register_node(
                &ctx(),
                NodeRegistration {
                    name: (*name).into(),
                    admission: Admission::BootstrapToken {
                        secret_hash: format!("{k:02}").repeat(32),
                        key: format!("key-{k}"),
                    },
                    certificate: NewNodeCertificate {
                        serial: format!("serial-{k}"),
                        issued_at: clock.now(),
                        expires_at: clock.now() + chrono::Duration::days(1),
                    },
                    agent_version: "test".into(),
                    gpu_backend: "simulated".into(),
                    runtime: "process".into(),
                    cpu_milli: 64_000,
                    memory_bytes: 512 << 30,
                    gpus,
                    lease_expires_at: clock.now() + chrono::Duration::days(1),
                    address: String::new(),
                },
            )
            .await
            .expect("node");
        node_names.insert(node.id.clone(), (*name).to_owned());
        node_ids.push(node.id);
    }

    let mut leader = take_office(&store, "replica-1", &node_ids, false).await;
    let mut started: BTreeMap<String, usize> = BTreeMap::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut outcomes = Vec::new();
    let mut submitted = 0usize;
    for step in 0..STEPS {
        if step == FAILOVER_AT {
            // The term ends and another begins; the hub, scheduler and planner either carry
            // on (no failover) or are a new leader's.
            store.resign(&leader.term).await.expect("resigned");
            clock.advance(chrono::Duration::seconds(1));
            let holder = if failover == Failover::None {
                "replica-1"
            } else {
                "replica-2"
            };
            let next = take_office(&store, holder, &node_ids, failover == Failover::TakingUp).await;
            if failover == Failover::None {
                leader.store = next.store;
                leader.term = next.term;
            } else {
                leader = next;
            }
        }
        // Tenant a alone at first, using the fleet; then b arrives beside it.
        let mut submits = vec![("a", 4)];
        if step >= STEPS / 4 {
            submits = vec![("a", 2), ("b", 2)];
        }
        if step == FAILOVER_AT + 4 || step == FAILOVER_AT + 12 {
            submits.push(("c", 3));
        }
        for (t, n) in submits {
            for _ in 0..n {
                let name = format!("{t}-{submitted}");
                store
                    .create_job(
                        &ctx(),
                        NewJob {
                            tenant_id: tenants[t].clone(),
                            spec: spec(t, &name, submitted),
                            traceparent: None,
                            submitted_by: None,
                        },
                    )
                    .await
                    .expect("submitted");
                index.insert(name, submitted);
                submitted += 1;
                clock.advance(chrono::Duration::milliseconds(3));
            }
        }
        clock.advance(chrono::Duration::seconds(5));
        for id in &node_ids {
            store
                .heartbeat(id, None, clock.now() + chrono::Duration::days(1))
                .await
                .expect("heartbeat");
        }
        pass(
            &leader.store,
            &leader.hub,
            &mut leader.scheduler,
            &mut leader.state,
            elastic.then_some(&leader.elastic),
            None,
        )
        .await
        .expect("pass");
        // What the scheduling loop saves after each pass.
        let now = allot_server::memory::Remembered::of(&leader.scheduler, Some(&leader.elastic));
        allot_server::memory::save(&leader.store, now, &mut leader.saved).await;
        let jobs = store
            .list_jobs(JobFilter {
                limit: Some(10_000),
                ..JobFilter::new(TenantScope::All)
            })
            .await
            .expect("jobs")
            .jobs;
        let outcome: Outcome = jobs
            .iter()
            .map(|j| {
                (
                    j.spec.name.clone(),
                    (
                        j.state,
                        j.node_id.as_ref().map(|n| node_names[n].clone()),
                        j.gpu_uuids.clone(),
                        j.preempt_reason.is_some(),
                        j.attempt,
                    ),
                )
            })
            .collect();
        outcomes.push(outcome);
        // The nodes: what was placed starts, what is preempted stops and is requeued,
        // what ran its time ends.
        for j in &jobs {
            match j.state {
                JobState::Scheduled => {
                    leader
                        .store
                        .transition_job(
                            &ctx(),
                            &j.id,
                            JobState::Scheduled,
                            JobState::Running,
                            JobUpdate::default(),
                        )
                        .await
                        .expect("started");
                    started.insert(j.spec.name.clone(), step);
                }
                JobState::Running if j.preempt_reason.is_some() => {
                    leader
                        .store
                        .transition_job(
                            &ctx(),
                            &j.id,
                            JobState::Running,
                            JobState::Pending,
                            JobUpdate {
                                requeue_code: Some(RequeueCode::Preempted),
                                ..Default::default()
                            },
                        )
                        .await
                        .expect("requeued");
                    started.remove(&j.spec.name);
                }
                JobState::Running
                    if started
                        .get(&j.spec.name)
                        .is_some_and(|s| step - s >= runs_for(index[&j.spec.name])) =>
                {
                    leader
                        .store
                        .transition_job(
                            &ctx(),
                            &j.id,
                            JobState::Running,
                            JobState::Succeeded,
                            JobUpdate {
                                exit_code: Some(0),
                                ..Default::default()
                            },
                        )
                        .await
                        .expect("ended");
                }
                _ => {}
            }
        }
    }
    outcomes
}

/// The first pass whose outcome differs, and how.
fn first_difference(a: &[Outcome], b: &[Outcome]) -> Option<(usize, String)> {
    a.iter().zip(b).enumerate().find_map(|(step, (x, y))| {
        (x != y).then(|| {
            let differs: Vec<String> = x
                .iter()
                .filter(|(k, v)| y.get(*k) != Some(*v))
                .take(4)
                .map(|(k, v)| format!("{k}: {v:?} against {:?}", y.get(k)))
                .collect();
            (step, differs.join("; "))
        })
    })
}

#[tokio::test]
async fn a_new_leader_decides_as_the_last_one_would_have() {
    let through = run(Failover::None, false).await;
    let placed_after: usize = through[FAILOVER_AT..]
        .iter()
        .zip(&through[FAILOVER_AT - 1..])
        .map(|(now, before)| {
            now.iter()
                .filter(|(k, v)| v.0 == JobState::Scheduled && before.get(*k) != Some(*v))
                .count()
        })
        .sum();
    let preempted: usize = through[FAILOVER_AT..]
        .iter()
        .map(|o| o.values().filter(|v| v.3).count())
        .sum();
    assert!(
        placed_after > 20 && preempted > 0,
        "the trace exercises placement and preemption after the failover: {placed_after} \
         placements, {preempted} preemptions"
    );

    let taking_up = run(Failover::TakingUp, false).await;
    assert_eq!(
        first_difference(&through, &taking_up),
        None,
        "a new leader that took up the last one's memory decides the same"
    );

    // The negative control: a new leader that forgets decides differently.
    let forgetting = run(Failover::Forgetting, false).await;
    let differs = first_difference(&through, &forgetting);
    assert!(
        differs
            .as_ref()
            .is_some_and(|(step, _)| *step >= FAILOVER_AT),
        "forgetting changes decisions after the failover: {differs:?}"
    );
}

/// The same under elastic shares: the planner's burst state and demand history are taken
/// up too.
#[tokio::test]
async fn a_new_leader_plans_elastic_shares_as_the_last_one_would_have() {
    let through = run(Failover::None, true).await;
    let taking_up = run(Failover::TakingUp, true).await;
    assert_eq!(first_difference(&through, &taking_up), None);
    let forgetting = run(Failover::Forgetting, true).await;
    let differs = first_difference(&through, &forgetting);
    assert!(
        differs
            .as_ref()
            .is_some_and(|(step, _)| *step >= FAILOVER_AT),
        "forgetting changes decisions after the failover: {differs:?}"
    );
}
