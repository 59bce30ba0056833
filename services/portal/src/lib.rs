//! The tenant web portal: server-rendered pages (askama templates in `web/templates/`) over
//! the same store and the same Cedar authorization as the API, with one small script
//! (`web/static/portal.js`) that sends the portal's forms and buttons to the JSON API with
//! the session's CSRF token and shows the API's field errors next to the fields. Everything
//! it needs is compiled into the binary.
//!
//! Pages: `/portal` (quotas, this week's GPU-hours, jobs and why each pending one waits),
//! `/portal/jobs/new`, `/portal/jobs/{id}` (state history, placement, log), `/portal/cluster`
//! (nodes, GPU health, MIG layouts; operator actions), `/portal/admin` (tenants, tokens) and
//! `/portal/audit` (logs, checkpoints, exports, search): one module each under `pages/`;
//! this module routes to them and holds what they share (the page frame, sign-in, links).

use actix_web::http::header;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use allot_api::auth::Principal;
use allot_api::signin::SessionAuth;
use allot_api::{ApiError, AppState};
use allot_authz::{Action, Resource};
use allot_domain::accounting::JobUsage;
use allot_domain::job::Elapsed;
use allot_domain::{Job, JobState, Tenant, format_bytes, format_duration, format_milli};
use allot_store::{
    AuditRepo, AuditSearch, IdentityRepo, JobFilter, JobRepo, NodeRepo, SampleRepo, TenantRepo,
    TenantScope,
};
mod charts;
mod cluster;
mod pages;
mod usage_charts;

use pages::admin::admin_page;
use pages::audit::{AuditQuery, audit_page};
use pages::cluster::{ClusterQuery, cluster_page, node_chart as node_chart_page};
use pages::dashboard::{DashboardQuery, dashboard_page};
use pages::job::job_page;
use pages::jobs::jobs_page;
use pages::submit::submit_page;

use askama::Template;
use askama_web::WebTemplate;
use chrono::Duration;

/// What a page may load (its own scripts and styles, nothing from elsewhere), and who may
/// frame it: nobody, so a hostile page cannot overlay the portal's buttons with its own
/// (clickjacking). `X-Frame-Options` says the same to browsers without CSP level 2.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'";

const CSS: &str = include_str!("../../../web/static/portal.css");
const JS: &str = include_str!("../../../web/static/portal.js");

/// Registers the portal's pages and assets.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(root))
        .route("/portal", web::get().to(dashboard))
        .route("/portal/jobs", web::get().to(jobs))
        .route("/portal/jobs/new", web::get().to(submit))
        .route("/portal/jobs/{id}", web::get().to(job))
        .route("/portal/cluster", web::get().to(cluster))
        .route(
            "/portal/cluster/nodes/{id}/chart",
            web::get().to(node_chart),
        )
        .route("/portal/admin", web::get().to(admin))
        .route("/portal/audit", web::get().to(audit))
        .route("/portal/static/portal.css", web::get().to(css))
        .route("/portal/static/portal.js", web::get().to(js));
}

/// Each page, with its refusals and failures shown as a page in plain language rather than
/// the API's problem document.
macro_rules! page {
    ($name:ident, $inner:ident $(, $arg:ident : $ty:ty)*) => {
        async fn $name(
            req: HttpRequest,
            state: web::Data<AppState>,
            who: Option<Principal>,
            $($arg: $ty),*
        ) -> HttpResponse {
            let (asked, shared, caller) = (req.clone(), state.clone(), who.clone());
            match $inner(req, state, who $(, $arg)*).await {
                Ok(r) => r,
                Err(e) => error_page(&asked, &shared, caller.as_ref(), &e).await,
            }
        }
    };
}

page!(dashboard, dashboard_page, q: web::Query<DashboardQuery>);
page!(submit, submit_page);
page!(jobs, jobs_page, q: web::Query<pages::jobs::JobsQuery>);
page!(job, job_page, id: web::Path<String>);
page!(cluster, cluster_page, q: web::Query<ClusterQuery>);
page!(node_chart, node_chart_page, id: web::Path<String>);
page!(admin, admin_page);
page!(audit, audit_page, q: web::Query<AuditQuery>);

#[derive(Template, WebTemplate)]
#[template(path = "error.html")]
struct ErrorPage {
    page: Page,
    detail: String,
}

async fn error_page(
    req: &HttpRequest,
    state: &AppState,
    who: Option<&Principal>,
    e: &ApiError,
) -> HttpResponse {
    use actix_web::ResponseError;
    let status = e.status_code();
    let (title, detail) = match status.as_u16() {
        403 => ("Not allowed", format!("You may not see this page: {e}.")),
        404 => ("Not found", format!("{e}.")),
        s if s < 500 => ("That did not work", format!("{e}.")),
        _ => (
            "Something went wrong",
            "The control plane could not show this page; try again in a moment.".to_owned(),
        ),
    };
    // A refusal keeps the navigation of whoever is signed in.
    let page = match who {
        Some(who) => Page::new(req, state, who, title, "error").await,
        None => Page::signed_out(title, "error"),
    };
    let mut res = render(ErrorPage { page, detail });
    *res.status_mut() = status;
    res
}

