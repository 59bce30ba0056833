use allot_domain::JobState;

use super::*;
use crate::engine::GpuLimits;
use crate::testing::{node, now, tenant};

fn job(id: &str, tenant: &str, gpus: u32, share: Option<u32>) -> StoredJob {
    crate::testing::pending_job(id, tenant, gpus, share)
}

fn running_on(mut j: StoredJob, node: &str, gpus: &[usize]) -> StoredJob {
    j.state = JobState::Running;
    j.node_id = Some(node.into());
    j.gpu_uuids = gpus.iter().map(|g| format!("{node}-gpu{g}")).collect();
    j.held_gpu_milli = Some(j.spec.gpu_milli.unwrap_or(1000));
    j.started_at = Some(now() - chrono::Duration::minutes(30));
    j
}

fn scheduler() -> LiveScheduler {
    LiveScheduler::new(
        "allot",
        7,
        Config {
            min_runtime_secs: 60,
            gpu_limits: GpuLimits::default(),
        },
    )
    .expect("known policy")
}

fn decide(
    nodes: &[Node],
    tenants: &[Tenant],
    holding: &[StoredJob],
    pending: &[StoredJob],
) -> Vec<LiveDecision> {
    scheduler()
        .decide(&Snapshot {
            nodes,
            tenants,
            holding,
            pending,
            now: now(),
            reachable: None,
            forecasts: None,
        })
        .expect("a possible state")
}

fn placed(d: &[LiveDecision], id: &str) -> Option<(String, Vec<String>, u32)> {
    d.iter().find_map(|d| match d {
        LiveDecision::Place {
            job_id,
            node_id,
            gpu_uuids,
            held_gpu_milli,
            ..
        } if job_id == id => Some((node_id.clone(), gpu_uuids.clone(), *held_gpu_milli)),
        _ => None,
    })
}

fn waits(d: &[LiveDecision], id: &str) -> Option<PendingReason> {
    d.iter().find_map(|d| match d {
        LiveDecision::Wait { job_id, reason } if job_id == id => Some(reason.clone()),
        _ => None,
    })
}

/// The learned mix as (class, weight) pairs, to compare.
fn mix_of(s: &LiveScheduler) -> Vec<(crate::placement::Request, f64)> {
    s.learned_mix()
        .into_iter()
        .map(|c| (c.request, c.weight))
        .collect()
}

#[test]
fn a_job_that_waits_many_passes_arrived_once() {
    let nodes = [node("n1", &["H200", "H200"])];
    let tenants = [tenant("a", 0)];
    // Never fits: the node has two GPUs.
    let big = job("big", "a", 8, None);
    let mut s = scheduler();
    let pass = |s: &mut LiveScheduler, holding: &[StoredJob], pending: &[StoredJob]| {
        s.decide(&Snapshot {
            nodes: &nodes,
            tenants: &tenants,
            holding,
            pending,
            now: now(),
            reachable: None,
            forecasts: None,
        })
        .expect("a possible state")
    };
    let d = pass(&mut s, &[], &[job("s1", "a", 1, Some(500)), big.clone()]);
    assert!(placed(&d, "s1").is_some() && waits(&d, "big").is_some());
    let first = mix_of(&s);
    let running = [running_on(job("s1", "a", 1, Some(500)), "n1", &[0])];
    for _ in 0..200 {
        let d = pass(&mut s, &running, std::slice::from_ref(&big));
        assert!(waits(&d, "big").is_some());
    }
    let mix = mix_of(&s);
    let weight = |gpus: u8| {
        mix.iter()
            .find(|(r, _)| r.num_gpu == gpus)
            .map_or(0.0, |(_, w)| *w)
    };
    assert_eq!(
        mix, first,
        "the passes over the waiting job changed nothing"
    );
    // Two arrivals (the later one a hair heavier: old arrivals fade).
    assert!(
        (weight(1) - 0.5).abs() < 1e-3 && (weight(8) - 0.5).abs() < 1e-3,
        "two arrivals, however many passes the big one waited: {mix:?}"
    );
    // New arrivals do move it: four in all now, three of them small.
    pass(
        &mut s,
        &running,
        &[
            big.clone(),
            job("s2", "a", 1, Some(500)),
            job("s3", "a", 1, Some(500)),
        ],
    );
    let mix = mix_of(&s);
    let small = mix
        .iter()
        .find(|(r, _)| r.num_gpu == 1)
        .map_or(0.0, |(_, w)| *w);
    assert!((small - 0.75).abs() < 1e-3, "{mix:?}");
}

