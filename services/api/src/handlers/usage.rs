//! Usage accounting: GPU-hours per tenant, job and day, as JSON or CSV.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_domain::accounting::{GroupBy, JobUsage, report};
use allot_store::JobRepo;
use chrono::{Duration, NaiveDate};

use crate::auth::Principal;
use crate::extract::Query;
use crate::problem::Problem;
use crate::views::{UsageQuery, UsageReport, UsageRowView};
use crate::{ApiError, AppState, json};

/// The longest range one report covers.
const MAX_DAYS: i64 = 400;

/// GPU-hours (and GPU-memory and MIG-slice hours) of the tenants the caller may see, from
/// the times their jobs ran and what each held, per tenant, day or job.
#[utoipa::path(get, path = "/api/v1/usage", tag = "jobs", security(("bearer" = [])),
    params(UsageQuery),
    responses((status = 200, description = "JSON, or CSV with `format=csv`",
            content((UsageReport = "application/json"), (String = "text/csv"))),
        (status = 400, body = Problem), (status = 404, body = Problem)))]
pub async fn usage(
    state: web::Data<AppState>,
    who: Principal,
    Query(q): Query<UsageQuery>,
) -> Result<HttpResponse, ApiError> {
    let now = state.store.clock().now();
    let to = q.to.unwrap_or_else(|| now.date_naive() + Duration::days(1));
    let from = q.from.unwrap_or(to - Duration::days(7));
    if from >= to || (to - from).num_days() > MAX_DAYS {
        return Err(ApiError::invalid(
            "from",
            format!("must be before `to`, at most {MAX_DAYS} days earlier"),
        ));
    }
    let by_text = q.by.clone().unwrap_or_else(|| "tenant".to_owned());
    let by: GroupBy = by_text
        .parse()
        .map_err(|e: String| ApiError::malformed("by", e))?;
    let csv = match q.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => {
            return Err(ApiError::malformed(
                "format",
                format!("unknown format `{other}` (json or csv)"),
            ));
        }
    };
    let scope = super::jobs::listing_scope(&state, &who, q.tenant.as_deref(), "usage").await?;
    let midnight = |d: NaiveDate| d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc();
    let (start, end) = (midnight(from), midnight(to));
    let ran = state.store.jobs_run_since(&scope, start).await?;
    let inputs: Vec<JobUsage<'_>> = ran
        .iter()
        .flat_map(|(job, events)| JobUsage::of(job, job.spec.tenant.as_str(), events, now))
        .collect();
    let jobs: std::collections::HashMap<&str, &allot_domain::Job> =
        ran.iter().map(|(j, _)| (j.id.as_str(), j)).collect();
    let rows: Vec<UsageRowView> = report(&inputs, start, end, by)
        .into_iter()
        .map(|r| {
            let job = r.job_id.as_deref().and_then(|id| jobs.get(id));
            (r, job)
        })
        .map(|(r, job)| UsageRowView {
            name: job.map(|j| j.spec.name.clone()),
            state: job.map(|j| j.state),
            user: job.and_then(|j| j.submitted_by.clone()),
            elapsed_secs: job.and_then(|j| {
                let started = j.started_at?;
                Some(
                    (j.finished_at.unwrap_or(now) - started)
                        .num_seconds()
                        .max(0),
                )
            }),
            tenant: r.tenant,
            job_id: r.job_id,
            day: r.day,
            gpu_hours: r.usage.gpu_hours,
            gpu_memory_gib_hours: r.usage.gpu_memory_gib_hours,
            mig_slice_hours: r.usage.mig_slice_hours,
        })
        .collect();
    if csv {
        let mut out = String::from(
            "tenant,job_id,name,state,user,elapsed_secs,day,gpu_hours,gpu_memory_gib_hours,mig_slice_hours\n",
        );
        for r in &rows {
            out += &format!(
                "{},{},{},{},{},{},{},{:.6},{:.6},{:.6}\n",
                csv_field(&r.tenant),
                r.job_id.as_deref().unwrap_or(""),
                csv_field(r.name.as_deref().unwrap_or("")),
                r.state.map(|s| s.to_string()).unwrap_or_default(),
                csv_field(r.user.as_deref().unwrap_or("")),
                r.elapsed_secs.map(|s| s.to_string()).unwrap_or_default(),
                r.day.map(|d| d.to_string()).unwrap_or_default(),
                r.gpu_hours,
                r.gpu_memory_gib_hours,
                r.mig_slice_hours
            );
        }
        return Ok(HttpResponse::Ok()
            .content_type("text/csv; charset=utf-8")
            .body(out));
    }
    // Folded from +0.0: an empty float sum is -0.0, which prints as "-0.000".
    let total_gpu_hours = rows.iter().map(|r| r.gpu_hours).fold(0.0, |a, b| a + b);
    Ok(json(
        StatusCode::OK,
        &UsageReport {
            from,
            to,
            by: by_text,
            rows,
            total_gpu_hours,
        },
    ))
}

/// A CSV field: quoted (inner quotes doubled) when it holds a comma, quote or line break,
/// and a leading `=`, `+`, `-` or `@` made inert for spreadsheets.
fn csv_field(v: &str) -> String {
    let v = if v.starts_with(['=', '+', '-', '@']) {
        format!("'{v}")
    } else {
        v.to_owned()
    };
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v
    }
}
