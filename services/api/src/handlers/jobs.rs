use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_domain::{Job, JobSpec, JobState, TenantName, ValidationError};
use allot_store::{
    JobFilter, JobRepo, NewJob, NodeRepo, SecretRepo, TenantRepo, TenantScope, VolumeRepo,
};

use crate::auth::Principal;
use crate::extract::{Json, Query};
use crate::problem::Problem;
use crate::views::{JobList, JobQuery, JobView, ReplicaView, SubmitJob};
use crate::{ApiError, AppState, json};

const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 500;

fn job_what(id: &str) -> String {
    format!("job {id}")
}

/// Resolves the tenant a request names (or the token's own), as a field error when unknown
/// or not visible, so other tenants' existence does not leak.
async fn resolve_tenant(
    state: &AppState,
    who: &Principal,
    name: Option<&str>,
) -> Result<allot_domain::Tenant, ApiError> {
    match name {
        Some(name) => {
            let unknown = || ValidationError::single("tenant", format!("no tenant named `{name}`"));
            let tenant = who
                .live_tenants()
                .iter()
                .find(|t| t.name.as_str() == name)
                .cloned()
                .ok_or_else(unknown)?;
            if !who.can_see(&tenant.id)? {
                return Err(unknown().into());
            }
            Ok(tenant)
        }
        None => match who.home_tenant() {
            Some(id) => match who.live_tenants().iter().find(|t| t.id == id) {
                Some(t) => Ok(t.clone()),
                None => Ok(state.store.tenant_by_id(id).await?),
            },
            None => Err(ValidationError::single(
                "tenant",
                "is required: the caller acts in no single tenant",
            )
            .into()),
        },
    }
}

/// Submit a job. It starts Pending and is placed by the scheduler.
#[utoipa::path(post, path = "/api/v1/jobs", tag = "jobs", request_body = SubmitJob,
    security(("bearer" = [])),
    responses((status = 201, body = JobView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 413, body = Problem),
        (status = 415, body = Problem), (status = 422, body = Problem)))]