#[test]
fn fractions_of_different_tenants_share_one_gpu() {
    let nodes = [node("n1", &["H200"])];
    let tenants = [tenant("a", 0), tenant("b", 0)];
    let pending = [
        job("j1", "a", 1, Some(400)),
        job("j2", "b", 1, Some(400)),
        job("j3", "a", 1, Some(400)),
    ];
    let d = decide(&nodes, &tenants, &[], &pending);
    for id in ["j1", "j2"] {
        let (node, gpus, milli) = placed(&d, id).expect("placed");
        assert_eq!(
            (node.as_str(), gpus, milli),
            ("n1", vec!["n1-gpu0".into()], 400)
        );
    }
    let r = waits(&d, "j3").expect("the third does not fit in 1000 milli");
    assert_eq!(r.code, "NoRoom");
    assert!(r.message.contains("0.4 of a GPU"), "{}", r.message);
}

#[test]
fn a_quarter_of_a_gpu_is_said_as_such() {
    let nodes = [node("n1", &["H200"])];
    let tenants = [tenant("a", 0)];
    let running = [running_on(job("held", "a", 1, Some(900)), "n1", &[0])];
    let d = decide(&nodes, &tenants, &running, &[job("q", "a", 1, Some(250))]);
    let r = waits(&d, "q").expect("0.1 is left");
    assert!(
        r.message.contains("0.25 of a GPU") && !r.message.contains("0.2 of"),
        "{}",
        r.message
    );
}

#[test]
fn reclaim_preempts_the_borrower_and_places_once_it_stopped() {
    let nodes = [node("n1", &["H200"])];
    let tenants = [tenant("owner", 1), tenant("borrower", 0)];
    let borrower = running_on(job("b1", "borrower", 1, None), "n1", &[0]);
    let claim = job("o1", "owner", 1, None);

    // The owner asks: the borrower is preempted, and the owner waits for it to stop.
    let d = decide(
        &nodes,
        &tenants,
        std::slice::from_ref(&borrower),
        std::slice::from_ref(&claim),
    );
    let preempted = d.iter().find_map(|d| match d {
        LiveDecision::Preempt {
            job_id,
            node_id,
            reason,
        } => Some((job_id.clone(), node_id.clone(), reason.clone())),
        _ => None,
    });
    let (victim, node_id, reason) = preempted.expect("a preemption");
    assert_eq!((victim.as_str(), node_id.as_str()), ("b1", "n1"));
    assert!(reason.contains("reclaimed for o1"), "{reason}");
    assert_eq!(
        waits(&d, "o1").map(|r| r.code),
        Some("AwaitingPreemption".into())
    );

    // While it stops, nothing more is preempted and the owner still waits.
    let mut stopping = borrower.clone();
    stopping.preempt_reason = Some(reason);
    let d = decide(&nodes, &tenants, &[stopping], std::slice::from_ref(&claim));
    assert!(!d.iter().any(|d| matches!(d, LiveDecision::Preempt { .. })));
    assert_eq!(
        waits(&d, "o1").map(|r| r.code),
        Some("AwaitingPreemption".into())
    );

    // Once stopped and requeued, the owner runs and the borrower waits.
    let mut requeued = job("b1", "borrower", 1, None);
    requeued.attempt = 2;
    let d = decide(&nodes, &tenants, &[], &[claim, requeued]);
    assert_eq!(placed(&d, "o1").map(|p| p.0), Some("n1".into()));
    assert_eq!(waits(&d, "b1").map(|r| r.code), Some("NoRoom".into()));
}

#[test]
fn degraded_gpus_keep_their_jobs_and_take_no_new_work() {
    let mut n = node("n1", &["H200", "H200", "H200"]);
    n.gpus[0].degraded = true;
    let nodes = [n];
    let tenants = [tenant("a", 0)];
    let holding = [running_on(job("on-degraded", "a", 1, None), "n1", &[0])];
    let pending = [
        job("j1", "a", 1, None),
        job("j2", "a", 1, None),
        job("j3", "a", 1, None),
    ];
    let d = decide(&nodes, &tenants, &holding, &pending);
    let mut used: Vec<String> = ["j1", "j2", "j3"]
        .iter()
        .filter_map(|j| placed(&d, j))
        .flat_map(|(_, gpus, _)| gpus)
        .collect();
    used.sort();
    assert_eq!(
        used,
        ["n1-gpu1", "n1-gpu2"],
        "nothing new on the degraded GPU"
    );
    assert!(
        !d.iter().any(|d| matches!(d, LiveDecision::Preempt { .. })),
        "its own job runs on"
    );
}

