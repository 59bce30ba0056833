//! `/portal/jobs`: every job the signed-in person may list, filtered (tenant, state, node,
//! a part of the name), newest or oldest first, a page at a time, all on the server.

use actix_web::{HttpRequest, HttpResponse, web};
use allot_api::auth::Principal;
use allot_api::{ApiError, AppState};
use allot_authz::{Action, Resource};
use allot_domain::{Job, JobState};
use allot_store::{JobFilter, JobRepo, NodeRepo, TenantRepo, TenantScope};
use askama::Template;
use askama_web::WebTemplate;

use crate::{Page, render, to_sign_in, visible_tenants};

/// Jobs on a page.
pub(crate) const PAGE_SIZE: u64 = 50;

/// A state filter: one state, or those not yet ended.
const ACTIVE: &str = "active";

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobsQuery {
    tenant: Option<String>,
    state: Option<String>,
    node: Option<String>,
    /// A part of the name.
    name: Option<String>,
    /// `newest` (the default) or `oldest`.
    sort: Option<String>,
    /// Jobs submitted before this one's id.
    before: Option<String>,
    /// Jobs submitted after this one's id.
    after: Option<String>,
}

pub(crate) struct Row {
    pub id: String,
    pub short_id: String,
    pub name: String,
    pub tenant: String,
    pub state: String,
    pub gpus: String,
    pub node: String,
    pub submitted: String,
    pub reason: String,
    /// Who submitted it.
    pub user: String,
    /// How long it ran, runs or has waited (D-HH:MM:SS), as `job list`'s TIME.
    pub elapsed: String,
    /// Its time limit (D-HH:MM:SS), or "—".
    pub limit: String,
    /// A pending job's place in its tenant's queue (`2/7`), or "—".
    pub queue: String,
    /// When a pending job is estimated to start (UTC), or "—".
    pub start: String,
}

impl Row {
    pub(crate) fn new(j: Job, node: String) -> Self {
        Self {
            reason: j
                .pending_reason
                .as_ref()
                .map(|r| format!("{}: {}", r.code, r.message))
                .unwrap_or_default(),
            gpus: match &j.spec.mig_profile {
                Some(p) => format!("MIG {p}"),
                None => allot_domain::GangSize::of(&j.spec).to_string(),
            },
            // The form lists show and every command accepts.
            short_id: allot_domain::job::short_id(&j.id).to_owned(),
            submitted: j.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            user: j.submitted_by.clone().unwrap_or_else(|| "—".into()),
            elapsed: "—".into(),
            limit: j.spec.time_limit_secs.map_or_else(
                || "—".into(),
                |s| allot_domain::format_clock(i64::try_from(s).unwrap_or(i64::MAX)),
            ),
            queue: "—".into(),
            start: "—".into(),
            id: j.id,
            name: j.spec.name,
            tenant: j.spec.tenant.to_string(),
            state: j.state.to_string(),
            node,
        }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "jobs.html")]
struct JobsPage {
    page: Page,
    tenants: Vec<String>,
    /// Node names, for those who may see the nodes.
    nodes: Option<Vec<String>>,
    states: Vec<&'static str>,
    tenant: String,
    state: String,
    node: String,
    name: String,
    oldest_first: bool,
    matching: u64,
    jobs: Vec<Row>,
    /// Links to the pages before and after this one, in the order shown.
    earlier: Option<String>,
    later: Option<String>,
}

