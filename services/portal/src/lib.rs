//! The tenant web portal: server-rendered pages (askama templates in `web/templates/`) over
//! the same store and the same Cedar authorization as the API, with one small script
//! (`web/static/portal.js`) that sends the portal's forms and buttons to the JSON API with
//! the session's CSRF token and shows the API's field errors next to the fields. Everything
//! it needs is compiled into the binary.
//!
//! Pages: `/portal` (quotas, this week's GPU-hours, jobs and why each pending one waits),
//! `/portal/jobs/new`, `/portal/jobs/{id}` (state history, placement, log), `/portal/cluster`
//! (nodes, GPU health, MIG layouts; operator actions), `/portal/admin` (tenants, tokens) and
//! `/portal/audit` (logs, checkpoints, exports, search).

use actix_web::http::header;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use allot_api::auth::Principal;
use allot_api::signin::SessionAuth;
use allot_api::views::NodeView;
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
mod jobs_list;
mod usage_charts;

use jobs_list::jobs_page;

use askama::Template;
use askama_web::WebTemplate;
use chrono::Duration;

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
page!(jobs, jobs_page, q: web::Query<jobs_list::JobsQuery>);
page!(job, job_page, id: web::Path<String>);
page!(cluster, cluster_page, q: web::Query<ClusterQuery>);
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
        _ => format!("API token {}", who.id.chars().take(8).collect::<String>()),
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

struct QuotaRow {
    name: String,
    parent: Option<String>,
    /// What it and its teams hold, against its quota.
    bars: Vec<QuotaBar>,
    /// Its jobs and its teams' waiting, and holding resources (a gang once).
    pending: u64,
    running: u64,
    /// Its own jobs alone.
    own_pending: u64,
    own_running: u64,
}

/// One resource of a quota: what is used, guaranteed, borrowed and the limit.
struct QuotaBar {
    resource: &'static str,
    used: String,
    guaranteed: String,
    borrowed: String,
    limit: String,
    used_pct: u64,
    guaranteed_pct: u64,
}

impl QuotaBar {
    /// A bar from 0 to the limit, or without one to what the fleet has (`fleet`; 0 when
    /// the nodes did not say), so an unlimited quota is not drawn full.
    fn new(
        resource: &'static str,
        used: u64,
        guaranteed: u64,
        (limit, fleet): (Option<u64>, u64),
        show: impl Fn(u64) -> String,
    ) -> Self {
        let scale = limit.unwrap_or(fleet).max(used).max(guaranteed).max(1);
        Self {
            resource,
            used: show(used),
            guaranteed: show(guaranteed),
            borrowed: show(used.saturating_sub(guaranteed)),
            limit: match (limit, fleet) {
                (Some(l), _) => show(l),
                (None, 0) => "none".into(),
                (None, f) => format!("none (the fleet has {})", show(f)),
            },
            used_pct: used * 100 / scale,
            guaranteed_pct: guaranteed * 100 / scale,
        }
    }
}

/// What the dashboard's charts show.
#[derive(Debug, Default, serde::Deserialize)]
struct DashboardQuery {
    /// The GPU-hours chart's columns: `day` (the default), `week` or `month`.
    period: Option<String>,
    /// Whose GPUs held against guarantee are drawn (default: the first tenant listed).
    tenant: Option<String>,
}

/// The newest jobs the dashboard shows (the jobs page has them all).
const DASHBOARD_JOBS: u64 = 10;

#[derive(Template, WebTemplate)]
#[template(path = "dashboard.html")]
struct DashboardPage {
    page: Page,
    tenants: Vec<QuotaRow>,
    /// GPU-hours per tenant over time (stacked), as markup.
    usage_chart: String,
    /// `day`, `week` or `month`.
    period: &'static str,
    /// One tenant's GPUs held against its guarantee over the last week, as markup.
    allocation_chart: String,
    /// Whose it is.
    allocation_tenant: String,
    jobs: Vec<jobs_list::Row>,
    /// How many jobs the person may list.
    all_jobs: u64,
}

fn visible_tenants(who: &Principal, all: &[Tenant], action: Action) -> Vec<Tenant> {
    all.iter()
        .filter(|t| {
            who.authorize(action, Resource::Tenant(&t.id), "tenant")
                .is_ok()
        })
        .cloned()
        .collect()
}