#[test]
fn sick_gpus_and_lapsed_nodes_offer_nothing_but_keep_their_jobs() {
    let mut sick = node("n1", &["H200", "H200"]);
    sick.gpus[0].healthy = false;
    let mut gone = node("n2", &["H200"]);
    gone.lease_expires_at = now() - chrono::Duration::seconds(1);
    let nodes = [sick, gone];
    let tenants = [tenant("a", 0)];
    let holding = [
        running_on(job("on-sick", "a", 1, None), "n1", &[0]),
        running_on(job("on-gone", "a", 1, None), "n2", &[0]),
    ];
    let pending = [job("j1", "a", 1, None), job("j2", "a", 1, None)];
    let d = decide(&nodes, &tenants, &holding, &pending);
    let (on, gpus, _) = placed(&d, "j1").expect("the healthy GPU");
    assert_eq!((on.as_str(), gpus), ("n1", vec!["n1-gpu1".into()]));
    assert_eq!(waits(&d, "j2").map(|r| r.code), Some("NoRoom".into()));
    assert!(!d.iter().any(|d| matches!(d, LiveDecision::Preempt { .. })));

    let d = decide(&nodes[1..], &tenants, &[], &pending[..1]);
    assert_eq!(waits(&d, "j1").map(|r| r.code), Some("NoReadyNodes".into()));

    // What an operator takes out of service offers nothing either.
    let mut drained = node("n4", &["H200", "H200"]);
    drained.drained_gpus = vec!["n4-gpu0".into()];
    let d = decide(std::slice::from_ref(&drained), &tenants, &[], &pending[..1]);
    assert_eq!(placed(&d, "j1").map(|p| p.1), Some(vec!["n4-gpu1".into()]));
    drained.cordoned = true;
    let d = decide(&[drained], &tenants, &[], &pending[..1]);
    assert_eq!(waits(&d, "j1").map(|r| r.code), Some("NoReadyNodes".into()));

    // A node that stopped heartbeating gets no new work while its lease still stands.
    let mut quiet = node("n3", &["H200"]);
    quiet.last_heartbeat_at = now() - chrono::Duration::seconds(8);
    quiet.lease_expires_at = quiet.last_heartbeat_at + chrono::Duration::seconds(30);
    let suspecting = |n: &Node| {
        scheduler()
            .with_suspect_after(
                std::time::Duration::from_secs(5),
                std::time::Duration::from_secs(30),
            )
            .decide(&Snapshot {
                nodes: std::slice::from_ref(n),
                tenants: &tenants,
                holding: &[],
                pending: &pending[..1],
                now: now(),
                reachable: None,
                forecasts: None,
            })
            .expect("a possible state")
    };
    let d = suspecting(&quiet);
    assert_eq!(waits(&d, "j1").map(|r| r.code), Some("NoReadyNodes".into()));
    // One told to beat twice as rarely (a paced fleet, its lease doubled) is not silent yet.
    quiet.lease_expires_at = quiet.last_heartbeat_at + chrono::Duration::seconds(60);
    let d = suspecting(&quiet);
    assert!(placed(&d, "j1").is_some(), "a paced node still takes work");
}

#[test]
fn a_retry_waits_out_its_backoff() {
    let nodes = [node("n1", &["H200"])];
    let tenants = [tenant("a", 0)];
    let mut retry = job("r", "a", 1, None);
    retry.failures = 1;
    retry.spec.max_retries = 3;
    retry.retry_at = Some(now() + chrono::Duration::seconds(2));
    let d = decide(&nodes, &tenants, &[], std::slice::from_ref(&retry));
    let r = waits(&d, "r").expect("still backing off");
    assert_eq!(r.code, "RetryBackoff");
    assert!(r.message.contains("1 of 3 retries used"), "{}", r.message);
    retry.retry_at = Some(now() - chrono::Duration::seconds(1));
    let d = decide(&nodes, &tenants, &[], &[retry]);
    assert!(placed(&d, "r").is_some(), "placed once the backoff is over");
}

