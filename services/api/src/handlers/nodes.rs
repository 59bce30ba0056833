use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_domain::JobState;
use allot_store::{JobFilter, JobRepo, NodeAdmin, NodeRepo, TenantScope};

use crate::auth::Principal;
use crate::extract::{Json, Query};
use crate::problem::Problem;
use crate::views::{NodeLabels, NodeView};
use crate::{ApiError, AppState, json};
use allot_authz::{Action, Resource};

/// List nodes and their GPUs.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", security(("bearer" = [])),
    responses((status = 200, body = Vec<NodeView>), (status = 401, body = Problem)))]
pub async fn list(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::NodeRead, Resource::Platform, "the node inventory")?;
    let now = state.store.clock().now();
    let telemetry = who.allows(Action::TelemetryRead, Resource::Platform)?;
    let holding = if telemetry {
        holding(&state, None).await?
    } else {
        Vec::new()
    };
    let nodes: Vec<NodeView> = state
        .store
        .list_nodes()
        .await?
        .into_iter()
        .map(|n| {
            if telemetry {
                NodeView::with_holding(n, now, &holding)
            } else {
                NodeView::new(n, now)
            }
        })
        .collect();
    Ok(json(StatusCode::OK, &nodes))
}

/// Get one node and its GPUs, by id or name.
#[utoipa::path(get, path = "/api/v1/nodes/{id}", tag = "nodes", security(("bearer" = [])),
    params(("id" = String, Path, description = "node id or name")),
    responses((status = 200, body = NodeView), (status = 404, body = Problem)))]
pub async fn get(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::NodeRead, Resource::Node(&id), "the node inventory")?;
    let node = find(&state, &id).await?;
    Ok(json(StatusCode::OK, &view(&state, &who, node).await?))
}

/// The jobs that hold part of a GPU (scheduled or running), on `node` or on every node.
async fn holding(state: &AppState, node: Option<&str>) -> Result<Vec<allot_domain::Job>, ApiError> {
    Ok(state
        .store
        .list_jobs(JobFilter {
            node_id: node.map(str::to_owned),
            states: vec![JobState::Scheduled, JobState::Running],
            ..JobFilter::new(TenantScope::All)
        })
        .await?
        .jobs)
}

/// `node` as the API shows it to `who`: with what is held of each GPU when they may read
/// cluster-wide telemetry (every tenant's jobs on it).
pub(crate) async fn view(
    state: &AppState,
    who: &Principal,
    node: allot_domain::Node,
) -> Result<NodeView, ApiError> {
    let now = state.store.clock().now();
    if !who.allows(Action::TelemetryRead, Resource::Platform)? {
        return Ok(NodeView::new(node, now));
    }
    let holding = holding(state, Some(&node.id)).await?;
    Ok(NodeView::with_holding(node, now, &holding))
}

/// The node named by `key`: its id, or its name.
pub(crate) async fn find(state: &AppState, key: &str) -> Result<allot_domain::Node, ApiError> {
    match state.store.node(key).await {
        Ok(n) => Ok(n),
        Err(allot_store::StoreError::NotFound(_)) => state
            .store
            .list_nodes()
            .await?
            .into_iter()
            .find(|n| n.name == key)
            .ok_or_else(|| ApiError::NotFound(format!("node `{key}` does not exist"))),
        Err(e) => Err(e.into()),
    }
}