async fn root() -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/portal"))
        .finish()
}

async fn css() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(CSS)
}

async fn js() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(JS)
}

/// What every page's frame needs.
pub struct Page {
    pub title: String,
    pub section: &'static str,
    pub signed_in: bool,
    /// Who is signed in, and as which roles, in words.
    pub who: String,
    pub admin: bool,
    pub auditor: bool,
    /// Whether they may submit a job in some tenant.
    pub submit: bool,
    /// Whether they may see the nodes.
    pub cluster: bool,
    pub csrf: Option<String>,
    /// Reloads itself every 2 s where scripts do not run.
    pub refresh: bool,
}

impl Page {
    /// The frame of a page for someone not signed in: no navigation.
    fn signed_out(title: &str, section: &'static str) -> Self {
        Self {
            title: title.into(),
            section,
            signed_in: false,
            who: String::new(),
            admin: false,
            auditor: false,
            submit: false,
            cluster: false,
            csrf: None,
            refresh: false,
        }
    }

    async fn new(
        req: &HttpRequest,
        state: &AppState,
        who: &Principal,
        title: impl Into<String>,
        section: &'static str,
    ) -> Self {
        Self {
            title: title.into(),
            section,
            signed_in: true,
            who: signed_in_as(state, who).await,
            admin: who
                .authorize(Action::TenantCreate, Resource::Platform, "tenants")
                .is_ok(),
            auditor: allot_api::readable_logs(who).is_ok(),
            submit: who
                .permitted_tenants(Action::JobSubmit)
                .is_ok_and(|t| !t.is_empty()),
            cluster: who
                .authorize(Action::NodeRead, Resource::Platform, "nodes")
                .is_ok(),
            csrf: req
                .extensions()
                .get::<SessionAuth>()
                .map(|s| s.csrf_token.clone()),
            refresh: false,
        }
    }
}

/// "ada@example.com · tenant-admin of ml, platform-auditor": who is signed in (a user's
/// email or name, or which token), and the roles they hold.
async fn signed_in_as(state: &AppState, who: &Principal) -> String {
    let name = match who.kind {
        allot_domain::ActorKind::User => state
            .store
            .user(&who.id)
            .await
            .ok()
            .and_then(|u| u.email.or(u.name))
            .unwrap_or_else(|| who.id.clone()),
        _ => format!("API token {}", who.name),
    };
    let tenants = state.store.list_tenants().await.unwrap_or_default();
    let mut roles: Vec<String> = who
        .bindings
        .iter()
        .map(|b| match &b.tenant_id {
            Some(t) => format!(
                "{} of {}",
                b.role.as_str(),
                tenants
                    .iter()
                    .find(|x| &x.id == t)
                    .map_or_else(|| t.clone(), |x| x.name.to_string())
            ),
            None => b.role.as_str().to_owned(),
        })
        .collect();
    roles.sort();
    roles.dedup();
    if roles.is_empty() {
        format!("{name} · no role yet")
    } else {
        format!("{name} · {}", roles.join(", "))
    }
}

/// Where a page sends someone not signed in.
fn to_sign_in() -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/portal"))
        .finish()
}

#[derive(Template, WebTemplate)]
#[template(path = "signin.html")]
struct SignInPage {
    page: Page,
    oidc: bool,
    dev: bool,
}

pub(crate) fn visible_tenants(who: &Principal, all: &[Tenant], action: Action) -> Vec<Tenant> {
    all.iter()
        .filter(|t| {
            who.authorize(action, Resource::Tenant(&t.id), "tenant")
                .is_ok()
        })
        .cloned()
        .collect()
}

/// A link to `path` with the query `pairs`, those with an empty value left out.
pub(crate) fn page_link(path: &str, pairs: &[(&str, &str)]) -> String {
    let kept: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (*k, v.trim()))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    format!(
        "{path}?{}",
        serde_urlencoded::to_string(&kept).unwrap_or_default()
    )
}

/// How much of the end of a job's log its page shows (`allot job logs` prints it all).
pub(crate) const PAGE_LOG_BYTES: u64 = 64 * 1024;

fn render<T: Template>(t: T) -> HttpResponse {
    match t.render() {
        Ok(html) => HttpResponse::Ok()
            .content_type("text/html; charset=utf-8")
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
            .insert_header((header::X_FRAME_OPTIONS, "DENY"))
            .body(html),
        Err(e) => {
            tracing::error!(error = %e, "rendering a portal page");
            HttpResponse::InternalServerError().body("the page could not be rendered")
        }
    }
}