#[test]
fn models_match_without_case_or_vendor() {
    let nodes = [node("n1", &["NVIDIA H200"]), node("n2", &["A100-80GB"])];
    let tenants = [tenant("a", 0)];
    let mut h200 = job("h", "a", 1, None);
    h200.spec.gpu_models = vec!["h200".into()];
    let mut t4 = job("t", "a", 1, None);
    t4.spec.gpu_models = vec!["T4".into()];
    let d = decide(&nodes, &tenants, &[], &[h200, t4]);
    assert_eq!(placed(&d, "h").map(|p| p.0), Some("n1".into()));
    let t4 = waits(&d, "t").expect("the T4 job waits");
    assert_eq!(t4.code, "NoRoom");
    assert_eq!(
        t4.message,
        "no node has a GPU of model T4; the nodes have h200, a100-80gb"
    );
}

#[test]
fn limits_and_dedicated_isolation_hold() {
    let nodes = [node("n1", &["H200", "H200"])];
    let mut capped = tenant("capped", 0);
    capped.quota.limit.gpu_milli = Some(1000);
    let tenants = [capped, tenant("other", 0)];
    let mut secret = job("s", "capped", 1, Some(300));
    secret.spec.isolation = Some(allot_domain::Isolation::Dedicated);
    let second = job("s2", "capped", 1, None);
    secret.created_at -= chrono::Duration::minutes(5);
    let shared = job("o", "other", 1, Some(300));
    let d = decide(&nodes, &tenants, &[], &[secret, second, shared]);
    // A dedicated fraction holds a whole GPU, and the node is then the tenant's alone.
    assert_eq!(placed(&d, "s").map(|p| p.2), Some(1000));
    let r = waits(&d, "s2").expect("over the limit");
    assert_eq!(r.code, "TenantLimit");
    assert_eq!(waits(&d, "o").map(|r| r.code), Some("NoRoom".into()));
}

#[test]
fn a_bad_quota_tree_pauses_placement_and_says_so() {
    let mut child = tenant("child", 2);
    child.parent_id = Some("parent".into());
    let tenants = [tenant("parent", 1), child];
    let d = decide(
        &[node("n1", &["H200"])],
        &tenants,
        &[],
        &[job("j", "child", 1, None)],
    );
    let r = waits(&d, "j").expect("nothing is placed against quotas that do not nest");
    assert_eq!(r.code, "InvalidQuotaTree");
    assert!(r.message.contains("guaranteed"), "{}", r.message);
}

#[test]
fn a_resize_fits_beside_the_gpus_other_jobs_and_within_tenant_limits() {
    use crate::resize::check;
    let share = |gpu_milli: u32, gpu_memory_bytes: u64| allot_domain::Share {
        gpu_milli,
        gpu_memory_bytes,
    };
    let limits = crate::engine::GpuLimits::default();
    let nodes = [node("n1", &["H200"])];
    let mine = running_on(job("mine", "a", 1, Some(300)), "n1", &[0]);
    let other = running_on(job("other", "b", 1, Some(500)), "n1", &[0]);
    let holding = [mine.clone(), other];
    let mut limited = tenant("a", 0);
    limited.quota.limit.gpu_milli = Some(400);
    let tenants = [tenant("a", 0), tenant("b", 0)];
    // 500 thousandths are free beside the other job: 500 fits, 600 does not.
    assert_eq!(
        check(&mine, share(500, 0), &holding, &nodes, &tenants, &limits),
        Ok(())
    );
    let err =
        check(&mine, share(600, 0), &holding, &nodes, &tenants, &limits).expect_err("too big");
    assert!(err.contains("0.5 of a GPU free"), "{err}");
    // Memory too: the other job's half of 141 GiB leaves about 70 GiB.
    let err = check(
        &mine,
        share(400, 100 << 30),
        &holding,
        &nodes,
        &tenants,
        &limits,
    )
    .expect_err("memory");
    assert!(err.contains("of memory free"), "{err}");
    // Beside a job that asked for 60 GiB: 81 GiB would fill the GPU's 141, past the 90%
    // of a shared GPU's memory jobs may ask for; 66 GiB is within it.
    let mut sized = job("sized", "b", 1, Some(200));
    sized.spec.gpu_memory_bytes = Some(60 << 30);
    let beside_sized = [mine.clone(), running_on(sized, "n1", &[0])];
    let err = check(
        &mine,
        share(300, 81 << 30),
        &beside_sized,
        &nodes,
        &tenants,
        &limits,
    )
    .expect_err("the reserve");
    assert!(
        err.contains("less the 10% kept free on a shared GPU), not 81 GiB"),
        "{err}"
    );
    assert_eq!(
        check(
            &mine,
            share(300, 66 << 30),
            &beside_sized,
            &nodes,
            &tenants,
            &limits
        ),
        Ok(())
    );
    // A tenant limit of 0.4 GPUs allows growing to 0.4, not 0.5; shrinking is always fine.
    let tenants = [limited, tenant("b", 0)];
    assert_eq!(
        check(&mine, share(400, 0), &holding, &nodes, &tenants, &limits),
        Ok(())
    );
    let err = check(&mine, share(500, 0), &holding, &nodes, &tenants, &limits).expect_err("limit");
    assert!(err.contains("tenant a may hold 0.4 GPUs"), "{err}");
    assert_eq!(
        check(&mine, share(100, 0), &holding, &nodes, &tenants, &limits),
        Ok(())
    );
}