pub async fn submit(
    state: web::Data<AppState>,
    who: Principal,
    Json(body): Json<SubmitJob>,
) -> Result<HttpResponse, ApiError> {
    // Its scheduling and launch join the request's trace.
    let traceparent = allot_telemetry::traceparent(&tracing::Span::current());
    let tenant = resolve_tenant(&state, &who, body.tenant.as_deref()).await?;
    who.authorize(
        Action::JobSubmit,
        Resource::Tenant(&tenant.id),
        &format!("tenant `{}`", tenant.name),
    )?;
    let network = match body.network.as_deref() {
        None => allot_domain::JobNetwork::default(),
        Some(n) => n
            .parse()
            .map_err(|e: String| ValidationError::single("network", e))?,
    };
    tenant.policy.network.allows_network(network)?;
    if let Some(image) = &body.image {
        let parsed = allot_domain::ImageRef::parse(image)
            .map_err(|e| ValidationError::single("image", e))?;
        if let Err(why) = tenant.policy.allows_image(&parsed) {
            // What a member tried to run against the tenant's policy leaves a trace in the
            // tenant's log, as a refused request does in the system's.
            let event = allot_domain::AuditEvent {
                log: tenant.id.clone(),
                action: "job.image_refused".to_owned(),
                target: format!("tenant/{}", tenant.id),
                outcome: allot_domain::Outcome::Denied,
                reason: Some(why.clone()),
                before: None,
                after: Some(serde_json::json!({ "image": parsed.name() })),
            };
            if let Err(e) = state.audit_batcher.record(who.audit(), event).await {
                tracing::error!(error = %e, "could not audit a refused image");
            }
            return Err(ValidationError::single("image", why).into());
        }
    }
    let name = body.name.unwrap_or_else(|| {
        body.command
            .first()
            .or(body.image.as_ref())
            .and_then(|p| p.split(['@', ':']).next())
            .and_then(|p| p.rsplit('/').next())
            .filter(|p| !p.is_empty())
            .unwrap_or("job")
            .chars()
            .take(128)
            .collect()
    });
    // CPU and memory as a LimitRange gives them: the tenant's defaults where the job asks
    // for none, and never above its maximum.
    let limits = allot_domain::JobLimits::effective(&tenant, who.live_tenants());
    let (cpu_milli, memory_bytes) = limits.apply(body.cpu_milli, body.memory_bytes)?;
    // Sized by Allot: a share of one GPU, starting at the sizing's first share unless the
    // job names one; its memory sized too unless it gives a size.
    let sizing = body
        .gpu_sizing
        .map_or_else(allot_domain::GpuSizing::default, |s| {
            allot_domain::GpuSizing {
                max_milli: s
                    .compute
                    .then_some(s.max_milli.unwrap_or(allot_domain::GPU_MILLI)),
                memory: s.memory || (s.compute && body.gpu_memory_bytes.is_none()),
            }
        });
    if body
        .gpu_sizing
        .is_some_and(|s| !s.compute && s.max_milli.is_some())
    {
        return Err(ValidationError::single(
            "gpu_sizing.max_milli",
            "is the ceiling of a sized share: set gpu_sizing.compute too",
        )
        .into());
    }
    let best_effort = body.gpu_compute == Some(allot_domain::GpuCompute::BestEffort);
    let spec = JobSpec {
        tenant: TenantName::parse("tenant", tenant.name.as_str())?,
        name,
        cpu_milli,
        memory_bytes,
        // A MIG job runs on one instance.
        gpus: if body.mig_profile.is_some() || sizing.max_milli.is_some() || best_effort {
            body.gpus.max(1)
        } else {
            body.gpus
        },
        // A best-effort job holds the least share there is; a sized one starts at its
        // tenant's default share.
        gpu_milli: body.gpu_milli.or(if best_effort {
            Some(allot_domain::BEST_EFFORT_MILLI)
        } else {
            sizing
                .max_milli
                .map(|max| allot_domain::GpuSizing::start_milli(limits.default_gpu_milli, max))
        }),
        gpu_memory_bytes: body.gpu_memory_bytes,
        gpu_models: body.gpu_models,
        priority: body.priority,
        preemptible: body.preemptible,
        // A MIG job runs at mig isolation, a sized or best-effort one shared (a different
        // one asked for is refused below), whatever its class's default.
        isolation: body
            .isolation
            .or(body
                .mig_profile
                .is_some()
                .then_some(allot_domain::Isolation::Mig))
            .or((sizing.is_sized() || best_effort).then_some(allot_domain::Isolation::Shared)),
        class: body.class,
        max_retries: body.max_retries,
        command: body.command,
        env: body.env,
        workdir: body.workdir,
        checkpoint_dir: body.checkpoint_dir,
        volumes: body.volumes.into_iter().map(Into::into).collect(),
        secrets: body.secrets.into_iter().map(Into::into).collect(),
        mig_profile: body.mig_profile,
        // A share Allot sizes is what the job is guaranteed while its GPU is contended:
        // elastic unless asked otherwise (idle time is the job's to use, and its sizer
        // reads being held back only when the GPU is full, where it costs something).
        gpu_compute: body.gpu_compute.or(sizing
            .max_milli
            .is_some()
            .then_some(allot_domain::GpuCompute::Elastic)),
        gpu_resizable: body.gpu_resizable || sizing.is_sized(),
        gpu_sizing: sizing,
        image: body.image,
        network,
        time_limit_secs: body.time_limit_secs,
        replicas: body.replicas,
        pack: body.pack.map(Into::into),
        array: body
            .array
            .as_deref()
            .map(|a| allot_domain::workflow::ArraySpec::parse("array", a))
            .transpose()?,
        dependencies: dependencies(&state, &who, body.dependencies).await?,
    };
    spec.validate()?;
    // What no node and no limit could ever give is refused now, not left to wait forever.
    state
        .admission
        .check(&spec, &tenant.id, who.live_tenants())
        .await?;
    if !spec.volumes.is_empty() {
        let declared = state.store.list_volumes().await?;
        allot_domain::volume::check_against(&spec.volumes, &spec.tenant, &declared)?;
    }
    if !spec.secrets.is_empty() {
        let stored = state.store.secrets(tenant.name.as_str()).await?;
        let mut v = allot_domain::error::Violations::default();
        for (i, u) in spec.secrets.iter().enumerate() {
            v.check(
                stored.iter().any(|s| s.name == u.secret),
                format!("secrets[{i}].secret"),
                format!("tenant `{}` has no secret `{}`", tenant.name, u.secret),
            );
        }
        v.into_result()?;
    }
    let job = state
        .submits
        .create(
            who.audit(),
            NewJob {
                tenant_id: tenant.id,
                spec,
                traceparent,
                submitted_by: Some(who.name.clone()),
            },
        )
        .await?;
    state.events.job_submitted();
    Ok(json(StatusCode::CREATED, &JobView::from(job)))
}

