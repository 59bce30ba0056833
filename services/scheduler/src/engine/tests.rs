use std::collections::HashMap;

use proptest::prelude::*;
use rand::SeedableRng;

use super::*;
use crate::placement::{self, Node};
use crate::quota::gpu_queue as queue;

pub(super) const GIB: u32 = 1024;

pub(super) fn cluster(nodes: &[(u8, u32, u32)]) -> Cluster {
    let nodes: Vec<Node> = nodes
        .iter()
        .enumerate()
        .map(|(i, &(gpus, cpus, gib))| Node {
            name: format!("n{i}"),
            cpu_milli: cpus * 1000,
            memory_mib: gib * GIB,
            gpus,
            model: "H200".into(),
            gpu_memory_mib: 80 * GIB,
        })
        .collect();
    Cluster::new(&nodes)
}

pub(super) fn job(id: &str, queue: &str, gpus: u8, gpu_milli: u32, seq: u64) -> Job {
    Job {
        id: id.into(),
        queue: queue.into(),
        request: Request {
            cpu_milli: 1000,
            memory_mib: GIB,
            num_gpu: gpus,
            gpu_milli,
            models: u64::MAX,
        },
        replicas: 1,
        priority: 0,
        preemptible: true,
        seq,
        gpu_memory_mib: 0,
        whole_gpu_memory_mib: 0,
        isolation: None,
        class: None,
        avoid: Default::default(),
        pack: None,
        best_effort: false,
        sizing: None,
    }
}

pub(super) const CONFIG: Config = Config {
    min_runtime_secs: 60,
    gpu_limits: GpuLimits {
        max_jobs_per_shared_gpu: 3,
        shared_memory_reserve_pct: 10,
        sized_headroom_milli: 100,
    },
};

pub(super) fn pass(
    cluster: &Cluster,
    tree: &QuotaTree,
    running: &[Running],
    pending: &[Job],
    now: i64,
) -> Vec<Decision> {
    let mut policy = placement::policy("allot", cluster, &[]).expect("policy");
    for j in pending {
        for _ in 0..j.replicas {
            policy.arrived(cluster, &j.request);
        }
    }
    let world = World {
        cluster,
        tree,
        running,
        now,
        config: CONFIG,
        past_usage: None,
        outside: &[],
    };
    let mut rng = StdRng::seed_from_u64(7);
    schedule(world, pending, policy.as_mut(), &mut rng).expect("a possible state")
}

/// Applies `decisions`: placed jobs start at `now`, preempted ones go back to pending.
pub(super) fn apply(
    decisions: &[Decision],
    running: &mut Vec<Running>,
    pending: &mut Vec<Job>,
    now: i64,
) {
    for d in decisions {
        match d {
            Decision::Place {
                job_id,
                request,
                placements,
                ..
            } => {
                let i = pending
                    .iter()
                    .position(|j| &j.id == job_id)
                    .expect("pending job");
                let mut job = pending.remove(i);
                job.request = *request;
                running.push(Running {
                    job,
                    placements: placements.clone(),
                    started_at: now,
                });
            }
            Decision::Preempt { job_id, .. } | Decision::Move { job_id, .. } => {
                let i = running
                    .iter()
                    .position(|r| &r.job.id == job_id)
                    .expect("running job");
                pending.push(running.remove(i).job);
            }
            Decision::Wait { .. } => {}
        }
    }
}

pub(super) fn placed(decisions: &[Decision]) -> Vec<&str> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Place { job_id, .. } => Some(job_id.as_str()),
            _ => None,
        })
        .collect()
}

pub(super) fn preempted(decisions: &[Decision]) -> Vec<&str> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Preempt { job_id, .. } => Some(job_id.as_str()),
            _ => None,
        })
        .collect()
}