/// Stops the jobs on `node` (on `gpu` only, when given) so that they are requeued
/// elsewhere, as a preemption that counts against nothing.
async fn move_jobs_off(
    state: &AppState,
    who: &Principal,
    node: &allot_domain::Node,
    gpu: Option<&str>,
) -> Result<(), ApiError> {
    let held = state
        .store
        .list_jobs(JobFilter {
            node_id: Some(node.id.clone()),
            states: vec![JobState::Scheduled, JobState::Running],
            ..JobFilter::new(TenantScope::All)
        })
        .await?;
    let why = match gpu {
        Some(g) => format!("GPU {g} of node {} drained by an operator", node.name),
        None => format!("node {} drained by an operator", node.name),
    };
    for job in held
        .jobs
        .into_iter()
        .filter(|j| gpu.is_none_or(|g| j.gpu_uuids.iter().any(|u| u == g)))
    {
        match state
            .store
            .request_preemption(&who.audit(), &job.id, &why)
            .await
        {
            Ok(job) => state.events.job_cancel_requested(&job),
            // Finishing, cancelled or already stopping: it leaves anyway.
            Err(allot_store::StoreError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn admin(
    state: &AppState,
    who: &Principal,
    key: &str,
    change: NodeAdmin,
) -> Result<HttpResponse, ApiError> {
    who.authorize(
        Action::NodeOperate,
        Resource::Node(key),
        &format!("node `{key}`"),
    )?;
    let node = find(state, key).await?;
    if let NodeAdmin::Label(changes) = &change {
        allot_domain::node::check_label_changes(&node.labels, changes)?;
    }
    let node = state
        .store
        .set_node_admin(&who.audit(), &node.id, change)
        .await?;
    // Capacity may have come back: decide again.
    state.events.job_submitted();
    Ok(json(StatusCode::OK, &view(state, who, node).await?))
}

/// Label a node (platform admins): a value sets a label, `null` removes it. Gangs may ask
/// to be packed within one value of a label (`pack`).
#[utoipa::path(patch, path = "/api/v1/nodes/{id}/labels", tag = "nodes",
    security(("bearer" = [])), params(("id" = String, Path, description = "node id or name")),
    request_body = NodeLabels,
    responses((status = 200, body = NodeView), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn label(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
    Json(body): Json<NodeLabels>,
) -> Result<HttpResponse, ApiError> {
    admin(&state, &who, &id, NodeAdmin::Label(body.labels)).await
}

/// Cordon a node (platform admins): it takes no new work; what runs there stays.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/cordon", tag = "nodes",
    security(("bearer" = [])), params(("id" = String, Path, description = "node id or name")),
    responses((status = 200, body = NodeView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn cordon(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    admin(&state, &who, &id, NodeAdmin::Cordon).await
}

/// Drain a node (platform admins): cordon it, saying why (`reason`), and move its jobs
/// elsewhere (each is stopped and requeued as its next attempt, without counting as a
/// failure): at once, or what still runs after `grace_secs`.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/drain", tag = "nodes",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "node id or name"), crate::views::DrainQuery),
    responses((status = 200, body = NodeView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub async fn drain(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
    Query(q): Query<crate::views::DrainQuery>,
) -> Result<HttpResponse, ApiError> {
    let reason = q.reason.unwrap_or_default();
    if reason.chars().count() > allot_domain::node::MAX_DRAIN_REASON_LEN
        || allot_domain::job::has_unsafe_chars(&reason)
    {
        return Err(ApiError::invalid(
            "reason",
            format!(
                "must be one line of at most {} characters, without control or text-direction characters",
                allot_domain::node::MAX_DRAIN_REASON_LEN
            ),
        ));
    }
    let grace = q.grace_secs.unwrap_or(0);
    if grace > allot_domain::node::MAX_DRAIN_GRACE_SECS {
        return Err(ApiError::invalid(
            "grace_secs",
            "must be at most a week (604800)",
        ));
    }
    let deadline = state.store.clock().now()
        + chrono::Duration::seconds(i64::try_from(grace).unwrap_or(i64::MAX));
    let res = admin(
        &state,
        &who,
        &id,
        NodeAdmin::Drain(allot_domain::node::Drain { reason, deadline }),
    )
    .await?;
    // Without a grace its jobs leave now; with one, the leader requeues what still runs
    // when it is over.
    if grace == 0 {
        let node = find(&state, &id).await?;
        move_jobs_off(&state, &who, &node, None).await?;
    }
    Ok(res)
}

/// Return a node to service (platform admins): undo a cordon or drain.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/uncordon", tag = "nodes",
    security(("bearer" = [])), params(("id" = String, Path, description = "node id or name")),
    responses((status = 200, body = NodeView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn uncordon(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    admin(&state, &who, &id, NodeAdmin::Uncordon).await
}

/// Drain one GPU (platform admins): no new work on it, and its jobs move elsewhere.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/gpus/{uuid}/drain", tag = "nodes",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "node id or name"), ("uuid" = String, Path)),
    responses((status = 200, body = NodeView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn drain_gpu(
    state: web::Data<AppState>,
    who: Principal,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (id, uuid) = path.into_inner();
    let res = admin(&state, &who, &id, NodeAdmin::DrainGpu(uuid.clone())).await?;
    let node = find(&state, &id).await?;
    move_jobs_off(&state, &who, &node, Some(&uuid)).await?;
    Ok(res)
}

/// Return a drained GPU to service (platform admins).
#[utoipa::path(post, path = "/api/v1/nodes/{id}/gpus/{uuid}/return", tag = "nodes",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "node id or name"), ("uuid" = String, Path)),
    responses((status = 200, body = NodeView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn return_gpu(
    state: web::Data<AppState>,
    who: Principal,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (id, uuid) = path.into_inner();
    admin(&state, &who, &id, NodeAdmin::ReturnGpu(uuid)).await
}

/// A GPU's utilization, memory in use, power and temperature over time, averaged per
/// 10-second bucket (the last day) or 5-minute bucket (the last 90 days). Cluster-wide
/// telemetry (`telemetry.read`, platform admins by default): a tenant sees its own jobs'
/// samples at `/api/v1/jobs/{id}/samples`.
#[utoipa::path(get, path = "/api/v1/nodes/{id}/gpus/{uuid}/samples", tag = "nodes",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "node id or name"), ("uuid" = String, Path),
        crate::views::SamplesQuery),
    responses((status = 200, body = Vec<crate::views::GpuSampleView>), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn samples(
    state: web::Data<AppState>,
    who: Principal,
    path: web::Path<(String, String)>,
    crate::extract::Query(q): crate::extract::Query<crate::views::SamplesQuery>,
) -> Result<HttpResponse, ApiError> {
    use allot_store::SampleRepo;
    let (id, uuid) = path.into_inner();
    who.authorize(Action::NodeRead, Resource::Node(&id), "the node inventory")?;
    // A GPU's samples show what every tenant on it does: cluster-wide telemetry.
    who.authorize(Action::TelemetryRead, Resource::Platform, "GPU telemetry")?;
    let (resolution, since) = q.window(state.store.clock().now())?;
    let node = find(&state, &id).await?;
    if !node.gpus.iter().any(|g| g.uuid == uuid) {
        return Err(ApiError::NotFound(format!(
            "GPU {uuid} on node {} does not exist",
            node.name
        )));
    }
    let points: Vec<crate::views::GpuSampleView> = state
        .store
        .gpu_samples(Some(&uuid), resolution, since)
        .await?
        .into_iter()
        .map(|p| crate::views::GpuSampleView {
            at: p.at,
            utilization: p.utilization,
            memory_used_bytes: p.memory_used_bytes,
            power_watts: p.power_watts,
            temperature_c: p.temperature_c,
            pcie_rx_bytes_per_s: p.pcie_rx_bytes_per_s,
            pcie_tx_bytes_per_s: p.pcie_tx_bytes_per_s,
            nvlink_rx_bytes_per_s: p.nvlink_rx_bytes_per_s,
            nvlink_tx_bytes_per_s: p.nvlink_tx_bytes_per_s,
            throttle_reasons: allot_domain::node::throttle_names(p.throttle_mask)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            ecc_corrected: p.ecc_corrected,
            ecc_uncorrected: p.ecc_uncorrected,
        })
        .collect();
    Ok(json(StatusCode::OK, &points))
}