/// The jobs a submit waits for, each one the caller sees (by id, short id, prefix or
/// name), an array's id standing for all its tasks; none twice.
async fn dependencies(
    state: &AppState,
    who: &Principal,
    asked: Vec<crate::views::DependencyBody>,
) -> Result<Vec<allot_domain::workflow::Dependency>, ApiError> {
    if asked.len() > allot_domain::workflow::MAX_DEPENDENCIES {
        return Err(ValidationError::single(
            "dependencies",
            format!(
                "at most {} dependencies",
                allot_domain::workflow::MAX_DEPENDENCIES
            ),
        )
        .into());
    }
    let mut out: Vec<allot_domain::workflow::Dependency> = Vec::new();
    for (i, d) in asked.into_iter().enumerate() {
        let field = format!("dependencies[{i}].job");
        let job = match visible_job(state, who, &d.job, Action::JobRead).await {
            Ok(job) => job,
            Err(ApiError::NotFound(_) | ApiError::Forbidden(_)) => {
                return Err(ValidationError::single(
                    field,
                    format!("no job `{}` that you can see", d.job),
                )
                .into());
            }
            Err(e) => return Err(e),
        };
        let ids = match &job.array_task {
            Some(a) if a.array_id == job.id => {
                let scope = TenantScope::Tenants(who.permitted_tenants(Action::JobList)?);
                state
                    .store
                    .list_jobs(JobFilter {
                        array_id: Some(job.id.clone()),
                        ..JobFilter::new(scope)
                    })
                    .await?
                    .jobs
                    .into_iter()
                    .map(|j| (j.id, j.state))
                    .collect()
            }
            _ => vec![(job.id, job.state)],
        };
        for (job_id, job_state) in ids {
            let dep = allot_domain::workflow::Dependency {
                kind: d.kind,
                job_id,
            };
            // One that has ended the wrong way already can never be met: refused now,
            // rather than accepted and cancelled at the next pass.
            if let allot_domain::workflow::DependencyVerdict::Never(why) =
                allot_domain::workflow::dependency_verdict(std::slice::from_ref(&dep), |_| {
                    Some(job_state)
                })
            {
                return Err(ValidationError::single(
                    field,
                    why.replace("this job waited", "this job would wait"),
                )
                .into());
            }
            if !out.contains(&dep) {
                out.push(dep);
            }
        }
    }
    Ok(out)
}

/// List jobs, newest first, with filters and pagination.
#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs", params(JobQuery),
    security(("bearer" = [])),
    responses((status = 200, body = JobList), (status = 400, body = Problem),
        (status = 404, body = Problem, description = "no such tenant (or not one the caller sees)")))]
