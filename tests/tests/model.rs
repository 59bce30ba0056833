//! A model-based test of what Allot reports. Random sequences of submits (whole GPUs,
//! fractions with GPU memory, MIG slices, gangs, time limits), cancels, quota changes (raise,
//! lower, lift, several in quick succession), node loss and return, agent restarts, drains
//! and waits run against a real control plane with real agent processes; after every step
//! the test reads what the API reports — each tenant's held GPUs and its jobs waiting and
//! running (its teams' included, and its own apart), each node's held, free and
//! unavailable GPUs, the cluster's totals — and compares them with a reference computed
//! from the job list alone. At every observed instant no tenant holds more than the
//! strictest hard limit in force throughout the correction time before it.
//!
//! `ALLOT_MODEL_CASES=N` runs N sequences per database (default 3 on SQLite, 1 on
//! PostgreSQL); a failing sequence is shrunk and printed: add it to `regressions` below.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::process::Child;
use std::time::{Duration, Instant};

use allot_system_tests::{Backend, StatusCode, TestCluster, agent_process, spawn_cluster_with};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};

/// GPU parts, as the model counts: 7,000 to a GPU, so a MIG slice (1/7) and a thousandth
/// (7) are exact.
const GPU: u64 = 7000;
/// What a limit may take to hold after it is lowered (a pass, the stop of what is shed, the
/// report of its end).
const CORRECTION: Duration = Duration::from_secs(4);
/// The tenants and their parents: `org` has the teams `org-a` and `org-b`; `solo` stands
/// alone.
const TREE: [(&str, Option<&str>); 4] = [
    ("org", None),
    ("org-a", Some("org")),
    ("org-b", Some("org")),
    ("solo", None),
];
const TENANTS: [&str; 4] = [TREE[0].0, TREE[1].0, TREE[2].0, TREE[3].0];

/// `name` and the tenants below it (the tree is two deep).
fn subtree(name: &str) -> Vec<&'static str> {
    TREE.iter()
        .filter(|(n, p)| *n == name || *p == Some(name))
        .map(|(n, _)| *n)
        .collect()
}
/// The nodes: two of whole GPUs, one in MIG mode.
const NODES: [(&str, &str); 3] = [("n1", "2xH200"), ("n2", "2xH200"), ("m1", "1xH200:mig")];

#[derive(Debug, Clone)]
enum Shape {
    Whole(u32),
    /// Thousandths of one GPU and GiB of its memory.
    Fraction(u32, u64),
    Mig,
    /// Replicas of one whole GPU each.
    Gang(u32),
}

#[derive(Debug, Clone)]
enum Op {
    Submit {
        tenant: usize,
        shape: Shape,
        /// Seconds, when the job has a time limit.
        limit: Option<u64>,
    },
    /// One of the jobs submitted so far (modulo their number).
    Cancel(usize),
    /// A hard GPU limit (None: lifted), set again `again_ms` later to `then` (a quick
    /// succession of changes, as people make them).
    SetLimit {
        tenant: usize,
        max_gpus: Option<u32>,
        then: Option<Option<u32>>,
        again_ms: u64,
    },
    /// SIGKILL a node's agent; it stays down (its lease lapses and its jobs go back).
    KillNode(usize),
    /// Start a node's agent again if it is down.
    StartNode(usize),
    /// SIGKILL a node's agent and start it again at once.
    RestartAgent(usize),
    /// Drain (and later return) one GPU of a whole-GPU node.
    Drain {
        node: usize,
        gpu: usize,
    },
    Return {
        node: usize,
        gpu: usize,
    },
    /// Let time pass: time limits expire, preemptions and requeues settle.
    Wait(u64),
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        (1u32..=2).prop_map(Shape::Whole),
        (prop_oneof![Just(250u32), Just(500)], 1u64..=20).prop_map(|(m, g)| Shape::Fraction(m, g)),
        Just(Shape::Mig),
        (2u32..=3).prop_map(Shape::Gang),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let limit = prop_oneof![Just(None), (0u32..=4).prop_map(Some)];
    prop_oneof![
        6 => (0..TENANTS.len(), shape(), prop_oneof![3 => Just(None), 1 => (1u64..=3).prop_map(Some)])
            .prop_map(|(tenant, shape, limit)| Op::Submit { tenant, shape, limit }),
        2 => any::<usize>().prop_map(Op::Cancel),
        3 => (0..TENANTS.len(), limit.clone(), prop_oneof![Just(None), limit.prop_map(Some)], 0u64..=300)
            .prop_map(|(tenant, max_gpus, then, again_ms)| Op::SetLimit { tenant, max_gpus, then, again_ms }),
        1 => (0..NODES.len()).prop_map(Op::KillNode),
        1 => (0..NODES.len()).prop_map(Op::StartNode),
        1 => (0..NODES.len()).prop_map(Op::RestartAgent),
        1 => (0usize..2, 0usize..2).prop_map(|(node, gpu)| Op::Drain { node, gpu }),
        1 => (0usize..2, 0usize..2).prop_map(|(node, gpu)| Op::Return { node, gpu }),
        2 => (300u64..=2500).prop_map(Op::Wait),
    ]
}