pub(crate) async fn jobs_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
    q: web::Query<JobsQuery>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Ok(to_sign_in());
    };
    let q = q.into_inner();
    let field = |v: &Option<String>| v.as_deref().map(str::trim).unwrap_or("").to_owned();
    let (tenant, state_name, node, name) = (
        field(&q.tenant),
        field(&q.state),
        field(&q.node),
        field(&q.name),
    );
    let oldest_first = match q.sort.as_deref() {
        None | Some("" | "newest") => false,
        Some("oldest") => true,
        Some(other) => {
            return Err(ApiError::malformed(
                "sort",
                format!("`{other}` is not newest or oldest"),
            ));
        }
    };
    for (what, cursor) in [("before", &q.before), ("after", &q.after)] {
        if cursor
            .as_ref()
            .is_some_and(|c| c.len() != 36 || !c.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        {
            return Err(ApiError::malformed(what, "is not a job id"));
        }
    }
    let all = state.store.list_tenants().await?;
    let listable = visible_tenants(&who, &all, Action::JobList);
    let scope = if tenant.is_empty() {
        who.scope(Action::JobList, "jobs")
            .unwrap_or(TenantScope::Tenants(Vec::new()))
    } else {
        let t = listable
            .iter()
            .find(|t| t.name.as_str() == tenant)
            .ok_or_else(|| ApiError::NotFound(format!("tenant `{tenant}` does not exist")))?;
        // A tenant's jobs and its teams' (those the person may list).
        TenantScope::Tenants(
            allot_domain::tenant::subtree(&all, &t.id)
                .into_iter()
                .filter(|id| listable.iter().any(|l| l.id == *id))
                .collect(),
        )
    };
    let states = match state_name.as_str() {
        "" => Vec::new(),
        ACTIVE => vec![JobState::Pending, JobState::Scheduled, JobState::Running],
        s => vec![
            s.parse::<JobState>()
                .map_err(|e| ApiError::malformed("state", e))?,
        ],
    };
    let see_nodes = who
        .authorize(Action::NodeRead, Resource::Platform, "nodes")
        .is_ok();
    let fleet = if see_nodes {
        state.store.list_nodes().await?
    } else {
        Vec::new()
    };
    let node_id = if node.is_empty() || !see_nodes {
        None
    } else {
        Some(
            fleet
                .iter()
                .find(|n| n.name == node)
                .map(|n| n.id.clone())
                .ok_or_else(|| ApiError::NotFound(format!("node `{node}` does not exist")))?,
        )
    };
    let filter = JobFilter {
        states,
        // A gang shows once (by node, each replica there).
        gangs_whole: node_id.is_none(),
        node_id,
        name_contains: (!name.is_empty()).then(|| name.clone()),
        ..JobFilter::new(scope)
    };
    let matching = state.store.count_jobs(filter.clone()).await?;
    // A page goes on from its cursor in the order shown, or back from it (read the other
    // way, then turned round).
    let back = if oldest_first {
        q.before.is_some()
    } else {
        q.after.is_some()
    };
    let page = state
        .store
        .list_jobs(JobFilter {
            before: q.before.clone(),
            after: q.after.clone(),
            oldest_first: oldest_first != back,
            limit: Some(PAGE_SIZE),
            ..filter
        })
        .await?;
    let mut jobs = page.jobs;
    let (mut more_earlier, mut more_later) = if back {
        (page.next.is_some(), true)
    } else {
        (q.before.is_some() || q.after.is_some(), page.next.is_some())
    };
    if back {
        jobs.reverse();
    }
    if jobs.is_empty() {
        (more_earlier, more_later) = (false, false);
    }
    // The query every link keeps, with a cursor.
    let keep = |cursor: (&str, &str)| {
        crate::page_link(
            "/portal/jobs",
            &[
                ("tenant", tenant.as_str()),
                ("state", state_name.as_str()),
                ("node", node.as_str()),
                ("name", name.as_str()),
                ("sort", if oldest_first { "oldest" } else { "" }),
                cursor,
            ],
        )
    };
    // Shown first are the newest (or the oldest): "earlier" pages come before in that
    // order.
    let (towards_first, towards_last) = if oldest_first {
        ("before", "after")
    } else {
        ("after", "before")
    };
    let earlier = more_earlier
        .then(|| jobs.first().map(|j| keep((towards_first, &j.id))))
        .flatten();
    let later = more_later
        .then(|| jobs.last().map(|j| keep((towards_last, &j.id))))
        .flatten();
    let node_names: std::collections::HashMap<&str, &str> = fleet
        .iter()
        .map(|n| (n.id.as_str(), n.name.as_str()))
        .collect();
    // Queue places and estimated starts as the API reads them.
    let views: std::collections::HashMap<String, allot_api::views::JobView> =
        allot_api::read_views(&state, &who, jobs.clone())
            .await?
            .into_iter()
            .map(|v| (v.id.clone(), v))
            .collect();
    let now = state.store.clock().now();
    let rows = jobs
        .into_iter()
        .map(|j| {
            let on = j
                .node_id
                .as_deref()
                .map(|id| node_names.get(id).copied().unwrap_or(id).to_owned())
                .unwrap_or_default();
            let elapsed = match (j.started_at, j.finished_at) {
                (Some(s), Some(f)) => Some(f - s),
                (Some(s), None) => Some(now - s),
                (None, None) if !j.state.is_terminal() => Some(now - j.created_at),
                _ => None,
            };
            let view = views.get(&j.id);
            let mut row = Row::new(j, on);
            if let Some(e) = elapsed {
                row.elapsed = allot_domain::format_clock(e.num_seconds());
            }
            if let Some(v) = view {
                if let (Some(p), Some(n)) = (v.queue_position, v.queue_length) {
                    row.queue = format!("{p}/{n}");
                }
                if let Some(t) = v.estimated_start {
                    row.start = t.format("%Y-%m-%d %H:%M").to_string();
                }
            }
            row
        })
        .collect();
    Ok(render(JobsPage {
        page: Page::new(&req, &state, &who, "Jobs", "jobs").await,
        tenants: listable.iter().map(|t| t.name.to_string()).collect(),
        nodes: see_nodes.then(|| fleet.iter().map(|n| n.name.clone()).collect()),
        states: vec![
            ACTIVE,
            "pending",
            "scheduled",
            "running",
            "succeeded",
            "failed",
            "cancelled",
            "timed_out",
        ],
        tenant,
        state: state_name,
        node,
        name,
        oldest_first,
        matching,
        jobs: rows,
        earlier,
        later,
    }))
}