pub async fn list(
    state: web::Data<AppState>,
    who: Principal,
    Query(q): Query<JobQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::malformed(
            "limit",
            format!("must be between 1 and {MAX_PAGE}"),
        ));
    }
    let mut states = Vec::new();
    for s in q.state.iter().flat_map(|s| s.split(',')).map(str::trim) {
        states.push(
            s.parse::<JobState>()
                .map_err(|e| ApiError::malformed("state", e))?,
        );
    }
    if let Some(token) = &q.page_token
        && (token.len() != 36 || !token.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
    {
        return Err(ApiError::invalid(
            "page_token",
            "is not a token returned by a previous page",
        ));
    }
    if q.name
        .as_ref()
        .is_some_and(|n| n.is_empty() || n.len() > 128)
    {
        return Err(ApiError::malformed("name", "must be 1–128 characters"));
    }
    if q.user
        .as_ref()
        .is_some_and(|n| n.is_empty() || n.len() > 256)
    {
        return Err(ApiError::malformed("user", "must be 1–256 characters"));
    }
    if q.array
        .as_ref()
        .is_some_and(|a| a.is_empty() || a.len() > 36)
    {
        return Err(ApiError::malformed("array", "must be an array's id"));
    }
    let scope = listing_scope(&state, &who, q.tenant.as_deref(), "jobs").await?;
    let arrays_whole = match q.arrays.as_deref() {
        None | Some("tasks") => false,
        Some("whole") => true,
        Some(_) => return Err(ApiError::malformed("arrays", "is `whole` or `tasks`")),
    };
    let (name, name_glob) = match q.name {
        Some(n) if n.contains(['*', '?']) => (None, Some(n)),
        n => (n, None),
    };
    let page = state
        .store
        .list_jobs(JobFilter {
            states,
            // A gang lists as one job (its replicas by node are listed by node).
            gangs_whole: q.node.is_none(),
            node_id: q.node,
            name,
            name_glob,
            submitted_by: q.user,
            array_id: q.array,
            arrays_whole,
            before: q.page_token,
            limit: Some(u64::from(limit)),
            ..JobFilter::new(scope)
        })
        .await?;
    let items = read_views(&state, &who, page.jobs).await?;
    Ok(json(
        StatusCode::OK,
        &JobList {
            items,
            next_page_token: page.next,
        },
    ))
}

/// The unfinished jobs of `scope`: those that hold resources (scheduled or running), and
/// those that wait; one read.
pub async fn unfinished(
    state: &AppState,
    scope: TenantScope,
) -> Result<(Vec<Job>, Vec<Job>), ApiError> {
    let mut jobs = state
        .store
        .list_jobs(JobFilter {
            states: vec![JobState::Pending, JobState::Scheduled, JobState::Running],
            ..JobFilter::new(scope)
        })
        .await?
        .jobs;
    let holding = jobs.extract_if(.., |j| j.state.holds_resources()).collect();
    Ok((holding, jobs))
}

