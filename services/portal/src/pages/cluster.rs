//! The cluster page (`/portal/cluster`): nodes, GPUs and MIG layouts, with the operator's actions.

use super::super::*;

pub(crate) struct SliceCell {
    start: u8,
    width: u8,
    label: String,
}

pub(crate) struct GpuRow {
    index: u32,
    uuid: String,
    model: String,
    memory: String,
    /// How the node holds jobs on it to their GPU memory (`shim`, `mig` or `check`).
    memory_enforcement: &'static str,
    health: String,
    jobs: usize,
    slices: Vec<SliceCell>,
    layout_label: String,
    /// The latest utilization, as a percentage, or `—`.
    util_now: String,
}

pub(crate) struct NodeRow {
    id: String,
    name: String,
    /// Its one state: `ready`, `cordoned` (ready, taking no new work) or `not-ready`; the
    /// label says it in words and the detail why.
    state: &'static str,
    state_label: String,
    state_detail: String,
    cordoned: bool,
    /// What cordoning and draining it would do, asked before either.
    cordon_confirm: String,
    drain_confirm: String,
    /// What runs its jobs: `oci` (confined containers) or `process` (unconfined).
    runtime: String,
    gpus: Vec<GpuRow>,
    /// Where its GPUs' use over the last 30 minutes is fetched from when its details are
    /// opened (empty without the telemetry right).
    chart: String,
}

/// What cordoning and draining node `name` would do to the jobs on it, in the words the
/// portal asks with.
pub(crate) fn node_confirmations(name: &str, on_node: &[&Job]) -> (String, String) {
    let names = |jobs: &[&Job]| {
        let mut shown: Vec<String> = jobs
            .iter()
            .take(5)
            .map(|j| format!("{} ({})", j.spec.name, j.spec.tenant))
            .collect();
        if jobs.len() > 5 {
            shown.push(format!("{} more", jobs.len() - 5));
        }
        shown.join(", ")
    };
    let cordon = match on_node.len() {
        0 => format!("Cordon {name}? It takes no new work until returned to service."),
        n => format!(
            "Cordon {name}? It takes no new work until returned to service; its {n} job{}              keep{} running: {}.",
            if n == 1 { "" } else { "s" },
            if n == 1 { "s" } else { "" },
            names(on_node)
        ),
    };
    let drain = match on_node.len() {
        0 => format!(
            "Drain {name}? Nothing runs there now; it takes no new work until returned to service."
        ),
        n => format!(
            "Drain {name}? Its {n} job{} {} stopped and requeued to run elsewhere (a new \
             attempt, not a failure): {}. It takes no new work until returned to service.",
            if n == 1 { "" } else { "s" },
            if n == 1 { "is" } else { "are" },
            names(on_node)
        ),
    };
    (cordon, drain)
}

#[derive(Template, WebTemplate)]
#[template(path = "cluster.html")]
pub(crate) struct ClusterPage {
    page: Page,
    summary: cluster::Summary,
    /// Whether each node's details are shown open.
    open: bool,
    /// The nodes whose details this page shows, of `matching`.
    nodes: Vec<NodeRow>,
    matching: usize,
    state: String,
    name: String,
    page_no: usize,
    pages: usize,
    previous: Option<String>,
    next: Option<String>,
    admin: bool,
    /// Whether the caller reads cluster-wide telemetry (`telemetry.read`): every GPU's
    /// utilization and every tenant's jobs on it. Others see their own tenants' jobs only.
    telemetry: bool,
}

/// Node details shown on one page of the cluster page.
pub(crate) const NODES_PER_PAGE: usize = 20;

/// Which nodes' details the cluster page shows (its summary is of them all).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterQuery {
    /// `ready`, `cordoned` or `not-ready`.
    state: Option<String>,
    /// A part of the name.
    name: Option<String>,
    /// From 1.
    page: Option<usize>,
}