fn reason<'d>(decisions: &'d [Decision], id: &str) -> &'d PendingReason {
    decisions
        .iter()
        .find_map(|d| match d {
            Decision::Wait { job_id, reason } if job_id == id => Some(reason),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{id} does not wait: {decisions:#?}"))
}

#[test]
fn a_tenant_within_its_guarantee_reclaims_from_a_borrower() {
    let cluster = cluster(&[(4, 64, 256)]);
    let tree = QuotaTree::new(vec![
        queue("org", None, 4, None),
        queue("a", Some("org"), 2, None),
        queue("b", Some("org"), 2, None),
    ])
    .expect("tree");
    // Tenant a borrows all four GPUs while b is idle.
    let mut running = Vec::new();
    let mut pending: Vec<Job> = (0..4)
        .map(|i| job(&format!("a{i}"), "a", 1, 1000, i))
        .collect();
    let first = pass(&cluster, &tree, &running, &pending, 0);
    assert_eq!(placed(&first).len(), 4);
    let borrowed: Vec<bool> = first
        .iter()
        .filter_map(|d| match d {
            Decision::Place { borrowing, .. } => Some(*borrowing),
            _ => None,
        })
        .collect();
    assert_eq!(
        borrowed,
        [false, false, true, true],
        "the third and fourth are borrowed"
    );
    apply(&first, &mut running, &mut pending, 0);

    // b asks for its guarantee before a's jobs ran the minimum time: it waits.
    pending.push(job("b0", "b", 1, 1000, 10));
    let early = pass(&cluster, &tree, &running, &pending, 30);
    assert!(preempted(&early).is_empty());
    assert_eq!(
        reason(&early, "b0").message,
        "no node has room for 1 whole GPU, 1 CPU, 1 GiB; tenant b: 0 of 2 guaranteed GPUs in use; \
         nothing preemptible is borrowed where it would make room"
    );

    // Later, the newest borrowed job of a goes, and a keeps its guarantee.
    let later = pass(&cluster, &tree, &running, &pending, 120);
    assert_eq!(preempted(&later), ["a3"]);
    assert_eq!(placed(&later), ["b0"]);
    let Some(Decision::Preempt { reason, .. }) = later.first() else {
        panic!("{later:#?}")
    };
    assert!(
        reason.contains("tenant a held 4 of 2 GPUs guaranteed; reclaimed for b0"),
        "{reason}"
    );
    apply(&later, &mut running, &mut pending, 120);
    // a3 is back in the queue, but a is at its guarantee: nothing more moves.
    let again = pass(&cluster, &tree, &running, &pending, 500);
    assert!(
        preempted(&again).is_empty() && placed(&again).is_empty(),
        "{again:#?}"
    );
}

#[test]
fn limits_gangs_and_fair_order() {
    let cluster = cluster(&[(8, 64, 512), (8, 64, 512)]);
    let tree = QuotaTree::new(vec![
        queue("org", None, 0, None),
        queue("a", Some("org"), 0, Some(3)),
        queue("b", Some("org"), 0, None),
    ])
    .expect("tree");
    let mut gang = job("gang", "b", 4, 1000, 3);
    gang.replicas = 4;
    let pending = vec![
        job("a-big", "a", 2, 1000, 0),
        job("a-more", "a", 2, 1000, 1),
        gang,
        job("b-small", "b", 1, 500, 4),
    ];
    let d = pass(&cluster, &tree, &[], &pending, 0);
    assert_eq!(
        reason(&d, "a-more").message,
        "tenant a: 2 of 3 GPUs in use (limit); request 2"
    );
    assert_eq!(reason(&d, "a-more").code, "TenantLimit");
    let gang_wait = reason(&d, "gang");
    assert!(
        gang_wait
            .message
            .starts_with("no node has room for 4 replicas (all or none) of 4 whole GPUs"),
        "{gang_wait:?}"
    );
    assert_eq!(
        placed(&d),
        ["a-big", "b-small"],
        "fair order: a first (older), then b"
    );
}

#[test]
fn isolation_levels_constrain_placement() {
    let cluster = cluster(&[(4, 64, 256), (4, 64, 256)]);
    let mut secure = queue("secure", None, 0, None);
    secure.min_isolation = Isolation::Dedicated;
    let tree = QuotaTree::new(vec![queue("web", None, 0, None), secure]).expect("tree");
    let mut inference = job("infer", "web", 1, 300, 0);
    inference.class = Some(WorkloadClass::Inference);
    let mut mig = job("mig", "web", 1, 1000, 3);
    mig.isolation = Some(Isolation::Mig);
    let pending = vec![
        inference,
        job("secret", "secure", 1, 500, 1),
        job("secret-2", "secure", 2, 1000, 2),
        mig,
    ];
    let d = pass(&cluster, &tree, &[], &pending, 0);
    let node_of = |id: &str| {
        d.iter().find_map(|x| match x {
            Decision::Place {
                job_id,
                placements,
                request,
                ..
            } if job_id == id => Some((placements[0].node, request.gpu_milli)),
            _ => None,
        })
    };
    let (web_node, _) = node_of("infer").expect("inference placed");
    let (secret_node, held) = node_of("secret").expect("secret placed");
    assert_ne!(web_node, secret_node, "the tenant's minimum is dedicated");
    assert_eq!(held, 1000, "a dedicated half GPU holds the whole GPU");
    assert_eq!(
        node_of("secret-2").map(|p| p.0),
        Some(secret_node),
        "its own node is fine"
    );
    assert_eq!(reason(&d, "mig").code, "MigUnavailable");

    // Another dedicated job of a second tenant finds no node free of others' work.
    let tree = QuotaTree::new(vec![
        queue("web", None, 0, None),
        queue("secure", None, 0, None),
        queue("other", None, 0, None),
    ])
    .expect("tree");
    let mut training = job("train", "other", 1, 1000, 9);
    training.class = Some(WorkloadClass::Training);
    let running: Vec<Running> = [("w", "web", 0), ("s", "secure", 1)]
        .iter()
        .map(|&(id, q, node)| Running {
            job: job(id, q, 1, 250, 0),
            placements: vec![Choice {
                node,
                gpus: vec![0],
            }],
            started_at: 0,
        })
        .collect();
    let d = pass(&cluster, &tree, &running, &[training], 0);
    let wait = reason(&d, "train");
    assert!(wait.message.contains("at isolation dedicated"), "{wait:?}");
}

#[test]
fn running_jobs_that_cannot_be_are_refused() {
    let cluster = cluster(&[(2, 16, 64)]);
    let tree = QuotaTree::new(vec![queue("a", None, 0, None)]).expect("tree");
    let run = |id: &str, node: usize, gpus: Vec<u8>| Running {
        job: job(id, "a", 1, 1000, 0),
        placements: vec![Choice { node, gpus }],
        started_at: 0,
    };
    let mut policy = placement::policy("allot", &cluster, &[]).expect("policy");
    let mut rng = StdRng::seed_from_u64(1);
    for (running, want) in [
        (
            vec![run("x", 3, vec![0])],
            "running job `x`: there is no node 3",
        ),
        (
            vec![run("x", 0, vec![5])],
            "running job `x`: node 0 has no GPU 5",
        ),
        (
            vec![run("x", 0, vec![0]), run("y", 0, vec![0])],
            "running job `y`: node 0 cannot hold it with what runs there already",
        ),
    ] {
        let world = World {
            cluster: &cluster,
            tree: &tree,
            running: &running,
            now: 0,
            config: CONFIG,
            past_usage: None,
            outside: &[],
        };
        let err = schedule(world, &[], policy.as_mut(), &mut rng).expect_err(want);
        assert_eq!(err.to_string(), want);
    }
}

#[test]
fn gpu_memory_is_asked_reserved_and_counted() {
    let cluster = cluster(&[(1, 64, 256)]);
    let mut team = queue("team", None, 0, None);
    team.limit.0[Resource::GpuMemoryMib as usize] = Some(u64::from(200 * GIB));
    let tree = QuotaTree::new(vec![team]).expect("tree");
    let with_memory = |id: &str, milli, gib: u32, seq| Job {
        gpu_memory_mib: gib * GIB,
        whole_gpu_memory_mib: 0,
        ..job(id, "team", 1, milli, seq)
    };
    let pending = vec![
        with_memory("a", 300, 40, 0),
        with_memory("b", 300, 33, 1),
        with_memory("c", 300, 32, 2),
        with_memory("big", 1000, 81, 3),
    ];
    let d = pass(&cluster, &tree, &[], &pending, 0);
    assert_eq!(
        placed(&d),
        ["a", "c"],
        "72 of 80 GiB may be shared: 40 + 32"
    );
    assert!(
        reason(&d, "b")
            .message
            .starts_with("no node has room for 0.3 of a GPU, 33 GiB of GPU memory per GPU")
    );
    assert!(
        reason(&d, "big")
            .message
            .contains("81 GiB of GPU memory per GPU")
    );
    let over = pass(
        &cluster,
        &tree,
        &[],
        &[with_memory("huge", 1000, 201, 0)],
        0,
    );
    assert_eq!(
        reason(&over, "huge").message,
        "tenant team: 0 of 200 GiB of GPU memory in use (limit); request 201"
    );
}

/// Checks that what is running fits every GPU, node and quota limit.
fn check_capacity(
    cluster: &Cluster,
    tree: &QuotaTree,
    running: &[Running],
) -> Result<(), TestCaseError> {
    let mut gpu: HashMap<(usize, u8), u32> = HashMap::new();
    let mut node: HashMap<usize, (u32, u32)> = HashMap::new();
    let mut usage = Usage::new(tree);
    for r in running {
        prop_assert_eq!(
            r.placements.len(),
            r.job.replicas as usize,
            "a gang is whole"
        );
        for c in &r.placements {
            prop_assert_eq!(c.gpus.len(), usize::from(r.job.request.num_gpu));
            for &g in &c.gpus {
                *gpu.entry((c.node, g)).or_default() += r.job.request.gpu_milli;
            }
            let n = node.entry(c.node).or_default();
            n.0 += r.job.request.cpu_milli;
            n.1 += r.job.request.memory_mib;
        }
        usage.take(
            tree,
            tree.find(&r.job.queue).expect("queue"),
            &r.job.amounts(),
        );
    }
    // Isolation: a node with a dedicated job runs no other tenant's work, and a shared GPU
    // holds at most the job limit.
    let mut tenants: HashMap<usize, Vec<(String, Isolation)>> = HashMap::new();
    let mut shared_jobs: HashMap<(usize, u8), u32> = HashMap::new();
    let mut shared_mib: HashMap<(usize, u8), u64> = HashMap::new();
    for r in running {
        let q = tree.find(&r.job.queue).expect("queue");
        let level = level_of(tree, &r.job, q);
        prop_assert!(
            level != Isolation::Mig || r.job.request.num_gpu == 0,
            "no MIG yet"
        );
        for c in &r.placements {
            tenants
                .entry(c.node)
                .or_default()
                .push((r.job.queue.clone(), level));
            let capacity = cluster.gpu_memory_mib[c.node];
            let asks = if r.job.request.num_gpu > 0 {
                r.job.gpu_memory_mib
            } else {
                0
            };
            prop_assert!(asks <= capacity, "more GPU memory than the GPU has");
            if r.job.request.is_shared() {
                for &g in &c.gpus {
                    *shared_jobs.entry((c.node, g)).or_default() += 1;
                    *shared_mib.entry((c.node, g)).or_default() += u64::from(r.job.gpu_memory_mib);
                }
            }
            if level == Isolation::Dedicated && r.job.request.num_gpu > 0 {
                prop_assert_eq!(r.job.request.gpu_milli, 1000, "dedicated holds whole GPUs");
            }
        }
    }
    for (n, here) in &tenants {
        if let Some((owner, _)) = here.iter().find(|(_, l)| *l == Isolation::Dedicated) {
            prop_assert!(
                here.iter().all(|(t, _)| t == owner),
                "node {n} dedicated to {owner}: {here:?}"
            );
        }
    }
    for ((n, g), mib) in shared_mib {
        let budget = CONFIG
            .gpu_limits
            .shared_memory_budget(cluster.gpu_memory_mib[n]);
        prop_assert!(
            mib <= budget,
            "GPU {g} of node {n}: {mib} MiB shared, budget {budget}"
        );
    }
    for ((n, g), jobs) in shared_jobs {
        prop_assert!(
            jobs <= CONFIG.gpu_limits.max_jobs_per_shared_gpu,
            "GPU {g} of node {n}: {jobs} jobs"
        );
    }
    for ((n, g), milli) in gpu {
        prop_assert!(milli <= 1000, "GPU {g} of node {n} holds {milli} milli");
        prop_assert!(usize::from(g) < cluster.nodes[n].gpu_free.len());
    }
    for (n, (cpu, memory)) in node {
        prop_assert!(cpu <= cluster.nodes[n].cpu_free && memory <= cluster.nodes[n].memory_free);
    }
    for q in 0..tree.len() {
        for r in Resource::ALL {
            if let Some(limit) = tree.spec(q).limit.get(r) {
                prop_assert!(
                    usage.of(q).get(r) <= limit,
                    "{} over its limit",
                    tree.spec(q).id
                );
            }
        }
    }
    Ok(())
}

fn usage_of(tree: &QuotaTree, running: &[Running]) -> Usage {
    let mut usage = Usage::new(tree);
    for r in running {
        usage.take(
            tree,
            tree.find(&r.job.queue).expect("queue"),
            &r.job.amounts(),
        );
    }
    usage
}

/// A generated job: team, GPUs, milli per GPU, CPUs, GiB, replicas, priority, preemptible,
/// isolation asked for, GPU memory per GPU in GiB.
type JobSpec = (
    usize,
    u8,
    u32,
    u32,
    u32,
    u32,
    i32,
    bool,
    Option<Isolation>,
    u32,
);

fn arb_job() -> impl Strategy<Value = JobSpec> {
    (
        0usize..3,
        prop_oneof![Just(0u8), Just(1), Just(1), Just(2), Just(4)],
        prop_oneof![Just(250u32), Just(500), Just(1000), Just(1000)],
        1u32..16,
        1u32..64,
        1u32..3,
        0i32..3,
        prop::bool::weighted(0.8),
        prop_oneof![
            4 => Just(None),
            2 => Just(Some(Isolation::Shared)),
            2 => Just(Some(Isolation::Dedicated)),
            1 => Just(Some(Isolation::Mig)),
        ],
        prop_oneof![Just(0u32), 1u32..48, Just(90)],
    )
}

fn make_jobs(specs: &[JobSpec], first_seq: u64) -> Vec<Job> {
    specs
        .iter()
        .enumerate()
        .map(
            |(
                i,
                &(
                    team,
                    gpus,
                    milli,
                    cpus,
                    gib,
                    replicas,
                    priority,
                    preemptible,
                    isolation,
                    gpu_gib,
                ),
            )| {
                let seq = first_seq + i as u64;
                Job {
                    id: format!("j{seq}"),
                    queue: format!("team{team}"),
                    request: Request {
                        cpu_milli: cpus * 1000,
                        memory_mib: gib * GIB,
                        num_gpu: gpus,
                        gpu_milli: if gpus == 1 { milli } else { 1000 },
                        models: u64::MAX,
                    },
                    replicas,
                    priority,
                    preemptible,
                    seq,
                    gpu_memory_mib: gpu_gib * GIB,
                    whole_gpu_memory_mib: 0,
                    isolation,
                    class: None,
                    avoid: Default::default(),
                    pack: None,
                    best_effort: false,
                    sizing: None,
                }
            },
        )
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn capacity_guarantees_and_stability_hold(
        nodes in prop::collection::vec((prop_oneof![Just(4u8), Just(8)], 16u32..96, 64u32..512), 1..5),
        guarantees in prop::collection::vec(0u64..6, 3),
        limits in prop::collection::vec(prop::option::of(2u64..12), 3),
        first in prop::collection::vec(arb_job(), 0..24),
        second in prop::collection::vec(arb_job(), 0..16),
    ) {
        let cluster = cluster(&nodes);
        let mut specs = vec![queue("org", None, guarantees.iter().sum(), None)];
        for (i, (&g, &l)) in guarantees.iter().zip(&limits).enumerate() {
            specs.push(queue(&format!("team{i}"), Some("org"), g, l.map(|l| l.max(g))));
        }
        let tree = QuotaTree::new(specs).expect("tree");
        let (mut running, mut pending) = (Vec::new(), make_jobs(&first, 0));
        let d = pass(&cluster, &tree, &running, &pending, 0);
        prop_assert!(preempted(&d).is_empty(), "nothing runs yet, so nothing is preempted");
        apply(&d, &mut running, &mut pending, 0);
        check_capacity(&cluster, &tree, &running)?;

        // New work arrives once everything has run the minimum time.
        pending.extend(make_jobs(&second, 1000));
        let before = usage_of(&tree, &running);
        let d = pass(&cluster, &tree, &running, &pending, 1000);
        let victims: Vec<String> = preempted(&d).into_iter().map(str::to_owned).collect();
        apply(&d, &mut running, &mut pending, 1000);
        check_capacity(&cluster, &tree, &running)?;
        // Reclaim never takes a team below its guarantee (or below where it was). (Every
        // reclaim here is between teams of one organisation, whose own total may move.)
        let after = usage_of(&tree, &running);
        for q in 1..tree.len() {
            for r in Resource::ALL {
                let floor = before.of(q).get(r).min(tree.spec(q).guaranteed.get(r));
                prop_assert!(after.of(q).get(r) >= floor,
                    "{} taken below its guarantee of {:?} (victims {:?})", tree.spec(q).id, r, victims);
            }
        }
        // Scheduling the resulting state again at the same time preempts nothing; as time
        // passes (and jobs placed since pass the minimum runtime), reclaim settles within a
        // few passes instead of looping.
        let d = pass(&cluster, &tree, &running, &pending, 1000);
        prop_assert!(preempted(&d).is_empty(), "a stable state preempted: {d:#?}");
        let mut settled = false;
        for round in 1..=8 {
            let now = 1000 + 1000 * round;
            let d = pass(&cluster, &tree, &running, &pending, now);
            if preempted(&d).is_empty() {
                settled = true;
                break;
            }
            apply(&d, &mut running, &mut pending, now);
            check_capacity(&cluster, &tree, &running)?;
        }
        prop_assert!(settled, "still preempting after eight passes");
    }
}

#[test]
fn a_job_keeps_clear_of_where_it_faulted() {
    let tree = QuotaTree::new(vec![queue("t", None, 0, None)]).expect("tree");
    let placement = |d: &[Decision]| {
        d.iter().find_map(|d| match d {
            Decision::Place { placements, .. } => Some(placements[0].clone()),
            _ => None,
        })
    };
    // Two nodes: the one it was lost on is avoided, whatever the policy prefers.
    let two = cluster(&[(1, 64, 256), (1, 64, 256)]);
    for lost in [0, 1] {
        let mut j = job("j", "t", 1, 1000, 0);
        j.avoid.nodes = vec![lost];
        let c = placement(&pass(&two, &tree, &[], &[j], 0)).expect("placed");
        assert_ne!(c.node, lost);
    }
    // One node, two GPUs: the GPU it faulted on is avoided, whole or shared.
    let one = cluster(&[(2, 64, 256)]);
    for (milli, faulted) in [(1000, 0u8), (1000, 1), (250, 0), (250, 1)] {
        let mut j = job("j", "t", 1, milli, 0);
        j.avoid.gpus = vec![(0, faulted)];
        let c = placement(&pass(&one, &tree, &[], &[j], 0)).expect("placed");
        assert_eq!(
            c.gpus,
            vec![1 - faulted],
            "{milli} milli, GPU {faulted} avoided"
        );
    }
    // Nowhere else to go: it waits rather than going back.
    let mut j = job("j", "t", 1, 1000, 0);
    j.avoid.nodes = vec![0];
    let d = pass(&cluster(&[(1, 64, 256)]), &tree, &[], &[j], 0);
    assert!(placement(&d).is_none(), "{d:?}");
}

#[test]
fn a_waiting_gang_has_free_room_held_for_it_rather_than_starve() {
    let tree = QuotaTree::new(vec![queue("t", None, 0, None)]).expect("tree");
    // Two nodes of four GPUs; two of node 0's are busy.
    let two = cluster(&[(4, 64, 256), (4, 64, 256)]);
    let busy = Running {
        job: job("busy", "t", 2, 1000, 0),
        placements: vec![Choice {
            node: 0,
            gpus: vec![0, 1],
        }],
        started_at: 0,
    };
    // A gang of two replicas of four GPUs, older than three jobs of one GPU.
    let mut gang = job("gang", "t", 4, 1000, 1);
    gang.replicas = 2;
    let singles: Vec<Job> = (2..5)
        .map(|i| job(&format!("s{i}"), "t", 1, 1000, i))
        .collect();
    let mut pending = vec![gang];
    pending.extend(singles);
    let d = pass(&two, &tree, std::slice::from_ref(&busy), &pending, 100);
    // Node 1 (all four free) is held for the gang: the singles take node 0's two free GPUs
    // only, and the third waits.
    let mut placed_now = placed(&d);
    placed_now.sort_unstable();
    assert_eq!(placed_now.len(), 2, "{d:#?}");
    let on_node_one = d.iter().any(|d| {
        matches!(d, Decision::Place { placements, .. } if placements.iter().any(|c| c.node == 1))
    });
    assert!(!on_node_one, "node 1 is held for the gang: {d:#?}");
    let gang_wait = reason(&d, "gang");
    assert!(
        gang_wait
            .message
            .contains("room for 1 of its 2 replicas is held for it"),
        "{gang_wait:?}"
    );
    // Once the busy job ends, the gang runs whole.
    let d = pass(&two, &tree, &[], &pending[..1], 200);
    assert_eq!(placed(&d), ["gang"]);
}

/// A tenant above a hard limit (an admin lowered it, or a race placed past it) is brought
/// back under it by stopping its own latest started preemptible work, lowest priority
/// first, and
/// never another tenant's; a parent over its limit sheds from its teams.
#[test]
fn a_tenant_over_its_hard_limit_sheds_its_own_newest_work() {
    let cluster = cluster(&[(8, 64, 512), (8, 64, 512)]);
    let held = |id: &str, queue: &str, gpus: u8, seq: u64, node: usize, first: u8| Running {
        job: job(id, queue, gpus, 1000, seq),
        placements: vec![Choice {
            node,
            gpus: (first..first + gpus).collect(),
        }],
        started_at: 0,
    };
    // interns holds 6 GPUs against a limit lowered to 3; others holds 8 with no limit.
    let tree = QuotaTree::new(vec![
        queue("org", None, 0, None),
        queue("interns", Some("org"), 0, Some(3)),
        queue("others", Some("org"), 0, None),
    ])
    .expect("tree");
    let mut pinned = held("i-pinned", "interns", 1, 0, 0, 0);
    pinned.job.preemptible = false;
    let mut important = held("i-important", "interns", 1, 5, 0, 1);
    important.job.priority = 100;
    let running = vec![
        pinned,
        held("i-old", "interns", 2, 1, 0, 2),
        important,
        held("i-new", "interns", 2, 6, 0, 4),
        held("o-big", "others", 8, 7, 1, 0),
    ];
    let d = pass(&cluster, &tree, &running, &[], 10);
    // 6 of 3: i-new (newest, 2 GPUs) goes first, then i-old (the important one is kept,
    // the pinned one cannot be preempted): 2 left.
    assert_eq!(preempted(&d), ["i-new", "i-old"], "{d:#?}");
    let Some(Decision::Preempt {
        reason: why,
        for_job,
        ..
    }) = d.first()
    else {
        panic!("{d:#?}")
    };
    assert_eq!(*for_job, None);
    assert!(
        why.contains("tenant interns holds 6 against its hard limit of 3 GPUs"),
        "{why}"
    );
    // Shed, a pass moves nothing more; a waiting job of the tenant stays within the limit.
    let mut running = running;
    let mut pending = vec![job("i-waiting", "interns", 2, 1000, 8)];
    apply(&d, &mut running, &mut pending, 10);
    pending.retain(|j| j.id == "i-waiting");
    let again = pass(&cluster, &tree, &running, &pending, 20);
    assert!(preempted(&again).is_empty(), "{again:#?}");
    assert!(placed(&again).is_empty(), "{again:#?}");
    assert_eq!(reason(&again, "i-waiting").code, "TenantLimit");

    // The latest started goes first, whenever it was submitted: the least work is lost.
    let mut late = held("i-late", "interns", 2, 1, 0, 0);
    late.started_at = 500;
    let mut early = held("i-early", "interns", 2, 6, 0, 2);
    early.started_at = 100;
    let d = pass(&cluster, &tree, &[late, early], &[], 1000);
    assert_eq!(preempted(&d), ["i-late"], "{d:#?}");

    // A parent over its own limit sheds from its teams, the newest first.
    let tree = QuotaTree::new(vec![
        queue("research", None, 0, Some(4)),
        queue("vision", Some("research"), 0, None),
        queue("nlp", Some("research"), 0, None),
        queue("ops", None, 0, None),
    ])
    .expect("tree");
    let running = vec![
        held("v1", "vision", 2, 0, 0, 0),
        held("n1", "nlp", 2, 1, 0, 2),
        held("v2", "vision", 2, 2, 0, 4),
        held("ops1", "ops", 8, 3, 1, 0),
    ];
    let d = pass(&cluster, &tree, &running, &[], 10);
    assert_eq!(preempted(&d), ["v2"], "{d:#?}");
}

/// A best-effort job: the least share of one GPU and `gib` of its memory.
pub(super) fn best_effort(id: &str, queue: &str, gib: u32, seq: u64) -> Job {
    Job {
        gpu_memory_mib: gib * GIB,
        best_effort: true,
        ..job(id, queue, 1, allot_domain::BEST_EFFORT_MILLI, seq)
    }
}

fn gpus_of<'d>(decisions: &'d [Decision], id: &str) -> &'d [Choice] {
    decisions
        .iter()
        .find_map(|d| match d {
            Decision::Place {
                job_id, placements, ..
            } if job_id == id => Some(placements.as_slice()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{id} is not placed: {decisions:#?}"))
}

#[test]
fn best_effort_work_spreads_over_what_other_jobs_leave() {
    // One node, three GPUs: GPU 0 runs a service at 0.6, the others are idle.
    let cluster = cluster(&[(3, 64, 256)]);
    let tree = QuotaTree::new(vec![
        queue("svc", None, 0, None),
        queue("batch", None, 0, None),
    ])
    .expect("tree");
    let mut running = Vec::new();
    let mut pending = vec![job("svc", "svc", 1, 600, 0)];
    let first = pass(&cluster, &tree, &running, &pending, 0);
    apply(&first, &mut running, &mut pending, 0);
    let service_gpu = running[0].placements[0].gpus[0];
    pending = (1..=3)
        .map(|i| best_effort(&format!("be{i}"), "batch", 4, i))
        .collect();
    let d = pass(&cluster, &tree, &running, &pending, 10);
    let mut gpus: Vec<u8> = (1..=3)
        .map(|i| gpus_of(&d, &format!("be{i}"))[0].gpus[0])
        .collect();
    // The first two take the idle GPUs (the most compute free), the third the service's:
    // one on each GPU, not packed onto one.
    assert_ne!(gpus[0], service_gpu, "{d:#?}");
    assert_ne!(gpus[1], service_gpu, "{d:#?}");
    assert_eq!(gpus[2], service_gpu, "{d:#?}");
    gpus.sort_unstable();
    assert_eq!(gpus, [0, 1, 2]);
    // Negative control: the same jobs not best-effort are packed (the placement policy's
    // rule), not spread one to a GPU.
    let packed: Vec<Job> = pending
        .iter()
        .map(|j| Job {
            best_effort: false,
            ..j.clone()
        })
        .collect();
    let d = pass(&cluster, &tree, &running, &packed, 10);
    let mut gpus: Vec<u8> = packed
        .iter()
        .map(|j| gpus_of(&d, &j.id)[0].gpus[0])
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    assert!(gpus.len() < 3, "{d:#?}");
}

#[test]
fn any_job_that_is_not_best_effort_takes_the_place_of_best_effort_work() {
    // One GPU, one node: a best-effort job of tenant batch holds 60 of its 80 GiB.
    let cluster = cluster(&[(1, 64, 256)]);
    let tree = QuotaTree::new(vec![
        queue("svc", None, 0, None),
        queue("batch", None, 0, None),
    ])
    .expect("tree");
    let be = Running {
        job: best_effort("be", "batch", 60, 0),
        placements: vec![Choice {
            node: 0,
            gpus: vec![0],
        }],
        started_at: 0,
    };
    let running = vec![be.clone()];
    // A whole-GPU job with no guarantee at all, a second after the best-effort one started
    // (no minimum runtime holds best-effort work).
    let whole = pass(
        &cluster,
        &tree,
        &running,
        &[job("train", "svc", 1, 1000, 1)],
        1,
    );
    assert_eq!(preempted(&whole), ["be"], "{whole:#?}");
    assert_eq!(placed(&whole), ["train"]);
    let Some(Decision::Preempt { reason, .. }) = whole.first() else {
        panic!("{whole:#?}")
    };
    assert_eq!(
        reason,
        "best-effort: gave its place up to train (tenant svc)"
    );
    // A share whose compute fits beside it but whose memory does not (60 + 20 GiB is more
    // than the 72 a shared GPU may hold) takes its place too.
    let service = Job {
        gpu_memory_mib: 20 * GIB,
        ..job("svc", "svc", 1, 200, 1)
    };
    let memory = pass(&cluster, &tree, &running, std::slice::from_ref(&service), 1);
    assert_eq!(preempted(&memory), ["be"], "{memory:#?}");
    assert_eq!(placed(&memory), ["svc"]);
    // One that fits beside it leaves it be.
    let small = Job {
        gpu_memory_mib: 10 * GIB,
        ..service.clone()
    };
    let beside = pass(&cluster, &tree, &running, &[small], 1);
    assert!(preempted(&beside).is_empty(), "{beside:#?}");
    assert_eq!(placed(&beside), ["svc"]);
    // Best-effort work never takes another's place, nor a job's that is not best-effort.
    let other = pass(
        &cluster,
        &tree,
        &running,
        &[best_effort("be2", "svc", 20, 1)],
        1,
    );
    assert!(
        preempted(&other).is_empty() && placed(&other).is_empty(),
        "{other:#?}"
    );
    // With the GPU free and both waiting (the best-effort one older, its tenant first in
    // fair order), the other job gets it: best-effort work is decided last, so that a job
    // it gave way to does not find it back in its place in the next pass.
    let both = pass(
        &cluster,
        &tree,
        &[],
        &[
            best_effort("be", "batch", 60, 0),
            job("train", "svc", 1, 1000, 1),
        ],
        1,
    );
    assert_eq!(placed(&both), ["train"], "{both:#?}");
    assert!(preempted(&both).is_empty());
    let not_be = Running {
        job: Job {
            best_effort: false,
            ..be.job.clone()
        },
        ..be
    };
    // Negative control: the same holder not best-effort, borrowed by a tenant without a
    // guarantee either, keeps its place.
    let kept = pass(
        &cluster,
        &tree,
        &[not_be],
        &[job("train", "svc", 1, 1000, 1)],
        1,
    );
    assert!(
        preempted(&kept).is_empty() && placed(&kept).is_empty(),
        "{kept:#?}"
    );
}

#[test]
fn best_effort_work_stacked_on_one_gpu_moves_to_room_that_appeared() {
    // Two GPUs: GPU 0 runs two best-effort jobs (GPU 1 was full when they were placed);
    // GPU 1's job shrank to 0.4 since.
    let cluster = cluster(&[(2, 64, 256)]);
    let tree = QuotaTree::new(vec![
        queue("svc", None, 0, None),
        queue("batch", None, 0, None),
    ])
    .expect("tree");
    let on = |j: Job, g: u8, started_at| Running {
        job: j,
        placements: vec![Choice {
            node: 0,
            gpus: vec![g],
        }],
        started_at,
    };
    let service = on(job("svc", "svc", 1, 400, 0), 1, 0);
    let mut running = vec![
        service.clone(),
        on(best_effort("old", "batch", 4, 1), 0, 0),
        on(best_effort("new", "batch", 4, 2), 0, 30),
    ];
    // Not before it ran the minimum time.
    assert!(pass(&cluster, &tree, &running, &[], 50).is_empty());
    let d = pass(&cluster, &tree, &running, &[], 100);
    assert_eq!(preempted(&d), ["new"], "{d:#?}");
    let Some(Decision::Preempt { reason, .. }) = d.first() else {
        panic!("{d:#?}")
    };
    assert!(
        reason.starts_with("best-effort: moved to a GPU"),
        "{reason}"
    );
    // Requeued, it goes to the GPU that had none; then nothing moves.
    let mut pending = Vec::new();
    apply(&d, &mut running, &mut pending, 100);
    let again = pass(&cluster, &tree, &running, &pending, 101);
    assert_eq!(gpus_of(&again, "new")[0].gpus, [1], "{again:#?}");
    apply(&again, &mut running, &mut pending, 101);
    assert!(pass(&cluster, &tree, &running, &pending, 500).is_empty());
    // Negative control: with GPU 1 full (no room for even the least share), both stay.
    let full = vec![
        on(job("svc", "svc", 1, 1000, 0), 1, 0),
        on(best_effort("old", "batch", 4, 1), 0, 0),
        on(best_effort("new", "batch", 4, 2), 0, 30),
    ];
    assert!(pass(&cluster, &tree, &full, &[], 500).is_empty());
}