#[test]
fn a_job_asking_for_nothing_is_not_placed_on_a_cordoned_node() {
    let mut cordoned = node("n1", &["H200"]);
    cordoned.cordoned = true;
    let open = node("n2", &["H200"]);
    let mut nothing = job("j1", "t1", 0, None);
    nothing.spec.cpu_milli = 0;
    nothing.spec.memory_bytes = 0;
    let d = decide(
        &[cordoned.clone(), open],
        &[tenant("t1", 0)],
        &[],
        &[nothing.clone()],
    );
    assert_eq!(placed(&d, "j1").map(|p| p.0), Some("n2".to_owned()));
    // With only the cordoned node, it waits.
    let d = decide(&[cordoned], &[tenant("t1", 0)], &[], &[nothing]);
    assert!(placed(&d, "j1").is_none(), "{d:?}");
}

#[test]
fn a_node_its_agent_says_is_unavailable_takes_no_new_work() {
    let mut low = node("n1", &["H200"]);
    low.unavailable = "low on disk".into();
    let open = node("n2", &["H200"]);
    let d = decide(
        &[low.clone(), open],
        &[tenant("t1", 0)],
        &[],
        &[job("j1", "t1", 1, None)],
    );
    assert_eq!(placed(&d, "j1").map(|p| p.0), Some("n2".to_owned()));
    let d = decide(&[low], &[tenant("t1", 0)], &[], &[job("j1", "t1", 1, None)]);
    assert!(placed(&d, "j1").is_none(), "{d:?}");
}

#[test]
fn a_tenant_that_requires_confinement_runs_only_on_confining_nodes() {
    let mut strict = tenant("t1", 0);
    strict.policy.require_confinement = true;
    let processes = node("n1", &["H200"]);
    let d = decide(
        std::slice::from_ref(&processes),
        std::slice::from_ref(&strict),
        &[],
        &[job("j1", "t1", 1, None)],
    );
    let reason = waits(&d, "j1").expect("waits");
    assert_eq!(reason.code, "ConfinementRequired");
    assert!(
        reason.message.contains("none of the 1 ready nodes"),
        "{}",
        reason.message
    );
    let mut containers = node("n2", &["H200"]);
    containers.runtime = "oci".into();
    // (A node running containers runs only jobs from images.)
    let mut boxed = job("j1", "t1", 1, None);
    boxed.spec.image = Some("registry.example/t1/job:1".into());
    let other = job("j2", "t2", 1, None);
    let d = decide(
        &[processes, containers],
        &[strict, tenant("t2", 0)],
        &[],
        &[boxed, other],
    );
    assert_eq!(placed(&d, "j1").map(|p| p.0), Some("n2".to_owned()));
    assert_eq!(
        placed(&d, "j2").map(|p| p.0),
        Some("n1".to_owned()),
        "other tenants go wherever runs them"
    );
}

