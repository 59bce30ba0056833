//! Reading jobs: one, a filtered page, counts, what changed since a version, a gang's
//! replicas, and each job's events.

use std::collections::HashMap;

use allot_domain::{Job, JobEvent, JobState};
use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, Condition, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::convert::{parse, to_u64};
use crate::entities::{job_events, jobs};
use crate::{Store, StoreError, TenantScope};

use super::rows::{
    event_to_domain, filtered, gang_rows, load, tenant_names, to_domain, with_tenants,
};
use super::{JobFilter, JobPage, JobRepo};

pub(super) async fn job(store: &Store, scope: &TenantScope, id: &str) -> Result<Job, StoreError> {
    let job = load(&store.db, id).await?;
    if !scope.includes(Some(&job.tenant_id)) {
        return Err(StoreError::NotFound(format!("job {id}")));
    }
    Ok(job)
}

pub(super) async fn list_jobs(store: &Store, f: JobFilter) -> Result<JobPage, StoreError> {
    let Some(mut q) = filtered(&f) else {
        return Ok(JobPage {
            jobs: Vec::new(),
            next: None,
        });
    };
    q = if f.oldest_first {
        q.order_by_asc(jobs::Column::Id)
    } else {
        q.order_by_desc(jobs::Column::Id)
    };
    if let Some(before) = &f.before {
        q = q.filter(jobs::Column::Id.lt(before.as_str()));
    }
    if let Some(after) = &f.after {
        q = q.filter(jobs::Column::Id.gt(after.as_str()));
    }
    if let Some(limit) = f.limit {
        // One extra row tells whether another page follows.
        q = q.limit(limit + 1);
    }
    let mut rows = q.all(&store.db).await?;
    let next = match f.limit {
        Some(limit) if rows.len() as u64 > limit => {
            rows.truncate(limit as usize);
            rows.last().map(|r| r.id.clone())
        }
        _ => None,
    };
    let names = tenant_names(&store.db).await?;
    let jobs = with_tenants(rows, &names)?;
    Ok(JobPage { jobs, next })
}

pub(super) async fn count_jobs(store: &Store, f: JobFilter) -> Result<u64, StoreError> {
    use sea_orm::PaginatorTrait;
    match filtered(&f) {
        Some(q) => Ok(q.count(&store.db).await?),
        None => Ok(0),
    }
}

pub(super) async fn count_jobs_by_state(
    store: &Store,
) -> Result<Vec<(String, JobState, u64)>, StoreError> {
    counts_by_state(store, jobs::Column::TenantId, Condition::all()).await
}

pub(super) async fn array_task_counts(
    store: &Store,
    array_ids: &[String],
) -> Result<Vec<(String, JobState, u64)>, StoreError> {
    if array_ids.is_empty() {
        return Ok(Vec::new());
    }
    counts_by_state(
        store,
        jobs::Column::ArrayId,
        Condition::all().add(jobs::Column::ArrayId.is_in(array_ids.iter().cloned())),
    )
    .await
}

/// How many jobs of those `filter` takes are in each state, by `key` (a text column),
/// counted by the database. A gang counts once, by its record (replica 0), as lists and
/// tenants count it.
async fn counts_by_state(
    store: &Store,
    key: jobs::Column,
    filter: Condition,
) -> Result<Vec<(String, JobState, u64)>, StoreError> {
    #[derive(sea_orm::FromQueryResult)]
    struct Count {
        key: String,
        state: String,
        n: i64,
    }
    let counts = jobs::Entity::find()
        .select_only()
        .column_as(key, "key")
        .column(jobs::Column::State)
        .column_as(jobs::Column::Id.count(), "n")
        .filter(filter)
        .filter(jobs::Column::ReplicaRank.eq(0))
        .group_by(key)
        .group_by(jobs::Column::State)
        .into_model::<Count>()
        .all(&store.db)
        .await?;
    counts
        .into_iter()
        .map(|c| Ok((c.key, parse("job state", &c.state)?, to_u64("count", c.n)?)))
        .collect()
}

pub(super) async fn job_changes_since(
    store: &Store,
    since: DateTime<Utc>,
) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
    Ok(jobs::Entity::find()
        .select_only()
        .column(jobs::Column::Id)
        .column(jobs::Column::UpdatedAt)
        .filter(jobs::Column::UpdatedAt.gte(since))
        .into_tuple()
        .all(&store.db)
        .await?)
}