async fn dashboard_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
    q: web::Query<DashboardQuery>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        let page = SignInPage {
            page: Page::signed_out("Sign in", "signin"),
            oidc: state.web_sign_in.is_some(),
            dev: state.dev_sign_in,
        };
        return Ok(render(page));
    };
    let all = state.store.list_tenants().await?;
    let tenants = visible_tenants(&who, &all, Action::QuotaRead);
    // What the registered nodes offer in all: the scale of a quota with no limit.
    let nodes = state.store.list_nodes().await?;
    let fleet = nodes
        .iter()
        .fold(allot_domain::Resources::default(), |mut sum, n| {
            sum.gpu_milli += n.gpus.len() as u64 * u64::from(allot_domain::GPU_MILLI);
            sum.cpu_milli += n.cpu_milli;
            sum.memory_bytes += n.memory_bytes;
            sum.gpu_memory_bytes += n.gpus.iter().map(|g| g.memory_bytes).sum::<u64>();
            sum
        });
    let scope = who
        .scope(Action::JobList, "jobs")
        .unwrap_or(TenantScope::Tenants(Vec::new()));
    let jobs = state
        .store
        .list_jobs(JobFilter {
            limit: Some(DASHBOARD_JOBS),
            gangs_whole: true,
            ..JobFilter::new(scope.clone())
        })
        .await?
        .jobs;
    let all_jobs = state
        .store
        .count_jobs(JobFilter {
            gangs_whole: true,
            ..JobFilter::new(scope.clone())
        })
        .await?;
    let (mut unfinished, waiting) = allot_api::unfinished(&state, scope.clone()).await?;
    unfinished.extend(waiting);
    let totals = allot_domain::holding::tenant_totals(&all, &unfinished, &nodes);
    let parts = |milli: u64| milli * allot_domain::GpuParts::PER_MILLI;
    let quota_rows = tenants
        .iter()
        .map(|t| {
            // What it and its teams hold, as its quota is held to it.
            let f = totals.get(&t.id).copied().unwrap_or_default();
            let used = f.total.held;
            let (g, l) = (&t.quota.guaranteed, &t.quota.limit);
            let bars = vec![
                QuotaBar::new(
                    "GPUs",
                    used.gpu.0,
                    parts(g.gpu_milli),
                    (l.gpu_milli.map(parts), parts(fleet.gpu_milli)),
                    |p| allot_domain::GpuParts(p).to_string(),
                ),
                QuotaBar::new(
                    "CPUs",
                    used.cpu_milli,
                    g.cpu_milli,
                    (l.cpu_milli, fleet.cpu_milli),
                    format_milli,
                ),
                QuotaBar::new(
                    "Memory",
                    used.memory_bytes,
                    g.memory_bytes,
                    (l.memory_bytes, fleet.memory_bytes),
                    format_bytes,
                ),
                QuotaBar::new(
                    "GPU memory",
                    used.gpu_memory_bytes,
                    g.gpu_memory_bytes,
                    (l.gpu_memory_bytes, fleet.gpu_memory_bytes),
                    format_bytes,
                ),
            ];
            QuotaRow {
                pending: f.total.jobs_pending,
                running: f.total.jobs_running,
                own_pending: f.own.jobs_pending,
                own_running: f.own.jobs_running,
                name: t.name.to_string(),
                parent: t
                    .parent_id
                    .as_ref()
                    .and_then(|p| all.iter().find(|x| &x.id == p))
                    .map(|p| p.name.to_string()),
                bars,
            }
        })
        .collect();
    // GPU-hours per tenant over days, weeks or months, and one tenant's GPUs held against
    // its guarantee over the last week, from the spans its jobs ran.
    let period = usage_charts::Period::parse(q.period.as_deref())
        .map_err(|e| ApiError::malformed("period", e))?;
    let now = state.store.clock().now();
    let week_ago = now - Duration::days(7);
    let start = period.start(now).min(week_ago);
    let ran = state.store.jobs_run_since(&scope, start).await?;
    let name_of = |id: &str| {
        all.iter()
            .find(|t| t.id == id)
            .map_or_else(|| id.to_owned(), |t| t.name.to_string())
    };
    let names: Vec<String> = ran.iter().map(|(j, _)| name_of(&j.tenant_id)).collect();
    let inputs: Vec<JobUsage<'_>> = ran
        .iter()
        .zip(&names)
        .flat_map(|((j, events), tenant)| JobUsage::of(j, tenant, events, now))
        .collect();
    let usage_chart = usage_charts::usage_chart(period, &inputs, now).html();
    let shown = match q.tenant.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
        Some(name) => Some(
            tenants
                .iter()
                .find(|t| t.name.as_str() == name)
                .ok_or_else(|| ApiError::NotFound(format!("tenant `{name}` does not exist")))?,
        ),
        None => tenants.first(),
    };
    let (allocation_chart, allocation_tenant) = match shown {
        Some(t) => (
            usage_charts::allocation_chart(t, &inputs, week_ago, now).html(),
            t.name.to_string(),
        ),
        None => (String::new(), String::new()),
    };
    let job_rows = jobs
        .into_iter()
        .map(|j| jobs_list::Row::new(j, String::new()))
        .collect();
    Ok(render(DashboardPage {
        page: Page::new(&req, &state, &who, "Dashboard", "dashboard").await,
        tenants: quota_rows,
        usage_chart,
        period: period.as_str(),
        allocation_chart,
        allocation_tenant,
        jobs: job_rows,
        all_jobs,
    }))
}