#[test]
fn a_tenants_queue_is_taken_by_priority_then_age_with_interrupted_work_first() {
    let at = |j: &mut StoredJob, secs: i64| {
        j.created_at = chrono::DateTime::from_timestamp(1_700_000_000 + secs, 0).expect("time");
    };
    let mut old = job("old", "t1", 1, None);
    at(&mut old, 0);
    let mut new = job("new", "t1", 1, None);
    at(&mut new, 10);
    let mut urgent = job("urgent", "t1", 1, None);
    at(&mut urgent, 20);
    urgent.spec.priority = 100;
    let mut requeued = job("requeued", "t1", 1, None);
    at(&mut requeued, 30);
    requeued.attempt = 2;
    let mut other = job("other", "t2", 1, None);
    at(&mut other, 5);
    let places = super::queue_places(&[old, new, urgent, requeued, other]);
    let place = |id: &str| {
        let p = places[id];
        (p.position, p.length)
    };
    assert_eq!(place("urgent"), (1, 4));
    assert_eq!(place("requeued"), (2, 4));
    assert_eq!(place("old"), (3, 4));
    assert_eq!(place("new"), (4, 4));
    assert_eq!(place("other"), (1, 1), "each tenant has its own queue");
}

#[test]
fn with_fair_share_over_time_a_tenant_that_used_the_fleet_yields_to_one_that_did_not() {
    let nodes = [node("n1", &["H200"])];
    let tenants = [tenant("a", 0), tenant("b", 0)];
    let pass =
        |s: &mut LiveScheduler, at: DateTime<Utc>, holding: &[StoredJob], pending: &[StoredJob]| {
            s.decide(&Snapshot {
                nodes: &nodes,
                tenants: &tenants,
                holding,
                pending,
                now: at,
                reachable: None,
                forecasts: None,
            })
            .expect("a possible state")
        };
    // Both hold nothing now; a's job has waited longer.
    let mut a_next = job("a-next", "a", 1, None);
    a_next.created_at = now() - chrono::Duration::hours(2);
    let b_first = job("b-first", "b", 1, None);
    let held = [running_on(job("a-long", "a", 1, None), "n1", &[0])];
    let first_placed = |half_life: Option<std::time::Duration>| {
        let mut s = scheduler();
        if let Some(h) = half_life {
            s = s.with_fair_share_half_life(h);
        }
        // Over the last day a held the one GPU, passes ten minutes apart.
        for k in 0..144 {
            let at = now() - chrono::Duration::hours(24) + chrono::Duration::minutes(10 * k);
            pass(&mut s, at, &held, &[]);
        }
        let d = pass(&mut s, now(), &[], &[a_next.clone(), b_first.clone()]);
        let first = ["a-next", "b-first"]
            .into_iter()
            .find(|id| placed(&d, id).is_some())
            .expect("one of them runs");
        let other = if first == "a-next" {
            "b-first"
        } else {
            "a-next"
        };
        assert!(waits(&d, other).is_some(), "{d:?}");
        first
    };
    assert_eq!(
        first_placed(None),
        "a-next",
        "by what they hold now, they tie, and the older job goes first"
    );
    assert_eq!(
        first_placed(Some(std::time::Duration::from_secs(7 * 86_400))),
        "b-first",
        "a used the fleet all day: b goes first"
    );
}

/// A gang of `n` replicas of `gpus` GPUs each, pending, ids `{id}`, `{id}-r1`, …
fn gang(id: &str, tenant: &str, n: u32, gpus: u32) -> Vec<StoredJob> {
    (0..n)
        .map(|rank| {
            let rid = if rank == 0 {
                id.to_owned()
            } else {
                format!("{id}-r{rank}")
            };
            let mut j = job(&rid, tenant, gpus, None);
            j.spec.replicas = n;
            j.replica = Some(allot_domain::Replica {
                gang_id: id.into(),
                rank,
            });
            j
        })
        .collect()
}

fn gang_placed(d: &[LiveDecision], id: &str) -> Option<Vec<(String, String)>> {
    d.iter().find_map(|d| match d {
        LiveDecision::PlaceGang {
            gang_id, replicas, ..
        } if gang_id == id => Some(
            replicas
                .iter()
                .map(|r| (r.job_id.clone(), r.node_id.clone()))
                .collect(),
        ),
        _ => None,
    })
}

