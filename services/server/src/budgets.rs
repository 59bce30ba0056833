//! Monthly GPU-hour budgets: which tenants have spent theirs this calendar month (UTC), from
//! what their jobs ran (see `allot_domain::accounting`).

use std::collections::HashMap;

use allot_domain::Tenant;
use allot_domain::accounting::{GroupBy, JobUsage, over_budget, report};
use allot_store::{JobRepo, Store, StoreError, TenantScope};
use chrono::{DateTime, Datelike, Utc};

/// Tenants (by id) whose budget, or an ancestor's, is spent this month, with why. Reads
/// nothing when no tenant has a budget.
pub async fn spent(
    store: &Store,
    tenants: &[Tenant],
    now: DateTime<Utc>,
) -> Result<HashMap<String, String>, StoreError> {
    if tenants
        .iter()
        .all(|t| t.quota.gpu_hour_budget_milli.is_none())
    {
        return Ok(HashMap::new());
    }
    let month_start = now
        .date_naive()
        .with_day(1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(now, |d| d.and_utc());
    let ran = store.jobs_run_since(&TenantScope::All, month_start).await?;
    let inputs: Vec<JobUsage<'_>> = ran
        .iter()
        .flat_map(|(job, events)| JobUsage::of(job, &job.tenant_id, events, now))
        .collect();
    // Grouped by tenant id (the `tenant` given above).
    let used: HashMap<String, f64> = report(&inputs, month_start, now, GroupBy::Tenant)
        .into_iter()
        .map(|r| (r.tenant, r.usage.gpu_hours))
        .collect();
    Ok(over_budget(
        tenants,
        &used,
        &now.format("%B %Y").to_string(),
    ))
}