#[derive(Template, WebTemplate)]
#[template(path = "submit.html")]
struct SubmitPage {
    page: Page,
    tenants: Vec<String>,
    mig_profiles: Vec<&'static str>,
}

async fn submit_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Ok(to_sign_in());
    };
    let all = state.store.list_tenants().await?;
    let tenants = visible_tenants(&who, &all, Action::JobSubmit)
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    Ok(render(SubmitPage {
        page: Page::new(&req, &state, &who, "Submit a job", "submit").await,
        tenants,
        // Only what some GPU in MIG mode can make: another profile could never run.
        mig_profiles: allot_scheduler::admission::mig_profiles(&state.store.list_nodes().await?),
    }))
}

/// How much of the end of a job's log its page shows (`allot job logs` prints it all).
const PAGE_LOG_BYTES: u64 = 64 * 1024;

#[derive(Template, WebTemplate)]
#[template(path = "job.html")]
struct JobPage {
    page: Page,
    job: allot_api::views::JobView,
    events: Vec<allot_api::views::JobEventView>,
    asked: String,
    placement: String,
    cancellable: bool,
    /// What cancelling would do, asked before it.
    cancel_confirm: String,
    /// The end of its latest attempt's log.
    log: allot_api::LogTail,
    /// How much of it is shown, when not all of it.
    log_shown: Option<String>,
    /// Whether the log grows on the page (the job has not ended).
    follow: bool,
    /// Its GPU use over the last 30 minutes (charts with axes, as markup; empty without
    /// samples or while it holds no GPU), and the latest utilization and memory.
    use_chart: String,
    use_now: String,
    /// How long it has run, ran or waited, in words (empty while scheduled).
    elapsed: String,
    /// A pending job's place in its tenant's queue (empty otherwise).
    queue: String,
    /// A pending job's estimated start, in words (empty otherwise).
    estimated_start: String,
    /// Its time limit, in words (empty without one).
    time_limit: String,
}