/// `jobs` as reads show them: with each pending one's place in its tenant's queue, and
/// each placed one's node name.
pub async fn read_views(
    state: &AppState,
    who: &Principal,
    jobs: Vec<Job>,
) -> Result<Vec<JobView>, ApiError> {
    let pending = jobs.iter().any(|j| j.state == JobState::Pending);
    let fleet = if pending || jobs.iter().any(|j| j.node_id.is_some()) {
        state.store.list_nodes().await?
    } else {
        Vec::new()
    };
    // A pending job's queue place and estimated start both come from every unfinished
    // job: any of them may stand ahead of it.
    let (places, starts) = if pending {
        let (holding, waiting) = unfinished(state, TenantScope::All).await?;
        let starts = allot_scheduler::estimate::start_estimates(
            &fleet,
            &state.store.list_tenants().await?,
            &holding,
            &waiting,
            state.store.clock().now(),
        );
        (allot_scheduler::live::queue_places(&waiting), starts)
    } else {
        (HashMap::new(), HashMap::new())
    };
    // Each placed GPU's NVLink domain.
    let nvlink: HashMap<&str, u32> = fleet
        .iter()
        .flat_map(|n| &n.gpus)
        .filter_map(|g| Some((g.uuid.as_str(), g.nvlink_domain?)))
        .collect();
    let domains_of = |uuids: &[String]| {
        let mut d: Vec<u32> = uuids
            .iter()
            .filter_map(|u| nvlink.get(u.as_str()).copied())
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    };
    let nodes: HashMap<String, String> = fleet
        .iter()
        .map(|n| (n.id.clone(), n.name.clone()))
        .collect();
    // An array's first task speaks for the array too: where its tasks stand, for every
    // array of the page in one read.
    let arrays: Vec<String> = jobs
        .iter()
        .filter(|j| j.array_task.as_ref().is_some_and(|a| a.array_id == j.id))
        .map(|j| j.id.clone())
        .collect();
    let mut task_counts: HashMap<String, std::collections::BTreeMap<JobState, u64>> =
        HashMap::new();
    for (array, job_state, n) in state.store.array_task_counts(&arrays).await? {
        task_counts.entry(array).or_default().insert(job_state, n);
    }
    let mut views = Vec::with_capacity(jobs.len());
    for j in jobs {
        let mut view = job_view(who, j)?;
        if let Some(p) = places.get(&view.id) {
            view.queue_position = Some(p.position);
            view.queue_length = Some(p.length);
        }
        view.node_name = view.node_id.as_ref().and_then(|n| nodes.get(n).cloned());
        view.nvlink_domains = domains_of(&view.gpu_uuids);
        view.estimated_start = starts.get(&view.id).copied();
        if view.rank == Some(0) {
            // A gang's record speaks for the gang.
            let members = state.store.gang(&view.id).await?;
            view.state = allot_domain::gang::state(&members);
            view.failures = allot_domain::gang::failures(&members);
            view.gang = Some(
                members
                    .into_iter()
                    .map(|m| ReplicaView {
                        rank: m.replica.as_ref().map_or(0, |r| r.rank),
                        node_name: m.node_id.as_ref().and_then(|n| nodes.get(n).cloned()),
                        id: m.id,
                        state: m.state,
                        attempt: m.attempt,
                        node_id: m.node_id,
                        gpu_uuids: m.gpu_uuids,
                        exit_code: m.exit_code,
                        message: m.message,
                    })
                    .collect(),
            );
        }
        if view.array_id.as_deref() == Some(view.id.as_str()) {
            view.array_tasks = Some(task_counts.remove(&view.id).unwrap_or_default());
        }
        views.push(view);
    }
    Ok(views)
}

/// Whose jobs a listing reads: the tenant named and its teams (every tenant below it; 404
/// when the caller may not list its jobs, as when it does not exist), else every tenant
/// the caller may list jobs of.
pub(crate) async fn listing_scope(
    state: &AppState,
    who: &Principal,
    tenant: Option<&str>,
    what: &str,
) -> Result<TenantScope, ApiError> {
    let Some(name) = tenant else {
        return who.scope(Action::JobList, what);
    };
    let what = format!("tenant `{name}`");
    let tenant = state.store.tenant_by_name(name).await.map_err(|e| {
        ApiError::unless_not_found(e, || ApiError::NotFound(format!("{what} does not exist")))
    })?;
    who.authorize(Action::JobList, Resource::Tenant(&tenant.id), &what)?;
    let all = state.store.list_tenants().await?;
    let subtree = allot_domain::tenant::subtree(&all, &tenant.id);
    // A role at a tenant reaches its teams; the caller's own scope still bounds it.
    Ok(match who.scope(Action::JobList, what.as_str())? {
        TenantScope::All => TenantScope::Tenants(subtree),
        TenantScope::Tenants(mine) => {
            TenantScope::Tenants(subtree.into_iter().filter(|t| mine.contains(t)).collect())
        }
    })
}