#[test]
fn a_gang_is_placed_whole_or_waits_whole() {
    let eight = ["H200"; 8];
    let nodes = [node("n1", &eight), node("n2", &eight)];
    let tenants = [tenant("t", 16)];

    // Two replicas of 8 GPUs: one on each node, in one decision.
    let two = gang("g", "t", 2, 8);
    let d = decide(&nodes, &tenants, &[], &two);
    let placed = gang_placed(&d, "g").expect("placed");
    assert_eq!(placed.len(), 2);
    assert_eq!(placed[0].0, "g");
    assert_eq!(placed[1].0, "g-r1");
    assert_ne!(placed[0].1, placed[1].1, "8 GPUs each: two nodes");
    assert!(placed_single(&d).is_empty(), "no replica placed alone");

    // Three replicas of 8 fit nowhere: every replica waits, with the same reason.
    let three = gang("h", "t", 3, 8);
    let d = decide(&nodes, &tenants, &[], &three);
    assert!(gang_placed(&d, "h").is_none());
    for r in &three {
        assert_eq!(
            waits(&d, &r.id).map(|r| r.code),
            Some("NoRoom".into()),
            "{}",
            r.id
        );
    }

    // A replica of the last attempt still running: the next attempt waits for it.
    let mut requeued = gang("g", "t", 2, 8);
    requeued[0].attempt = 2;
    let old = running_on(
        {
            let mut r = requeued[1].clone();
            r.preempt_reason = Some("replica 0 of its gang was requeued".into());
            r
        },
        "n2",
        &[0, 1, 2, 3, 4, 5, 6, 7],
    );
    let d = decide(&nodes, &tenants, std::slice::from_ref(&old), &requeued[..1]);
    assert!(gang_placed(&d, "g").is_none());
    assert_eq!(waits(&d, "g").map(|r| r.code), Some("GangStopping".into()));
}

