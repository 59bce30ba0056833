//! Job rows to domain jobs and back: conversion, the shared conditions and loads.

use std::collections::{BTreeMap, HashMap};

use allot_domain::{Job, JobEvent, JobSpec, JobState, PendingReason, Share, TenantName};
use sea_orm::sea_query::{Expr, ExprTrait, Func};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
};

use crate::StoreError;
use crate::convert::{json, parse, to_u32, to_u64};
use crate::entities::{job_events, jobs, tenants};

use super::JobFilter;

/// Scheduled or running: the jobs that hold capacity.
pub(super) fn holding_capacity() -> Condition {
    Condition::all()
        .add(jobs::Column::State.is_in([JobState::Scheduled.as_str(), JobState::Running.as_str()]))
}

pub(super) fn event_to_domain(e: job_events::Model) -> Result<JobEvent, StoreError> {
    Ok(JobEvent {
        from: e
            .from_state
            .as_deref()
            .map(|s| parse("from_state", s))
            .transpose()?,
        to: parse("to_state", &e.to_state)?,
        at: e.at,
        message: e.message,
        share: match e.gpu_milli {
            Some(milli) => Some(Share {
                gpu_milli: to_u32("gpu_milli", milli.into())?,
                gpu_memory_bytes: to_u64("gpu_memory_bytes", e.gpu_memory_bytes.unwrap_or(0))?,
            }),
            None => None,
        },
    })
}

pub(super) fn to_domain(m: jobs::Model, tenant: &str) -> Result<Job, StoreError> {
    let command: Vec<String> = json("command", &m.command)?;
    let env: BTreeMap<String, String> = json("env", &m.env)?;
    Ok(Job {
        spec: JobSpec {
            tenant: TenantName::parse("tenant", tenant)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            name: m.name,
            cpu_milli: to_u32("cpu_milli", m.cpu_milli.into())?,
            memory_bytes: to_u64("memory_bytes", m.memory_bytes)?,
            gpus: to_u32("gpus", m.gpus.into())?,
            gpu_milli: m
                .gpu_milli
                .map(|g| to_u32("gpu_milli", g.into()))
                .transpose()?,
            gpu_memory_bytes: m
                .gpu_memory_bytes
                .map(|b| to_u64("gpu_memory_bytes", b))
                .transpose()?,
            gpu_models: json("gpu_models", &m.gpu_models)?,
            priority: m.priority,
            preemptible: m.preemptible,
            isolation: m
                .isolation
                .as_deref()
                .map(|i| parse("isolation", i))
                .transpose()?,
            class: m
                .workload_class
                .as_deref()
                .map(|c| parse("workload_class", c))
                .transpose()?,
            max_retries: to_u32("max_retries", m.max_retries.into())?,
            command,
            env,
            workdir: m.workdir,
            checkpoint_dir: m.checkpoint_dir,
            volumes: json("volumes", &m.volumes)?,
            secrets: json("secrets", &m.secrets)?,
            mig_profile: m.mig_profile,
            gpu_compute: m
                .gpu_compute
                .as_deref()
                .map(|c| parse("gpu_compute", c))
                .transpose()?,
            gpu_resizable: m.gpu_resizable,
            gpu_sizing: allot_domain::GpuSizing {
                max_milli: m
                    .gpu_auto_max_milli
                    .map(|v| to_u32("gpu_auto_max_milli", v.into()))
                    .transpose()?,
                memory: m.gpu_memory_auto,
            },
            image: m.image,
            network: parse("network", &m.network)?,
            time_limit_secs: m
                .time_limit_secs
                .map(|s| to_u64("time_limit_secs", s))
                .transpose()?,
            replicas: to_u32("replicas", m.replicas.into())?,
            pack: m.pack.as_deref().map(|p| json("pack", p)).transpose()?,
            array: m
                .array_spec
                .as_deref()
                .map(|a| {
                    allot_domain::workflow::ArraySpec::parse("array_spec", a)
                        .map_err(|e| StoreError::Corrupt(format!("array_spec: {e}")))
                })
                .transpose()?,
            dependencies: json("dependencies", &m.dependencies)?,
        },
        array_task: match (m.array_id, m.array_index) {
            (Some(array_id), Some(index)) => Some(allot_domain::workflow::ArrayTask {
                array_id,
                index: to_u32("array_index", index.into())?,
            }),
            _ => None,
        },
        submitted_by: m.submitted_by,
        replica: match m.gang_id {
            Some(gang_id) => Some(allot_domain::Replica {
                gang_id,
                rank: to_u32("replica_rank", m.replica_rank.into())?,
            }),
            None => None,
        },
        image_digest: m.image_digest,
        state: parse("state", &m.state)?,
        pending_reason: match (m.pending_code, m.pending_message) {
            (Some(code), Some(message)) => Some(PendingReason { code, message }),
            _ => None,
        },
        gpu_uuids: json("gpu_uuids", &m.gpu_uuids)?,
        pid: m.pid.map(|p| to_u32("pid", p)).transpose()?,
        id: m.id,
        tenant_id: m.tenant_id,
        node_id: m.node_id,
        held_gpu_milli: m
            .held_gpu_milli
            .map(|g| to_u32("held_gpu_milli", g.into()))
            .transpose()?,
        borrowing: m.borrowing,
        attempt: to_u32("attempt", m.attempt.into())?,
        cancel_requested: m.cancel_requested,
        preempt_reason: m.preempt_reason,
        failures: to_u32("failures", m.failures.into())?,
        retry_at: m.retry_at,
        exit_code: m.exit_code,
        message: m.message,
        log_tail: m.log_tail,
        created_at: m.created_at,
        updated_at: m.updated_at,
        scheduled_at: m.scheduled_at,
        started_at: m.started_at,
        finished_at: m.finished_at,
        traceparent: m.traceparent,
        avoid: match m.avoid_until {
            Some(until) => Some(allot_domain::Avoid {
                node_id: m.avoid_node_id,
                gpu_uuids: m
                    .avoid_gpus
                    .as_deref()
                    .map(|g| json("avoid_gpus", g))
                    .transpose()?
                    .unwrap_or_default(),
                until,
            }),
            None => None,
        },
    })
}

