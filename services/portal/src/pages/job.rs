//! A job's page (`/portal/jobs/{id}`): its state history, placement, resizes, GPU charts and log.

use super::super::*;

#[derive(Template, WebTemplate)]
#[template(path = "job.html")]
pub(crate) struct JobPage {
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

pub(crate) async fn job_page(
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
        None if view.state == JobState::Pending => {
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