pub(crate) async fn cluster_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
    q: web::Query<ClusterQuery>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Ok(to_sign_in());
    };
    who.authorize(Action::NodeRead, Resource::Platform, "the node inventory")?;
    let telemetry = who.allows(Action::TelemetryRead, Resource::Platform)?;
    let now = state.store.clock().now();
    let scope = if telemetry {
        TenantScope::All
    } else {
        TenantScope::Tenants(who.permitted_tenants(Action::JobList)?)
    };
    let holding = state
        .store
        .list_jobs(JobFilter {
            states: vec![JobState::Scheduled, JobState::Running],
            ..JobFilter::new(scope)
        })
        .await?
        .jobs;
    // The page says how busy each GPU is now (the last minute's samples); each node's
    // chart of the last 30 minutes is fetched when its details are opened (`node_chart`),
    // so a fleet's page does not carry every node's.
    let since = now - Duration::minutes(1);
    let mut history: std::collections::HashMap<String, Vec<(chrono::DateTime<chrono::Utc>, f64)>> =
        std::collections::HashMap::new();
    let samples = if telemetry {
        state.store.gpu_samples(None, 10, since).await?
    } else {
        Vec::new()
    };
    for p in samples {
        history
            .entry(p.gpu_uuid)
            .or_default()
            .push((p.at, p.utilization * 100.0));
    }
    let fleet: Vec<(allot_domain::Node, allot_domain::NodeStatus)> = state
        .store
        .list_nodes()
        .await?
        .into_iter()
        .map(|n| {
            let status = n.status(now);
            (n, status)
        })
        .collect();
    let summary = cluster::summary(&fleet, &holding);
    let want_state = q.state.as_deref().unwrap_or("").trim();
    if !want_state.is_empty() && !cluster::NODE_STATES.contains(&want_state) {
        return Err(ApiError::malformed(
            "state",
            format!(
                "`{want_state}` is not one of {}",
                cluster::NODE_STATES.join(", ")
            ),
        ));
    }
    let want_name = q.name.as_deref().unwrap_or("").trim().to_lowercase();
    let chosen: Vec<(allot_domain::Node, allot_domain::NodeStatus)> = fleet
        .into_iter()
        .filter(|(n, status)| {
            (want_state.is_empty() || cluster::node_state(n, *status, &holding) == want_state)
                && n.name.to_lowercase().contains(&want_name)
        })
        .collect();
    let matching = chosen.len();
    let pages = matching.div_ceil(NODES_PER_PAGE).max(1);
    let page_no = q.page.unwrap_or(1).clamp(1, pages);
    let nodes = chosen
        .into_iter()
        .skip((page_no - 1) * NODES_PER_PAGE)
        .take(NODES_PER_PAGE)
        .map(|(n, status)| {
            let board = |g: &allot_domain::GpuDevice| {
                allot_domain::mig::geometry(&g.model, Some(g.memory_bytes >> 20))
            };
            let gpus = n
                .gpus
                .iter()
                .map(|g| {
                    let slices: Vec<SliceCell> = g
                        .mig
                        .iter()
                        .flatten()
                        .map(|s| {
                            let p = board(g).and_then(|b| b.profile(s.profile));
                            SliceCell {
                                start: s.start,
                                width: p.map_or(1, |p| p.memory_slices),
                                label: p.map_or_else(
                                    || format!("profile {}", s.profile),
                                    |p| p.name.to_owned(),
                                ),
                            }
                        })
                        .collect();
                    let on_gpu = |j: &&Job| j.gpu_uuids.iter().any(|u| g.holds(u));
                    GpuRow {
                        util_now: history
                            .get(&g.uuid)
                            .and_then(|h| h.last())
                            .map_or("—".into(), |(_, u)| format!("{u:.0}%")),
                        index: g.index,
                        uuid: g.uuid.clone(),
                        model: g.model.clone(),
                        memory: format_bytes(g.memory_bytes),
                        memory_enforcement: g.memory_enforcement.as_str(),
                        health: g.health(n.drained_gpus.contains(&g.uuid)).to_owned(),
                        jobs: holding.iter().filter(on_gpu).count(),
                        layout_label: format!(
                            "MIG instances: {}",
                            slices
                                .iter()
                                .map(|s| s.label.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        slices,
                    }
                })
                .collect();
            let state = cluster::node_state(&n, status, &holding);
            let drain_detail = n.drain.as_ref().map(|d| {
                let why = if d.reason.is_empty() {
                    "no reason given".to_owned()
                } else {
                    d.reason.clone()
                };
                format!(
                    "{why}; what still runs there is requeued elsewhere from {}",
                    d.deadline.format("%Y-%m-%d %H:%M:%S UTC")
                )
            });
            let (state_label, state_detail) = match state {
                "ready" => ("ready".to_owned(), "takes new work".to_owned()),
                "draining" => ("draining".to_owned(), drain_detail.unwrap_or_default()),
                "drained" => ("drained".to_owned(), drain_detail.unwrap_or_default()),
                "cordoned" => (
                    "cordoned".to_owned(),
                    "ready, and takes no new work until returned to service".to_owned(),
                ),
                _ => (
                    if n.cordoned {
                        "not ready (cordoned)".to_owned()
                    } else {
                        "not ready".to_owned()
                    },
                    "its lease lapsed: the agent is gone or cut off".to_owned(),
                ),
            };
            let on_node: Vec<&Job> = holding
                .iter()
                .filter(|j| j.node_id.as_deref() == Some(n.id.as_str()))
                .collect();
            let (cordon_confirm, drain_confirm) = node_confirmations(&n.name, &on_node);
            let chart = if telemetry {
                format!("/portal/cluster/nodes/{}/chart", n.id)
            } else {
                String::new()
            };
            NodeRow {
                chart,
                id: n.id,
                name: n.name,
                state,
                state_label,
                state_detail,
                cordon_confirm,
                drain_confirm,
                cordoned: n.cordoned,
                runtime: if n.runtime.is_empty() {
                    "unknown".to_owned()
                } else {
                    n.runtime.clone()
                },
                gpus,
            }
        })
        .collect();
    let admin = who
        .authorize(Action::NodeOperate, Resource::Platform, "nodes")
        .is_ok();
    let link = |page: usize| {
        page_link(
            "/portal/cluster",
            &[
                ("state", want_state),
                ("name", q.name.as_deref().unwrap_or("")),
                ("page", &page.to_string()),
            ],
        )
    };
    Ok(render(ClusterPage {
        page: Page::new(&req, &state, &who, "Cluster", "cluster").await,
        // A few nodes are shown whole; many are listed, each opened on demand.
        open: summary.heat.len() <= 4,
        summary,
        nodes,
        matching,
        state: want_state.to_owned(),
        name: q.name.clone().unwrap_or_default(),
        previous: (page_no > 1).then(|| link(page_no - 1)),
        next: (page_no < pages).then(|| link(page_no + 1)),
        page_no,
        pages,
        admin,
        telemetry,
    }))
}

/// One node's chart: how busy each of its GPUs was over the last 30 minutes (markup), for
/// the cluster page to show when the node's details are opened. Telemetry readers only.
pub(crate) async fn node_chart(
    _req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Err(ApiError::Unauthenticated("sign in first".into()));
    };
    who.authorize(Action::TelemetryRead, Resource::Platform, "GPU telemetry")?;
    let node = state.store.node(&id).await?;
    let now = state.store.clock().now();
    let since = now - Duration::minutes(30);
    let mut series = Vec::new();
    for g in &node.gpus {
        let points = state
            .store
            .gpu_samples(Some(&g.uuid), 10, since)
            .await?
            .into_iter()
            .map(|p| (p.at, p.utilization * 100.0))
            .collect();
        series.push(charts::Series {
            name: format!("GPU {}", g.index),
            points,
            steps: false,
            dashed: false,
        });
    }
    let html = charts::time_series(
        format!("How busy each GPU of {} was, last 30 minutes", node.name),
        "busy (%)",
        &series,
        (since, now),
        Some(100.0),
        "%",
    )
    .html();
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(html))
}