async fn job_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Ok(to_sign_in());
    };
    let job = allot_api::visible_job(&state, &who, &id, Action::JobRead).await?;
    let events = state.store.job_events(&job.id).await?;
    let asked = match &job.spec.mig_profile {
        Some(p) => format!("a MIG {p} instance"),
        None if job.spec.gpus == 0 => "no GPU".to_owned(),
        None => {
            let size = allot_domain::GangSize::of(&job.spec);
            format!(
                "{size} GPU{}{}{}",
                if size.total == allot_domain::GpuParts::GPU {
                    ""
                } else {
                    "s"
                },
                if size.replicas > 1 {
                    format!(" ({} replicas of {} each)", size.replicas, size.per_replica)
                } else {
                    String::new()
                },
                job.spec
                    .gpu_memory_bytes
                    .map(|b| format!(", with {} of memory on each GPU", format_bytes(b)))
                    .unwrap_or_default()
            )
        }
    };
    let terminal = job.state.is_terminal();
    let cancellable = !terminal
        && !job.cancel_requested
        && who
            .authorize(
                Action::JobCancel,
                Resource::Job {
                    id: &job.id,
                    tenant: &job.tenant_id,
                },
                "job",
            )
            .is_ok();
    let cancel_confirm = if job.state == JobState::Pending {
        format!(
            "Cancel {} ({})? It has not started and will not run.",
            job.spec.name, job.id
        )
    } else {
        format!(
            "Cancel {} ({})? It is stopped now (its work since its last checkpoint is lost) \
             and does not run again.",
            job.spec.name, job.id
        )
    };
    let log = allot_api::log_tail(state.clone().into_inner(), job.clone(), PAGE_LOG_BYTES).await?;
    let placement = match &job.node_id {
        Some(n) => {
            let name = state
                .store
                .node(n)
                .await
                .map_or_else(|_| n.clone(), |n| n.name);
            format!("node {name}, {}", job.gpu_uuids.join(", "))
        }
        None => "not placed".to_owned(),
    };
    // GPU use over the last half hour, from the job's own samples.
    let since = state.store.clock().now() - Duration::minutes(30);
    let samples = state.store.job_samples(Some(&job.id), 10, since).await?;
    // Only while it holds GPUs: a pending job's last samples are of an attempt that ended.
    let holds = matches!(job.state, JobState::Scheduled | JobState::Running);
    let use_now = samples
        .last()
        .filter(|_| holds)
        .map_or_else(String::new, |p| {
            format!(
                "{:.0}% busy, {} of GPU memory",
                p.utilization * 100.0,
                format_bytes(p.memory_used_bytes)
            )
        });
    let now = state.store.clock().now();
    let use_chart = if holds && !samples.is_empty() {
        let busy = charts::Series {
            name: "GPU busy".into(),
            points: samples
                .iter()
                .map(|p| (p.at, p.utilization * 100.0))
                .collect(),
            steps: false,
            dashed: false,
        };
        let memory = charts::Series {
            name: "GPU memory held".into(),
            points: samples
                .iter()
                .map(|p| (p.at, p.memory_used_bytes as f64 / f64::from(1u32 << 30)))
                .collect(),
            steps: false,
            dashed: false,
        };
        let mut held = charts::time_series(
            "GPU memory the job held, last 30 minutes",
            "GiB",
            &[memory],
            (since, now),
            None,
            "",
        )
        .html();
        held.insert_str(
            0,
            &charts::time_series(
                "How busy the job kept its GPUs, last 30 minutes",
                "busy (%)",
                &[busy],
                (since, now),
                Some(100.0),
                "%",
            )
            .html(),
        );
        held
    } else {
        String::new()
    };
    let (phase, span) = allot_domain::job::elapsed(
        job.state,
        job.attempt,
        job.created_at,
        job.updated_at,
        job.started_at,
        job.finished_at,
        now,
    );
    let span = format_duration(span.num_seconds());
    let elapsed = match phase {
        Elapsed::Running => format!("running for {span}"),
        Elapsed::Ran => format!("ran for {span}"),
        Elapsed::Waiting => format!("waiting for {span}"),
        Elapsed::EndedUnstarted | Elapsed::InState => String::new(),
    };
    let view = allot_api::read_views(&state, &who, vec![job])
        .await?
        .pop()
        .ok_or_else(|| ApiError::Internal("a read of one job showed none".into()))?;
    let queue = match (view.queue_position, view.queue_length) {
        (Some(p), Some(n)) => format!(
            "{p} of {n} in {}'s queue (by priority, then age; the scheduler chooses between \
             tenants' queues by guarantee, priority and fair share)",
            view.tenant
        ),
        _ => String::new(),
    };
    let estimated_start = match view.estimated_start {
        Some(t) if t <= now => "now: GPUs are free for it".to_owned(),
        Some(t) => format!(
            "{} UTC (in {}), if the jobs ahead end at their time limits",
            t.format("%Y-%m-%d %H:%M"),
            format_duration((t - now).num_seconds())
        ),
        None if view.state == "pending" => {
            "unknown: a job it waits behind has no time limit".to_owned()
        }
        None => String::new(),
    };
    let time_limit = view.time_limit_secs.map_or_else(String::new, |s| {
        format_duration(i64::try_from(s).unwrap_or(i64::MAX))
    });
    let events = events.into_iter().map(Into::into).collect();
    // With scripts its log grows in place and the page is reloaded when its state changes
    // (portal.js); without, the page reloads itself while the job has not ended.
    let mut page = Page::new(&req, &state, &who, format!("Job {}", view.name), "jobs").await;
    page.refresh = !terminal;
    Ok(render(JobPage {
        page,
        job: view,
        events,
        asked,
        placement,
        cancellable,
        cancel_confirm,
        log_shown: (log.start > 0).then(|| format_bytes(log.end - log.start)),
        log,
        follow: !terminal,
        use_chart,
        use_now,
        elapsed,
        queue,
        estimated_start,
        time_limit,
    }))
}