/// The one job among those the caller sees whose short id `key` is (the 12 hex digits lists
/// show), or whose id starts with it (at least 4 characters), or else whose name it is:
/// what people type (`job get 5d2e8f0a1b3c`, `job get 01a2`, `job get train-resnet`). An id
/// wins over a name, so that nobody's job named like another's id hides that job. More
/// than one is refused, listing them, newest first.
async fn by_name_or_prefix(
    state: &AppState,
    scope: TenantScope,
    key: &str,
) -> Result<allot_domain::Job, ApiError> {
    const SHOWN: u64 = 5;
    let mut found = Vec::new();
    let mut more = false;
    let by_id = [
        JobFilter {
            short_id: Some(key.to_owned()),
            limit: Some(SHOWN),
            ..JobFilter::new(scope.clone())
        },
        JobFilter {
            id_prefix: Some(key.to_owned()),
            limit: Some(SHOWN),
            ..JobFilter::new(scope.clone())
        },
    ];
    // An array's name names the array (its first task); `name[7]` names a task.
    let by_name = [JobFilter {
        name: Some(key.to_owned()),
        limit: Some(SHOWN),
        gangs_whole: true,
        arrays_whole: true,
        ..JobFilter::new(scope.clone())
    }];
    for filters in [&by_id[..], &by_name[..]] {
        for filter in filters {
            if (filter.id_prefix.is_some() && key.len() < 4)
                || (filter.short_id.is_some() && !allot_domain::job::is_short_id(key))
            {
                continue;
            }
            let page = state.store.list_jobs(filter.clone()).await?;
            more |= page.next.is_some();
            for j in page.jobs {
                if !found.iter().any(|f: &allot_domain::Job| f.id == j.id) {
                    found.push(j);
                }
            }
        }
        if !found.is_empty() {
            break;
        }
    }
    match found.len() {
        0 => Err(ApiError::NotFound(format!(
            "{} does not exist",
            job_what(key)
        ))),
        1 if !more => Ok(found.remove(0)),
        n => Err(ValidationError::single(
            "id",
            format!(
                "`{key}` names {} jobs ({}): give one's id",
                if more {
                    format!("more than {SHOWN}")
                } else {
                    n.to_string()
                },
                found
                    .iter()
                    .take(SHOWN as usize)
                    .map(|j| format!("{} {}", j.id, j.spec.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .into()),
    }
}

/// The job `key` names among those of `scope`: by id, else by short id, id prefix or name.
async fn find_job(
    state: &AppState,
    scope: TenantScope,
    key: &str,
) -> Result<allot_domain::Job, ApiError> {
    match state.store.job(&scope, key).await {
        Err(allot_store::StoreError::NotFound(_)) => by_name_or_prefix(state, scope, key).await,
        found => Ok(found?),
    }
}

/// A task of an array as lists show it (`sweep[7]`) or as Slurm writes it (`ID_7`): the
/// array's id or name, and the index. Only tried when nothing is found by the key as given,
/// so a job named `train_5` is still found by its name.
fn array_task_key(key: &str) -> Option<(&str, u32)> {
    let (array, index) = match key.strip_suffix(']') {
        Some(rest) => rest.rsplit_once('[')?,
        None => key.rsplit_once('_')?,
    };
    let index = index.parse().ok()?;
    (!array.is_empty()).then_some((array, index))
}

/// Task `index` of the array `array` names (by id or name), if the caller sees it.
async fn array_task(
    state: &AppState,
    scope: TenantScope,
    array: &str,
    index: u32,
) -> Result<Option<allot_domain::Job>, ApiError> {
    let first = match find_job(state, scope.clone(), array).await {
        Err(ApiError::NotFound(_)) => return Ok(None),
        found => found?,
    };
    let Some(array_id) = first.array_task.as_ref().map(|a| a.array_id.clone()) else {
        return Ok(None);
    };
    Ok(state
        .store
        .list_jobs(JobFilter {
            array_id: Some(array_id),
            ..JobFilter::new(scope)
        })
        .await?
        .jobs
        .into_iter()
        .find(|j| j.array_task.as_ref().is_some_and(|a| a.index == index)))
}

/// The job, if the caller may see its tenant (else 404) and do `action` to it (else 403).
pub async fn visible_job(
    state: &AppState,
    who: &Principal,
    id: &str,
    action: Action,
) -> Result<allot_domain::Job, ApiError> {
    let scope = TenantScope::Tenants(who.permitted_tenants(Action::JobList)?);
    let job = match find_job(state, scope.clone(), id).await {
        Err(ApiError::NotFound(why)) => match array_task_key(id) {
            Some((array, index)) => array_task(state, scope, array, index)
                .await?
                .ok_or(ApiError::NotFound(why))?,
            None => return Err(ApiError::NotFound(why)),
        },
        found => found?,
    };
    who.authorize(
        action,
        Resource::Job {
            id: &job.id,
            tenant: &job.tenant_id,
        },
        &job_what(id),
    )?;
    Ok(job)
}

/// A job as `who` is shown it: its variables' values only if they may submit jobs in its
/// tenant (and could set them anyway); viewers and auditors see the names.
pub fn job_view(who: &Principal, job: Job) -> Result<JobView, ApiError> {
    let may_submit = who.allows(Action::JobSubmit, Resource::Tenant(&job.tenant_id))?;
    let mut view = JobView::from(job);
    if !may_submit {
        for value in view.env.values_mut() {
            allot_domain::secret::REDACTED.clone_into(value);
        }
    }
    Ok(view)
}

/// Get a job with its state history.
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs", params(("id" = String, Path)),
    security(("bearer" = [])),
    responses((status = 200, body = JobView), (status = 404, body = Problem)))]
pub async fn get(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let job = visible_job(&state, &who, &id, Action::JobRead).await?;
    let events = state.store.job_events(&job.id).await?;
    let mut view = read_views(&state, &who, vec![job])
        .await?
        .pop()
        .ok_or_else(|| ApiError::Internal("a read of one job showed none".into()))?;
    view.events = Some(events.into_iter().map(Into::into).collect());
    Ok(json(StatusCode::OK, &view))
}

/// Cancel a job. A pending job is cancelled at once (200); a scheduled or running one is
/// stopped by its node (202, then `cancelled`). Cancelling a finished job changes nothing.
/// An array's id (its first task's) cancels every unfinished task of the array.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path)), security(("bearer" = [])),
    responses((status = 200, body = JobView), (status = 202, body = JobView),
        (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn cancel(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let named = visible_job(&state, &who, &id, Action::JobCancel).await?;
    // An array's id stands for all its tasks (as in dependencies, and as scancel takes
    // it): every unfinished one is cancelled, the first (whose id it is) last.
    let mut others = Vec::new();
    if named
        .array_task
        .as_ref()
        .is_some_and(|a| a.array_id == named.id)
    {
        others = state
            .store
            .list_jobs(JobFilter {
                array_id: Some(named.id.clone()),
                states: JobState::ALL
                    .into_iter()
                    .filter(|s| !s.is_terminal())
                    .collect(),
                ..JobFilter::new(TenantScope::All)
            })
            .await?
            .jobs
            .into_iter()
            .filter(|j| j.id != named.id)
            .map(|j| j.id)
            .collect();
    }
    let mut status = StatusCode::OK;
    let mut job = None;
    for id in others.iter().chain(std::iter::once(&named.id)) {
        let cancelled = state
            .store
            .request_cancel(&who.audit(), id, &who.name)
            .await?;
        // A replica of a gang cancels the gang: every replica running is told.
        for j in state
            .store
            .replicas_of(&cancelled)
            .await?
            .iter()
            .filter(|j| j.state.holds_resources())
        {
            state.events.job_cancel_requested(j);
            status = StatusCode::ACCEPTED;
        }
        job = Some(cancelled);
    }
    let job = job.ok_or_else(|| ApiError::Internal("a cancel cancelled nothing".into()))?;
    Ok(json(status, &JobView::from(job)))
}

/// Resize a running job's share of its GPUs (a job on shares of GPUs that allowed it with
/// `gpu_resizable`). Applied at once: the node holds the job to the new limits from its next
/// allocation and launch; what it holds already stays held. A larger share must fit on the
/// job's GPUs beside their other jobs and within its tenant's limits (409 otherwise).
#[utoipa::path(post, path = "/api/v1/jobs/{id}/resize", tag = "jobs",
    params(("id" = String, Path)), security(("bearer" = [])),
    request_body = crate::views::ResizeJob,
    responses((status = 200, body = JobView), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn resize(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
    Json(body): Json<crate::views::ResizeJob>,
) -> Result<HttpResponse, ApiError> {
    let job = visible_job(&state, &who, &id, Action::JobResize).await?;
    let mut v = allot_domain::error::Violations::default();
    v.check(
        body.gpu_milli.is_some() || body.gpu_memory_bytes.is_some(),
        "gpu_milli",
        "give gpu_milli, gpu_memory_bytes or both",
    );
    if let Some(m) = body.gpu_milli {
        v.check(
            (1..allot_domain::GPU_MILLI).contains(&m),
            "gpu_milli",
            "must be from 1 to 999 (a share of a GPU)",
        );
    }
    if let Some(b) = body.gpu_memory_bytes {
        v.check(b > 0, "gpu_memory_bytes", "must be positive");
    }
    v.into_result()?;
    // A sized job's ceiling holds for a person's resize too (else a member could hold a
    // share above it by resizing it back each time the sizer brings it down).
    if let Some(max) = job.spec.gpu_sizing.max_milli
        && body.gpu_milli.is_some_and(|m| m > max)
    {
        return Err(ValidationError::single(
            "gpu_milli",
            format!(
                "job {} is sized by Allot up to {} of a GPU: not above that",
                job.id,
                allot_domain::format_milli(u64::from(max))
            ),
        )
        .into());
    }
    if !job.spec.gpu_resizable {
        return Err(ApiError::Conflict(format!(
            "job {} was not submitted as resizable (gpu_resizable)",
            job.id
        )));
    }
    if !matches!(job.state, JobState::Scheduled | JobState::Running) {
        return Err(ApiError::Conflict(format!(
            "job {} is {}: only a scheduled or running job is resized",
            job.id, job.state
        )));
    }
    let now = job.share();
    let share = allot_domain::Share {
        gpu_milli: body.gpu_milli.unwrap_or(now.gpu_milli),
        gpu_memory_bytes: body.gpu_memory_bytes.unwrap_or(now.gpu_memory_bytes),
    };
    let job = state.events.resize_job(who.audit(), job, share).await?;
    Ok(json(StatusCode::OK, &JobView::from(job)))
}

/// What a job did on its GPUs, as averages over 10-second buckets (the last day) or
/// 5-minute buckets (the last 90 days).
#[utoipa::path(get, path = "/api/v1/jobs/{id}/samples", tag = "jobs",
    security(("bearer" = [])),
    params(("id" = String, Path), crate::views::SamplesQuery),
    responses((status = 200, body = Vec<crate::views::JobSampleView>), (status = 400, body = Problem),
        (status = 404, body = Problem)))]
pub async fn samples(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
    crate::extract::Query(q): crate::extract::Query<crate::views::SamplesQuery>,
) -> Result<HttpResponse, ApiError> {
    use allot_store::SampleRepo;
    let (resolution, since) = q.window(state.store.clock().now())?;
    let job = visible_job(&state, &who, &id, Action::JobRead).await?;
    let points: Vec<crate::views::JobSampleView> = state
        .store
        .job_samples(Some(&job.id), resolution, since)
        .await?
        .into_iter()
        .map(|p| crate::views::JobSampleView {
            at: p.at,
            utilization: p.utilization,
            memory_used_bytes: p.memory_used_bytes,
        })
        .collect();
    Ok(json(StatusCode::OK, &points))
}
