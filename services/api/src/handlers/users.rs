use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_store::IdentityRepo;

use crate::auth::Principal;
use crate::problem::Problem;
use crate::views::UserView;
use crate::{ApiError, AppState, json};

/// List the people who have signed in (platform admins).
#[utoipa::path(get, path = "/api/v1/users", tag = "access", security(("bearer" = [])),
    responses((status = 200, body = Vec<UserView>), (status = 403, body = Problem)))]
pub async fn list(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::UserList, Resource::Platform, "the user directory")?;
    let users: Vec<UserView> = state
        .store
        .list_users()
        .await?
        .into_iter()
        .map(UserView::from)
        .collect();
    Ok(json(StatusCode::OK, &users))
}

/// Get a user (platform admins).
#[utoipa::path(get, path = "/api/v1/users/{id}", tag = "access", params(("id" = String, Path)),
    security(("bearer" = [])),
    responses((status = 200, body = UserView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn get(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::UserRead, Resource::Platform, "the user directory")?;
    Ok(json(
        StatusCode::OK,
        &UserView::from(state.store.user(&id).await?),
    ))
}

/// Delete a user (platform admins): their tokens stop working at once, however valid the
/// provider says they are, and every binding granted to them is revoked. Deleting twice is
/// harmless.
#[utoipa::path(delete, path = "/api/v1/users/{id}", tag = "access",
    params(("id" = String, Path)), security(("bearer" = [])),
    responses((status = 200, body = UserView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn delete(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::UserDelete, Resource::Platform, "the user directory")?;
    let user = state.store.delete_user(&who.audit(), &id).await?;
    Ok(json(StatusCode::OK, &UserView::from(user)))
}