fn placed_single(d: &[LiveDecision]) -> Vec<String> {
    d.iter()
        .filter_map(|d| match d {
            LiveDecision::Place { job_id, .. } => Some(job_id.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn reclaim_preempts_a_borrowing_gang_whole() {
    let four = ["H200"; 4];
    let nodes = [node("n1", &four), node("n2", &four)];
    let tenants = [tenant("owner", 4), tenant("borrower", 0)];
    let all = [0, 1, 2, 3];
    let running: Vec<StoredJob> = gang("b", "borrower", 2, 4)
        .into_iter()
        .zip(["n1", "n2"])
        .map(|(j, n)| running_on(j, n, &all))
        .collect();
    let claim = job("o1", "owner", 4, None);
    let d = decide(&nodes, &tenants, &running, std::slice::from_ref(&claim));
    let mut victims: Vec<(String, String)> = d
        .iter()
        .filter_map(|d| match d {
            LiveDecision::Preempt {
                job_id, node_id, ..
            } => Some((job_id.clone(), node_id.clone())),
            _ => None,
        })
        .collect();
    victims.sort();
    assert_eq!(
        victims,
        [
            ("b".to_owned(), "n1".to_owned()),
            ("b-r1".to_owned(), "n2".to_owned())
        ],
        "the whole gang, each replica on its node"
    );
}

/// A node of 8 H200s in two NVLink domains of four (0–3, 4–7).
fn two_islands(id: &str) -> Node {
    let mut n = node(id, &["H200"; 8]);
    for g in &mut n.gpus {
        g.nvlink_domain = Some(g.index / 4);
    }
    n
}

#[test]
fn a_multi_gpu_job_gets_one_nvlink_domain_when_one_is_free() {
    let nodes = [two_islands("n1")];
    let tenants = [tenant("t", 8)];
    // GPUs 0 and 1 are held: a 4-GPU job fits only in domain 1 (GPUs 4–7), and gets it
    // whatever the policy chose.
    let held = running_on(job("small", "t", 2, None), "n1", &[0, 1]);
    for policy in ["allot", "fgd", "bestfit", "gpu-packing", "dotprod"] {
        let mut s = LiveScheduler::new(
            policy,
            7,
            Config {
                min_runtime_secs: 60,
                gpu_limits: GpuLimits::default(),
            },
        )
        .expect("known policy");
        let d = s
            .decide(&Snapshot {
                nodes: &nodes,
                tenants: &tenants,
                holding: std::slice::from_ref(&held),
                pending: &[job("four", "t", 4, None), job("two", "t", 2, None)],
                now: now(),
                reachable: None,
                forecasts: None,
            })
            .expect("decides");
        let (_, four, _) = placed(&d, "four").expect("placed");
        let mut four = four;
        four.sort();
        assert_eq!(
            four,
            ["n1-gpu4", "n1-gpu5", "n1-gpu6", "n1-gpu7"],
            "{policy}: one domain"
        );
        // What is left of domain 0 goes to the 2-GPU job, never a GPU already taken.
        let (_, mut two, _) = placed(&d, "two").expect("placed");
        two.sort();
        assert_eq!(two, ["n1-gpu2", "n1-gpu3"], "{policy}");
    }
}

/// A whole GPU holds all of its memory: a tenant limited to 200 GiB of GPU memory holds one
/// H200 (141 GiB), and a second waits, saying so.
#[test]
fn whole_gpus_count_all_their_memory_against_a_gpu_memory_limit() {
    let nodes = [node("n1", &["H200", "H200", "H200", "H200"])];
    let mut capped = tenant("capped", 0);
    capped.quota.limit.gpu_memory_bytes = Some(200 << 30);
    let tenants = [capped];
    let first = running_on(job("first", "capped", 1, None), "n1", &[0]);
    let d = decide(
        &nodes,
        &tenants,
        &[first],
        &[job("second", "capped", 1, None)],
    );
    let r = waits(&d, "second").expect("over the GPU-memory limit");
    assert_eq!(r.code, "TenantLimit");
    assert!(r.message.contains("GiB of GPU memory"), "{}", r.message);
    // A share holds what it asked for: 40 GiB fits beside the whole GPU.
    let mut small = job("small", "capped", 1, Some(250));
    small.spec.gpu_memory_bytes = Some(40 << 30);
    let first = running_on(job("first", "capped", 1, None), "n1", &[0]);
    let d = decide(&nodes, &tenants, &[first], &[small]);
    assert!(placed(&d, "small").is_some(), "{d:#?}");
}

fn mig_node(id: &str, instances: &[(&str, u8)]) -> Node {
    let mut n = node(id, &["H200"]);
    let geometry = allot_domain::mig::geometry("H200", Some(141 << 10)).expect("H200 MIG");
    n.gpus[0].mig = Some(
        instances
            .iter()
            .map(|&(uuid, start)| allot_domain::MigSlot {
                profile: geometry.profile_named("1g.18gb").expect("profile").id,
                start,
                uuid: uuid.into(),
            })
            .collect(),
    );
    n
}

/// A MIG instance holds its compute slices of seven against the tenant's GPU limit, exactly:
/// a tenant limited to one GPU holds seven 1g instances, and an eighth (or a whole GPU
/// beside them) waits.
#[test]
fn mig_instances_count_in_sevenths_against_a_gpu_limit() {
    let slots: Vec<(String, u8)> = (0..7).map(|i| (format!("MIG-{i}"), i)).collect();
    let refs: Vec<(&str, u8)> = slots.iter().map(|(u, s)| (u.as_str(), *s)).collect();
    let nodes = [mig_node("m1", &refs), node("n2", &["H200"])];
    let mut capped = tenant("capped", 0);
    capped.quota.limit.gpu_milli = Some(1000);
    let tenants = [capped];
    let mig_job = |id: &str, instance: Option<&str>| {
        let mut j = job(id, "capped", 1, None);
        j.spec.mig_profile = Some("1g.18gb".into());
        if let Some(u) = instance {
            j.state = JobState::Running;
            j.node_id = Some("m1".into());
            j.gpu_uuids = vec![u.into()];
        }
        j
    };
    let holding: Vec<StoredJob> = (0..6)
        .map(|i| mig_job(&format!("h{i}"), Some(&format!("MIG-{i}"))))
        .collect();
    // Six of seven held: the seventh is placed, exactly at the limit.
    let d = decide(&nodes, &tenants, &holding, &[mig_job("seventh", None)]);
    assert!(placed(&d, "seventh").is_some(), "{d:#?}");
    // Seven held: an eighth instance and a whole GPU both wait for the limit.
    let mut holding = holding;
    holding.push(mig_job("h6", Some("MIG-6")));
    let d = decide(
        &nodes,
        &tenants,
        &holding,
        &[mig_job("eighth", None), job("whole", "capped", 1, None)],
    );
    assert_eq!(
        waits(&d, "whole").map(|r| r.code),
        Some("TenantLimit".into())
    );
    let r = waits(&d, "whole").expect("waits");
    assert!(r.message.contains("1 of 1 GPU in use"), "{}", r.message);
    assert!(placed(&d, "eighth").is_none(), "{d:#?}");
}