struct SliceCell {
    start: u8,
    width: u8,
    label: String,
}

struct GpuRow {
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

struct NodeRow {
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
    /// Its GPUs' use over the last 30 minutes, one line each (markup; empty without the
    /// telemetry right).
    chart: String,
}

/// What cordoning and draining node `name` would do to the jobs on it, in the words the
/// portal asks with.
fn node_confirmations(name: &str, on_node: &[&Job]) -> (String, String) {
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
struct ClusterPage {
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
const NODES_PER_PAGE: usize = 20;

/// Which nodes' details the cluster page shows (its summary is of them all).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterQuery {
    /// `ready`, `cordoned` or `not-ready`.
    state: Option<String>,
    /// A part of the name.
    name: Option<String>,
    /// From 1.
    page: Option<usize>,
}

async fn cluster_page(
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
    let since = now - Duration::minutes(30);
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
    let fleet: Vec<(allot_domain::Node, String)> = state
        .store
        .list_nodes()
        .await?
        .into_iter()
        .map(|n| {
            let status = NodeView::new(n.clone(), now).status;
            (n, status)
        })
        .collect();
    let summary = cluster::summary(&fleet, &holding);
    let want_state = q.state.as_deref().unwrap_or("").trim();
    if !["", "ready", "cordoned", "not-ready"].contains(&want_state) {
        return Err(ApiError::malformed(
            "state",
            format!("`{want_state}` is not ready, cordoned or not-ready"),
        ));
    }
    let want_name = q.name.as_deref().unwrap_or("").trim().to_lowercase();
    let chosen: Vec<(allot_domain::Node, String)> = fleet
        .into_iter()
        .filter(|(n, status)| {
            (want_state.is_empty() || cluster::node_state(status, n.cordoned) == want_state)
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
            let state = cluster::node_state(&status, n.cordoned);
            let (state_label, state_detail) = match state {
                "ready" => ("ready".to_owned(), "takes new work".to_owned()),
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
                let series: Vec<charts::Series> = n
                    .gpus
                    .iter()
                    .map(|g| charts::Series {
                        name: format!("GPU {}", g.index),
                        points: history.get(&g.uuid).cloned().unwrap_or_default(),
                        steps: false,
                        dashed: false,
                    })
                    .collect();
                charts::time_series(
                    format!("How busy each GPU of {} was, last 30 minutes", n.name),
                    "busy (%)",
                    &series,
                    (since, now),
                    Some(100.0),
                    "%",
                )
                .html()
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

struct TenantRow {
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

struct BindingRow {
    id: String,
    who: String,
    role: String,
    tenant: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "admin.html")]
struct AdminPage {
    page: Page,
    tenants: Vec<TenantRow>,
    bindings: Vec<BindingRow>,
}

async fn admin_page(
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
    Ok(render(AdminPage {
        page: Page::new(&req, &state, &who, "Administration", "admin").await,
        tenants,
        bindings,
    }))
}

struct LogRow {
    id: String,
    name: String,
    size: u64,
    checkpoint: String,
}

struct EntryRow {
    /// `<log>:<seq>`.
    key: String,
    at: String,
    log: String,
    action: String,
    /// The actor by name where it still has one (`token: ci-pipeline`), and as recorded.
    actor: String,
    actor_id: String,
    target: String,
    target_id: String,
    outcome: String,
}

#[derive(Debug, Default, serde::Deserialize)]
struct AuditQuery {
    #[serde(default)]
    action: String,
    #[serde(default)]
    actor: String,
    /// A page's cursors, as the search API gives them.
    after: Option<String>,
    before: Option<String>,
}

impl AuditQuery {
    /// This search's page `after` or `before` a cursor, as a link.
    fn link(&self, dir: &str, cursor: &str) -> String {
        page_link(
            "/portal/audit",
            &[
                ("action", &self.action),
                ("actor", &self.actor),
                (dir, cursor),
            ],
        )
    }
}

/// A link to `path` with the query `pairs`, those with an empty value left out.
fn page_link(path: &str, pairs: &[(&str, &str)]) -> String {
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

#[derive(Template, WebTemplate)]
#[template(path = "audit.html")]
struct AuditPage {
    page: Page,
    logs: Vec<LogRow>,
    query: AuditQuery,
    entries: Vec<EntryRow>,
    /// Links to the newer and the older page; empty where there is none.
    newer: String,
    older: String,
}

async fn audit_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
    q: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Ok(to_sign_in());
    };
    let visible = allot_api::readable_logs(&who)?;
    let tenants = state.store.list_tenants().await?;
    let name_of = |log: &str| {
        tenants
            .iter()
            .find(|t| t.id == log)
            .map_or_else(|| log.to_owned(), |t| t.name.to_string())
    };
    let mut logs = Vec::new();
    for head in state.store.audit_heads().await? {
        if visible.as_ref().is_some_and(|v| !v.contains(&head.log)) {
            continue;
        }
        let checkpoint = state.store.latest_checkpoint(&head.log).await?.map_or_else(
            || "none yet".to_owned(),
            |c| format!("signed at size {}", c.size),
        );
        logs.push(LogRow {
            name: name_of(&head.log),
            id: head.log,
            size: head.size,
            checkpoint,
        });
    }
    let query = q.into_inner();
    // Newest first, a page at a time both ways.
    let search = AuditSearch {
        logs: visible,
        action: (!query.action.trim().is_empty()).then(|| query.action.trim().to_owned()),
        actor: (!query.actor.trim().is_empty()).then(|| query.actor.trim().to_owned()),
        newest_first: true,
        limit: 100,
        ..AuditSearch::default()
    };
    let found = allot_api::search_page(
        &state,
        &who,
        search,
        query.after.as_deref(),
        query.before.as_deref(),
    )
    .await?;
    let entries = found
        .entries
        .into_iter()
        .map(|e| {
            let body: serde_json::Value = e
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str(b).ok())
                .unwrap_or_default();
            let kind = body["actor"]["kind"].as_str().unwrap_or("?");
            let actor_id = format!("{kind}:{}", body["actor"]["id"].as_str().unwrap_or("?"));
            let target_id = body["target"].as_str().unwrap_or("").to_owned();
            EntryRow {
                key: format!("{}:{}", e.log, e.seq),
                at: e.time.get(..19).unwrap_or(&e.time).replace('T', " "),
                log: name_of(&e.log),
                action: e.action,
                actor: e
                    .actor_name
                    .map_or_else(|| actor_id.clone(), |n| format!("{kind}: {n}")),
                actor_id,
                target: e.target_name.map_or_else(
                    || target_id.clone(),
                    |n| format!("{}/{n}", target_id.split('/').next().unwrap_or_default()),
                ),
                target_id,
                outcome: e.outcome,
            }
        })
        .collect();
    let newer = found
        .prev
        .map_or_else(String::new, |c| query.link("before", &c));
    let older = found
        .next
        .map_or_else(String::new, |c| query.link("after", &c));
    Ok(render(AuditPage {
        page: Page::new(&req, &state, &who, "Audit", "audit").await,
        logs,
        query,
        entries,
        newer,
        older,
    }))
}

/// What a page may load (its own scripts and styles, nothing from elsewhere), and who may
/// frame it: nobody, so a hostile page cannot overlay the portal's buttons with its own
/// (clickjacking). `X-Frame-Options` says the same to browsers without CSP level 2.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'";

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
