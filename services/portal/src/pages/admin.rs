//! The admin page (`/portal/admin`): tenants, tokens and role bindings.

use super::super::*;
use allot_store::TokenRepo;

pub(crate) struct TenantRow {
    name: String,
    parent: Option<String>,
    guaranteed: String,
    limit: String,
    /// The GPU limit as the quota form starts from it: empty when there is none.
    limit_value: String,
    /// The monthly GPU-hour budget as the form starts from it: empty when there is none.
    budget: String,
    weight: u32,
    min_isolation: String,
}

pub(crate) struct TokenRow {
    id: String,
    name: String,
    role: String,
    tenant: String,
    created: String,
    expires: String,
    last_used: String,
}

pub(crate) struct BindingRow {
    id: String,
    who: String,
    role: String,
    tenant: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "admin.html")]
pub(crate) struct AdminPage {
    page: Page,
    tenants: Vec<TenantRow>,
    bindings: Vec<BindingRow>,
    tokens: Vec<TokenRow>,
}

pub(crate) async fn admin_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Ok(to_sign_in());
    };
    who.authorize(
        Action::TenantCreate,
        Resource::Platform,
        "tenant administration",
    )?;
    let all = state.store.list_tenants().await?;
    let tenants = all
        .iter()
        .map(|t| TenantRow {
            name: t.name.to_string(),
            parent: t
                .parent_id
                .as_ref()
                .and_then(|p| all.iter().find(|x| &x.id == p))
                .map(|p| p.name.to_string()),
            guaranteed: format_milli(t.quota.guaranteed.gpu_milli),
            limit: t.quota.limit.gpu_milli.map_or("none".into(), format_milli),
            limit_value: t.quota.limit.gpu_milli.map_or(String::new(), format_milli),
            budget: t
                .quota
                .gpu_hour_budget_milli
                .map_or(String::new(), format_milli),
            weight: t.quota.weight,
            min_isolation: t.quota.min_isolation.to_string(),
        })
        .collect();
    let bindings = state
        .store
        .list_bindings(&TenantScope::All)
        .await?
        .into_iter()
        .filter(|b| b.revoked_at.is_none())
        .map(|b| {
            let tenant = b
                .tenant_id
                .as_ref()
                .and_then(|id| all.iter().find(|t| &t.id == id))
                .map(|t| t.name.to_string());
            let view = allot_api::views::BindingView::new(b, tenant);
            BindingRow {
                id: view.id,
                who: match (view.user, view.claim, view.value) {
                    (Some(u), _, _) => format!("user {u}"),
                    (None, Some(c), Some(v)) => format!("everyone with {c} = {v}"),
                    _ => "?".into(),
                },
                role: view.role,
                tenant: view.tenant.unwrap_or_else(|| "the platform".into()),
            }
        })
        .collect();
    let when = |t: Option<chrono::DateTime<chrono::Utc>>, none: &str| {
        t.map_or_else(
            || none.to_owned(),
            |t| t.format("%Y-%m-%d %H:%M").to_string(),
        )
    };
    let tokens = state
        .store
        .list_tokens(&TenantScope::All)
        .await?
        .into_iter()
        .filter(|t| t.revoked_at.is_none())
        .map(|t| TokenRow {
            tenant: t
                .tenant_id
                .as_ref()
                .and_then(|id| all.iter().find(|x| &x.id == id))
                .map_or_else(|| "the platform".into(), |x| x.name.to_string()),
            role: t.role.to_string(),
            created: when(Some(t.created_at), "—"),
            expires: when(t.expires_at, "never"),
            last_used: when(t.last_used_at, "never"),
            name: t.name,
            id: t.id,
        })
        .collect();
    Ok(render(AdminPage {
        page: Page::new(&req, &state, &who, "Administration", "admin").await,
        tenants,
        bindings,
        tokens,
    }))
}
