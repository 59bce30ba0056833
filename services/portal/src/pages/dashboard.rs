//! The dashboard (`/portal`): each visible tenant's quota bars, GPU-hours and allocation charts, and its jobs with why each pending one waits.

use super::super::*;

pub(crate) struct QuotaRow {
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
pub(crate) struct QuotaBar {
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
pub(crate) struct DashboardQuery {
    /// The GPU-hours chart's columns: `day` (the default), `week` or `month`.
    period: Option<String>,
    /// Whose GPUs held against guarantee are drawn (default: the first tenant listed).
    tenant: Option<String>,
}

/// The newest jobs the dashboard shows (the jobs page has them all).
pub(crate) const DASHBOARD_JOBS: u64 = 10;

#[derive(Template, WebTemplate)]
#[template(path = "dashboard.html")]
pub(crate) struct DashboardPage {
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
    jobs: Vec<pages::jobs::Row>,
    /// How many jobs the person may list.
    all_jobs: u64,
}

pub(crate) async fn dashboard_page(
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
        .map(|j| pages::jobs::Row::new(j, String::new()))
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
