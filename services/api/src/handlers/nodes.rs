use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_store::NodeRepo;

use crate::auth::Principal;
use crate::problem::Problem;
use crate::views::NodeView;
use crate::{ApiError, AppState, json};

/// List nodes and their GPUs.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", security(("bearer" = [])),
    responses((status = 200, body = Vec<NodeView>), (status = 401, body = Problem)))]
pub async fn list(state: web::Data<AppState>, _who: Principal) -> Result<HttpResponse, ApiError> {
    let now = state.store.clock().now();
    let nodes: Vec<NodeView> = state
        .store
        .list_nodes()
        .await?
        .into_iter()
        .map(|n| NodeView::new(n, now))
        .collect();
    Ok(json(StatusCode::OK, &nodes))
}

/// Get one node and its GPUs.
#[utoipa::path(get, path = "/api/v1/nodes/{id}", tag = "nodes", security(("bearer" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = NodeView), (status = 404, body = Problem)))]
pub async fn get(
    state: web::Data<AppState>,
    _who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let node = state.store.node(&id).await?;
    Ok(json(
        StatusCode::OK,
        &NodeView::new(node, state.store.clock().now()),
    ))
}