pub(super) fn i32_of(v: u32) -> Result<i32, StoreError> {
    i32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} exceeds i32")))
}

pub(super) async fn tenant_names<C: ConnectionTrait>(
    db: &C,
) -> Result<HashMap<String, String>, StoreError> {
    Ok(tenants::Entity::find()
        .all(db)
        .await?
        .into_iter()
        .map(|t| (t.id, t.name))
        .collect())
}

/// What a job back in the queue no longer has: its placement and its run.
pub(super) fn clear_placement(row: &mut jobs::ActiveModel) {
    row.node_id = Set(None);
    row.gpu_uuids = Set("[]".to_owned());
    row.pid = Set(None);
    row.held_gpu_milli = Set(None);
    row.borrowing = Set(false);
    row.preempt_reason = Set(None);
    row.scheduled_at = Set(None);
    row.started_at = Set(None);
}

/// The rows of gang `gang_id`, in rank order.
pub(super) async fn gang_rows<C: ConnectionTrait>(
    db: &C,
    gang_id: &str,
) -> Result<Vec<jobs::Model>, StoreError> {
    Ok(jobs::Entity::find()
        .filter(jobs::Column::GangId.eq(gang_id))
        .order_by_asc(jobs::Column::ReplicaRank)
        .all(db)
        .await?)
}

/// Rows as jobs, their tenants' names looked up in `names`.
pub(super) fn with_tenants(
    rows: Vec<jobs::Model>,
    names: &HashMap<String, String>,
) -> Result<Vec<Job>, StoreError> {
    rows.into_iter()
        .map(|m| {
            let tenant = names
                .get(&m.tenant_id)
                .ok_or_else(|| StoreError::Corrupt(format!("job {} has no tenant", m.id)))?;
            to_domain(m, tenant)
        })
        .collect()
}

pub(super) async fn load<C: ConnectionTrait>(db: &C, id: &str) -> Result<Job, StoreError> {
    let m = jobs::Entity::find_by_id(id.to_owned())
        .one(db)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
    let tenant = tenants::Entity::find_by_id(m.tenant_id.clone())
        .one(db)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("job {id} has no tenant")))?;
    to_domain(m, &tenant.name)
}

/// The jobs a filter's conditions match (its cursors, order and limit aside); `None` when it
/// can match none.
pub(super) fn filtered(f: &JobFilter) -> Option<sea_orm::Select<jobs::Entity>> {
    let mut q = jobs::Entity::find().filter(f.scope.condition(jobs::Column::TenantId));
    if !f.states.is_empty() {
        q = q.filter(jobs::Column::State.is_in(f.states.iter().map(|s| s.as_str())));
    }
    if let Some(n) = &f.node_id {
        q = q.filter(jobs::Column::NodeId.eq(n.as_str()));
    }
    if f.gangs_whole {
        q = q.filter(jobs::Column::ReplicaRank.eq(0));
    }
    if let Some(name) = &f.name {
        q = q.filter(jobs::Column::Name.eq(name.as_str()));
    }
    if let Some(part) = &f.name_contains {
        // What was typed, literally: `%`, `_` and the escape itself are escaped.
        let escaped: String = part
            .chars()
            .flat_map(|c| match c {
                '%' | '_' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        // Either case, on either database (SQLite's LIKE ignores ASCII case, PostgreSQL's
        // does not).
        let pattern = format!("%{}%", escaped.to_lowercase());
        q = q.filter(
            Expr::expr(Func::lower(Expr::col(jobs::Column::Name)))
                .like(sea_orm::sea_query::LikeExpr::new(pattern).escape('\\')),
        );
    }
    if let Some(glob) = &f.name_glob {
        // `*` and `?` are the wildcards; LIKE's own are escaped. Either case, as above.
        let pattern: String = glob
            .to_lowercase()
            .chars()
            .flat_map(|c| match c {
                '%' | '_' | '\\' => vec!['\\', c],
                '*' => vec!['%'],
                '?' => vec!['_'],
                c => vec![c],
            })
            .collect();
        q = q.filter(
            Expr::expr(Func::lower(Expr::col(jobs::Column::Name)))
                .like(sea_orm::sea_query::LikeExpr::new(pattern).escape('\\')),
        );
    }
    if f.arrays_whole {
        q = q.filter(
            sea_orm::Condition::any()
                .add(jobs::Column::ArrayId.is_null())
                .add(Expr::col(jobs::Column::ArrayId).equals(jobs::Column::Id)),
        );
    }
    if let Some(array) = &f.array_id {
        q = q.filter(jobs::Column::ArrayId.eq(array.as_str()));
    }
    if let Some(who) = &f.submitted_by {
        q = q.filter(jobs::Column::SubmittedBy.eq(who.as_str()));
    }
    if let Some(prefix) = &f.id_prefix {
        // An id's characters only: nothing a LIKE pattern would read as a wildcard.
        if !prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return None;
        }
        q = q.filter(jobs::Column::Id.starts_with(prefix.to_ascii_lowercase()));
    }
    if let Some(short) = &f.short_id {
        if !allot_domain::job::is_short_id(short) {
            return None;
        }
        // The expression of the index, character for character (a bound position would not
        // match it on PostgreSQL).
        q = q.filter(Expr::cust(r#"substr("id", 25)"#).eq(short.to_ascii_lowercase()));
    }
    Some(q)
}