pub(super) async fn jobs_by_id(store: &Store, ids: Vec<String>) -> Result<Vec<Job>, StoreError> {
    let names = tenant_names(&store.db).await?;
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(1000) {
        let rows = jobs::Entity::find()
            .filter(jobs::Column::Id.is_in(chunk.iter().cloned()))
            .all(&store.db)
            .await?;
        out.extend(with_tenants(rows, &names)?);
    }
    Ok(out)
}

pub(super) async fn gang(store: &Store, gang_id: &str) -> Result<Vec<Job>, StoreError> {
    let names = tenant_names(&store.db).await?;
    with_tenants(gang_rows(&store.db, gang_id).await?, &names)
}

pub(super) async fn replicas_of(store: &Store, job: &Job) -> Result<Vec<Job>, StoreError> {
    match &job.replica {
        Some(r) => store.gang(&r.gang_id).await,
        None => Ok(vec![job.clone()]),
    }
}

pub(super) async fn unfinished_gangs(store: &Store) -> Result<Vec<Vec<Job>>, StoreError> {
    let unfinished = [
        JobState::Pending.as_str(),
        JobState::Scheduled.as_str(),
        JobState::Running.as_str(),
    ];
    let ids: Vec<String> = jobs::Entity::find()
        .select_only()
        .column(jobs::Column::GangId)
        .distinct()
        .filter(jobs::Column::GangId.is_not_null())
        .filter(jobs::Column::State.is_in(unfinished))
        .into_tuple::<Option<String>>()
        .all(&store.db)
        .await?
        .into_iter()
        .flatten()
        .collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let names = tenant_names(&store.db).await?;
    let rows = jobs::Entity::find()
        .filter(jobs::Column::GangId.is_in(ids))
        .order_by_asc(jobs::Column::GangId)
        .order_by_asc(jobs::Column::ReplicaRank)
        .all(&store.db)
        .await?;
    let mut gangs: Vec<Vec<Job>> = Vec::new();
    for job in with_tenants(rows, &names)? {
        let gang_of = |j: &Job| j.replica.as_ref().map(|r| r.gang_id.clone());
        let same = gangs
            .last()
            .is_some_and(|g| gang_of(&g[0]) == gang_of(&job));
        match gangs.last_mut() {
            Some(g) if same => g.push(job),
            _ => gangs.push(vec![job]),
        }
    }
    Ok(gangs)
}

pub(super) async fn jobs_run_since(
    store: &Store,
    scope: &TenantScope,
    since: DateTime<Utc>,
) -> Result<Vec<(Job, Vec<JobEvent>)>, StoreError> {
    let rows = jobs::Entity::find()
        .filter(scope.condition(jobs::Column::TenantId))
        .filter(jobs::Column::StartedAt.is_not_null())
        .filter(
            Condition::any()
                .add(jobs::Column::FinishedAt.is_null())
                .add(jobs::Column::FinishedAt.gte(since)),
        )
        .order_by_asc(jobs::Column::Id)
        .all(&store.db)
        .await?;
    let names = tenant_names(&store.db).await?;
    let mut events: HashMap<String, Vec<JobEvent>> = HashMap::new();
    for ids in rows.chunks(500) {
        let found = job_events::Entity::find()
            .filter(job_events::Column::JobId.is_in(ids.iter().map(|j| j.id.as_str())))
            .order_by_asc(job_events::Column::Id)
            .all(&store.db)
            .await?;
        for e in found {
            let job = e.job_id.clone();
            events.entry(job).or_default().push(event_to_domain(e)?);
        }
    }
    rows.into_iter()
        .map(|m| {
            let tenant = names
                .get(&m.tenant_id)
                .ok_or_else(|| StoreError::Corrupt(format!("job {} has no tenant", m.id)))?;
            let history = events.remove(&m.id).unwrap_or_default();
            Ok((to_domain(m, tenant)?, history))
        })
        .collect()
}

pub(super) async fn job_events(store: &Store, id: &str) -> Result<Vec<JobEvent>, StoreError> {
    job_events::Entity::find()
        .filter(job_events::Column::JobId.eq(id))
        .order_by_asc(job_events::Column::Id)
        .all(&store.db)
        .await?
        .into_iter()
        .map(event_to_domain)
        .collect()
}