/// A node's agent process and its id once registered.
struct Agent {
    name: &'static str,
    gpus: &'static str,
    child: Option<Child>,
}

impl Agent {
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the test did that the model needs: when each tenant's limits took effect.
struct Run {
    c: TestCluster,
    agents: Vec<Agent>,
    jobs: Vec<String>,
    /// Per tenant, each hard GPU limit (parts; None: none) and when it was set.
    limits: HashMap<&'static str, Vec<(Instant, Option<u64>)>>,
    observations: u32,
}

impl Run {
    async fn start(backend: Backend) -> Run {
        let c = spawn_cluster_with(backend, 0, "", |cfg| {
            cfg.lease = Duration::from_secs(2);
            cfg.heartbeat_interval = Duration::from_millis(300);
        })
        .await;
        for (name, parent) in TREE {
            c.create_tenant_in(name, parent, json!({})).await;
        }
        let mut agents = Vec::new();
        for (name, gpus) in NODES {
            let token = allot_system_tests::bootstrap_token(&c.server).await;
            agents.push(Agent {
                name,
                gpus,
                child: Some(agent_process(&c, name, gpus, Some(&token))),
            });
        }
        // Three agent processes start and register; on a loaded 2-core machine that can
        // take longer than the usual patience.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (_, nodes) = c.get("/api/v1/nodes").await;
            let ready = nodes
                .as_array()
                .map_or(0, |a| a.iter().filter(|n| n["status"] == "ready").count());
            if ready == NODES.len() {
                break;
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = NODES
                    .iter()
                    .map(|(name, _)| {
                        let log = c.data_dir.path().join(format!("{name}.log"));
                        let text = std::fs::read_to_string(&log).unwrap_or_default();
                        let tail: Vec<&str> = text.lines().rev().take(30).collect();
                        format!(
                            "--- {name}.log (last 30 lines, newest first)\n{}",
                            tail.join("\n")
                        )
                    })
                    .collect();
                panic!(
                    "the nodes did not get ready: {nodes:#}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let now = Instant::now();
        let limits = TENANTS.iter().map(|t| (*t, vec![(now, None)])).collect();
        Run {
            c,
            agents,
            jobs: Vec::new(),
            limits,
            observations: 0,
        }
    }

    async fn node_id(&self, name: &str) -> Option<String> {
        let (_, nodes) = self.c.get("/api/v1/nodes").await;
        nodes
            .as_array()?
            .iter()
            .find(|n| n["name"] == name)
            .and_then(|n| n["id"].as_str().map(str::to_owned))
    }

    async fn set_limit(&mut self, tenant: &'static str, max_gpus: Option<u32>) {
        let (s, body) = self
            .c
            .request(
                reqwest::Method::PATCH,
                &format!("/api/v1/tenants/{tenant}/quota"),
                Some(&self.c.admin_token),
                Some(json!({ "limit": { "gpu_milli": max_gpus.map(|g| g * 1000) } })),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        // In force from the answer on (the model does not credit the time before it).
        self.limits
            .entry(tenant)
            .or_default()
            .push((Instant::now(), max_gpus.map(|g| u64::from(g) * GPU)));
    }

    async fn apply(&mut self, op: &Op) {
        match op {
            Op::Submit {
                tenant,
                shape,
                limit,
            } => {
                let mut body = match shape {
                    Shape::Whole(n) => json!({ "gpus": n }),
                    Shape::Fraction(m, gib) => {
                        json!({ "gpus": 1, "gpu_milli": m, "gpu_memory_bytes": gib << 30 })
                    }
                    Shape::Mig => json!({ "mig_profile": "1g.18gb" }),
                    Shape::Gang(r) => json!({ "gpus": 1, "replicas": r }),
                };
                if let Some(l) = limit {
                    body["time_limit_secs"] = json!(l);
                }
                body["tenant"] = json!(TENANTS[*tenant]);
                body["command"] = json!(["sleep", "60"]);
                let (s, j) = self.c.post("/api/v1/jobs", body.clone()).await;
                // A request the fleet or quota could never give is refused at submit: fine,
                // and nothing to model.
                if s == StatusCode::UNPROCESSABLE_ENTITY {
                    return;
                }
                assert!(s.is_success(), "{body}: {s} {j}");
                self.jobs.push(j["id"].as_str().expect("id").to_owned());
            }
            Op::Cancel(pick) => {
                if self.jobs.is_empty() {
                    return;
                }
                let id = self.jobs[pick % self.jobs.len()].clone();
                let (s, j) = self
                    .c
                    .post(&format!("/api/v1/jobs/{id}/cancel"), Value::Null)
                    .await;
                // A job already ended is not cancelled again (409).
                assert!(s.is_success() || s == StatusCode::CONFLICT, "{s} {j}");
            }
            Op::SetLimit {
                tenant,
                max_gpus,
                then,
                again_ms,
            } => {
                self.set_limit(TENANTS[*tenant], *max_gpus).await;
                if let Some(next) = then {
                    tokio::time::sleep(Duration::from_millis(*again_ms)).await;
                    self.set_limit(TENANTS[*tenant], *next).await;
                }
            }
            Op::KillNode(n) => self.agents[*n].kill(),
            Op::StartNode(n) => {
                if self.agents[*n].child.is_none() {
                    let (name, gpus) = (self.agents[*n].name, self.agents[*n].gpus);
                    self.agents[*n].child = Some(agent_process(&self.c, name, gpus, None));
                }
            }
            Op::RestartAgent(n) => {
                self.agents[*n].kill();
                let (name, gpus) = (self.agents[*n].name, self.agents[*n].gpus);
                self.agents[*n].child = Some(agent_process(&self.c, name, gpus, None));
            }
            Op::Drain { node, gpu } | Op::Return { node, gpu } => {
                let verb = if matches!(op, Op::Drain { .. }) {
                    "drain"
                } else {
                    "return"
                };
                let Some(id) = self.node_id(NODES[*node].0).await else {
                    return;
                };
                let (_, n) = self.c.get(&format!("/api/v1/nodes/{id}")).await;
                let Some(uuid) = n["gpus"][*gpu]["uuid"].as_str() else {
                    return;
                };
                let (s, body) = self
                    .c
                    .post(
                        &format!("/api/v1/nodes/{id}/gpus/{uuid}/{verb}"),
                        Value::Null,
                    )
                    .await;
                assert!(s.is_success(), "{verb}: {s} {body}");
            }
            Op::Wait(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        }
    }

    /// The bound on a tenant's held parts at `at`: the loosest limit in force at any time
    /// in the correction window before it (a limit lowered within it may not hold yet).
    fn bound(&self, tenant: &str, at: Instant) -> Option<u64> {
        let set = &self.limits[tenant];
        let from = at.checked_sub(CORRECTION).unwrap_or(at);
        // The limit in force at `from`, and every one set after it.
        let in_force_at_from = set.iter().rev().find(|(t, _)| *t <= from).map(|(_, l)| *l);
        let after = set
            .iter()
            .filter(|(t, _)| *t > from && *t <= at)
            .map(|(_, l)| *l);
        let mut bound = Some(0);
        for l in in_force_at_from.into_iter().chain(after) {
            bound = match (bound, l) {
                (None, _) | (_, None) => None,
                (Some(a), Some(b)) => Some(a.max(b)),
            };
        }
        bound
    }

    /// Reads the API until two job lists around the tenants and nodes agree, and checks
    /// every figure against the model.
    async fn observe(&mut self, step: &str) -> Result<(), TestCaseError> {
        let mut tries = 0;
        let (jobs, tenants, nodes, at) = loop {
            let before = job_list(&self.c).await;
            let at = Instant::now();
            let (_, tenants) = self.c.get("/api/v1/tenants").await;
            let (_, nodes) = self.c.get("/api/v1/nodes").await;
            let after = job_list(&self.c).await;
            if key(&before) == key(&after) {
                break (after, tenants, nodes, at);
            }
            tries += 1;
            prop_assert!(tries < 40, "the job list never held still ({step})");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        self.observations += 1;
        let model = Model::of(&jobs);
        let shown = |v: &Value| (v.as_f64().unwrap_or(-1.0) * GPU as f64).round() as u64;
        for t in tenants.as_array().into_iter().flatten() {
            let name = t["name"].as_str().unwrap_or_default();
            if !TENANTS.contains(&name) {
                continue;
            }
            let below = subtree(name);
            let sum = |f: &dyn Fn(&Figures) -> u64| {
                below
                    .iter()
                    .map(|n| model.tenants.get(*n).map_or(0, f))
                    .sum::<u64>()
            };
            let own = model.tenants.get(name).copied().unwrap_or_default();
            let context = || format!("{step}: tenant {name}: {t:#}\nmodel: {model:#?}");
            prop_assert_eq!(
                shown(&t["usage"]["gpus"]),
                sum(&|f| f.held),
                "{}",
                context()
            );
            prop_assert_eq!(shown(&t["own"]["usage"]["gpus"]), own.held, "{}", context());
            prop_assert_eq!(
                t["jobs_pending"].as_u64(),
                Some(sum(&|f| f.pending)),
                "{}",
                context()
            );
            prop_assert_eq!(
                t["jobs_running"].as_u64(),
                Some(sum(&|f| f.running)),
                "{}",
                context()
            );
            prop_assert_eq!(
                t["own"]["jobs_pending"].as_u64(),
                Some(own.pending),
                "{}",
                context()
            );
            // The hard limit, at this instant.
            if let Some(bound) = self.bound(name, at) {
                prop_assert!(
                    sum(&|f| f.held) <= bound,
                    "{step}: tenant {name} holds {} parts, above the limit {bound} in force \
                     for {CORRECTION:?}\n{}",
                    sum(&|f| f.held),
                    context()
                );
            }
        }
        let mut cluster_held = 0;
        for n in nodes.as_array().into_iter().flatten() {
            let id = n["id"].as_str().unwrap_or_default();
            let name = n["name"].as_str().unwrap_or_default();
            let count = n["gpus"].as_array().map_or(0, Vec::len) as u64;
            let held = shown(&n["gpus_held"]);
            let context = || format!("{step}: node {name}: {n:#}\nmodel: {model:#?}");
            prop_assert_eq!(
                held,
                model.nodes.get(id).copied().unwrap_or(0),
                "{}",
                context()
            );
            prop_assert_eq!(
                held + shown(&n["gpus_free"]) + shown(&n["gpus_unavailable"]),
                count * GPU,
                "held, free and unavailable add up: {}",
                context()
            );
            cluster_held += held;
        }
        // Every tenant is below exactly one root: what they hold in all.
        let roots: u64 = model.tenants.values().map(|f| f.held).sum();
        prop_assert_eq!(
            cluster_held,
            roots,
            "{}: the nodes' held is the tenants'",
            step
        );
        Ok(())
    }
}

/// Every job (gangs once, with their replicas), all pages.
async fn job_list(c: &TestCluster) -> Vec<Value> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let path = if token.is_empty() {
            "/api/v1/jobs?limit=500".to_owned()
        } else {
            format!("/api/v1/jobs?limit=500&page_token={token}")
        };
        let (s, page) = c.get(&path).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        out.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_page_token"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_owned(),
            _ => return out,
        }
    }
}

/// What of a job list decides the figures.
fn key(jobs: &[Value]) -> Vec<String> {
    jobs.iter()
        .map(|j| format!("{} {} {} {}", j["id"], j["state"], j["node_id"], j["gang"]))
        .collect()
}

#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    held: u64,
    pending: u64,
    running: u64,
}

/// The reference: figures from the job list alone, by the documented definitions — a
/// whole GPU is all of it, a share its thousandths, a MIG instance its compute slices of
/// seven; each replica of a gang holds its own; a gang counts once, by its record.
#[derive(Debug, Default)]
struct Model {
    tenants: BTreeMap<String, Figures>,
    nodes: BTreeMap<String, u64>,
}

impl Model {
    fn of(jobs: &[Value]) -> Model {
        let mut m = Model::default();
        for j in jobs {
            let tenant = j["tenant"].as_str().unwrap_or_default().to_owned();
            let each = if let Some(p) = j["mig_profile"].as_str() {
                let slices: u64 = p
                    .split('g')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                slices * GPU / 7
            } else {
                let gpus = j["gpus"].as_u64().unwrap_or(0);
                let milli = j["held_gpu_milli"]
                    .as_u64()
                    .or(j["gpu_milli"].as_u64())
                    .unwrap_or(1000)
                    .min(1000);
                gpus * milli * GPU / 1000
            };
            let replicas: Vec<(String, Option<String>)> = match j["gang"].as_array() {
                Some(rs) => rs
                    .iter()
                    .map(|r| {
                        (
                            r["state"].as_str().unwrap_or_default().to_owned(),
                            r["node_id"].as_str().map(str::to_owned),
                        )
                    })
                    .collect(),
                None => vec![(
                    j["state"].as_str().unwrap_or_default().to_owned(),
                    j["node_id"].as_str().map(str::to_owned),
                )],
            };
            let f = m.tenants.entry(tenant).or_default();
            for (state, node) in &replicas {
                if matches!(state.as_str(), "scheduled" | "running") {
                    f.held += each;
                    if let Some(n) = node {
                        *m.nodes.entry(n.clone()).or_default() += each;
                    }
                }
            }
            match j["state"].as_str() {
                Some("pending") => f.pending += 1,
                Some("scheduled" | "running") => f.running += 1,
                _ => {}
            }
        }
        m
    }
}

async fn run_case(backend: Backend, ops: Vec<Op>) -> Result<u32, TestCaseError> {
    let mut run = Run::start(backend).await;
    run.observe("start").await?;
    let mut outcome = Ok(());
    for (i, op) in ops.iter().enumerate() {
        run.apply(op).await;
        // Two scheduling passes and a heartbeat: what the step changes is reported.
        tokio::time::sleep(Duration::from_millis(700)).await;
        if let Err(e) = run.observe(&format!("after step {i} ({op:?})")).await {
            outcome = Err(e);
            break;
        }
    }
    let observations = run.observations;
    let Run { c, agents, .. } = run;
    drop(agents);
    c.shutdown().await;
    outcome.map(|()| observations)
}

fn cases(default: u32) -> u32 {
    std::env::var("ALLOT_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn check(backend: Backend, cases: u32) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let (ran, steps, observed) = (Cell::new(0u32), Cell::new(0usize), Cell::new(0u32));
    let result = runner.run(&proptest::collection::vec(op(), 6..14), |ops| {
        let n = ops.len();
        let seen = rt.block_on(run_case(backend, ops))?;
        ran.set(ran.get() + 1);
        steps.set(steps.get() + n);
        observed.set(observed.get() + seen);
        Ok(())
    });
    eprintln!(
        "model test on {backend:?}: {} sequences run (shrinking included), {} steps, {} \
         observations checked",
        ran.get(),
        steps.get(),
        observed.get()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn what_allot_reports_matches_the_job_list_on_sqlite() {
    check(Backend::Sqlite, cases(3));
}

#[test]
fn what_allot_reports_matches_the_job_list_on_postgres() {
    check(Backend::Postgres, cases(1));
}
