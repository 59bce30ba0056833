//! Usage accounting: GPU-hours (and GPU-memory-hours, MIG-slice-hours) per tenant, job and
//! UTC day, from the times each job ran (its state history) and what its placement held.
//!
//! A job accrues while it is `running`: from entering that state to leaving it, or to now.
//! A GPU-hour is one whole GPU for an hour: a job holding `gpu_milli` of each of `gpus` GPUs
//! accrues `gpus * gpu_milli / 1000` per hour; a MIG job holds its instance's compute
//! slices out of seven.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;

use crate::job::{Job, JobEvent, JobState, Share};

/// A span of time a job ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// The spans a job ran, from its state history (oldest first); one still running ends `now`.
pub fn running_intervals(events: &[JobEvent], now: DateTime<Utc>) -> Vec<Interval> {
    let mut out = Vec::new();
    let mut since = None;
    for e in events {
        if e.to == JobState::Running {
            since.get_or_insert(e.at);
        } else if let Some(start) = since.take() {
            out.push(Interval { start, end: e.at });
        }
    }
    if let Some(start) = since {
        out.push(Interval { start, end: now });
    }
    out
}

/// The spans a job ran, each with the share it held then: split where a placement or a
/// resize changed the share. `fallback` is the share for history that records none.
pub fn running_by_share(
    events: &[JobEvent],
    now: DateTime<Utc>,
    fallback: Share,
) -> Vec<(Share, Interval)> {
    let mut share = events.iter().find_map(|e| e.share).unwrap_or(fallback);
    let mut out = Vec::new();
    let mut since: Option<DateTime<Utc>> = None;
    for e in events {
        if let Some(next) = e.share.filter(|s| *s != share) {
            if let Some(start) = since.replace(e.at) {
                out.push((share, Interval { start, end: e.at }));
            }
            share = next;
        }
        if e.to == JobState::Running {
            since.get_or_insert(e.at);
        } else if let Some(start) = since.take() {
            out.push((share, Interval { start, end: e.at }));
        }
    }
    if let Some(start) = since {
        out.push((share, Interval { start, end: now }));
    }
    out
}

impl<'a> JobUsage<'a> {
    /// What a stored job held while it ran, from its history: one entry per share it held
    /// (`report` adds them up under the job), named by `tenant`.
    pub fn of(job: &'a Job, tenant: &'a str, events: &[JobEvent], now: DateTime<Utc>) -> Vec<Self> {
        let fallback = job.share();
        let mig_slices = job
            .spec
            .mig_profile
            .as_deref()
            .and_then(crate::mig::profile_named)
            .map_or(0, |p| p.compute_slices);
        let mut by_share: Vec<(Share, Vec<Interval>)> = Vec::new();
        for (share, iv) in running_by_share(events, now, fallback) {
            match by_share.iter_mut().find(|(s, _)| *s == share) {
                Some((_, ivs)) => ivs.push(iv),
                None => by_share.push((share, vec![iv])),
            }
        }
        by_share
            .into_iter()
            .map(|(share, running)| JobUsage {
                // A gang's replicas count as the gang, the job its submitter sees.
                job_id: job.replica.as_ref().map_or(&job.id, |r| &r.gang_id),
                tenant,
                gpus: job.spec.gpus,
                gpu_milli: share.gpu_milli,
                gpu_memory_bytes: share.gpu_memory_bytes,
                mig_slices,
                running,
            })
            .collect()
    }
}

/// What one job held while it ran.
#[derive(Debug, Clone)]
pub struct JobUsage<'a> {
    pub job_id: &'a str,
    pub tenant: &'a str,
    pub gpus: u32,
    /// The share of each GPU held, in milli.
    pub gpu_milli: u32,
    /// GPU memory asked for on each GPU (0: not asked).
    pub gpu_memory_bytes: u64,
    /// Compute slices of its MIG instance (0: not a MIG job).
    pub mig_slices: u8,
    pub running: Vec<Interval>,
}

/// Usage of one job (or a group of them) on one day (or over the whole range).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Usage {
    pub gpu_hours: f64,
    pub gpu_memory_gib_hours: f64,
    pub mig_slice_hours: f64,
}

impl Usage {
    fn add(&mut self, other: &Usage) {
        self.gpu_hours += other.gpu_hours;
        self.gpu_memory_gib_hours += other.gpu_memory_gib_hours;
        self.mig_slice_hours += other.mig_slice_hours;
    }
}

/// How rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Tenant,
    TenantDay,
    Job,
    JobDay,
}

impl std::str::FromStr for GroupBy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "tenant" => GroupBy::Tenant,
            "tenant,day" | "day" => GroupBy::TenantDay,
            "job" => GroupBy::Job,
            "job,day" => GroupBy::JobDay,
            _ => {
                return Err(format!(
                    "unknown grouping `{s}` (tenant, day, job or job,day)"
                ));
            }
        })
    }
}

/// One row of a usage report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageRow {
    pub tenant: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<NaiveDate>,
    #[serde(flatten)]
    pub usage: Usage,
}

/// Usage within `[from, to)`, split at UTC midnights and grouped `by`; rows in order of
/// tenant, then job, then day.
pub fn report(
    jobs: &[JobUsage<'_>],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    by: GroupBy,
) -> Vec<UsageRow> {
    let mut rows: BTreeMap<(String, Option<String>, Option<NaiveDate>), Usage> = BTreeMap::new();
    for job in jobs {
        let gpus = f64::from(job.gpus) * f64::from(job.gpu_milli) / 1000.0;
        let memory_gib = f64::from(job.gpus) * job.gpu_memory_bytes as f64 / f64::from(1u32 << 30);
        for iv in &job.running {
            let mut start = iv.start.max(from);
            let end = iv.end.min(to);
            while start < end {
                let day = start.date_naive();
                let midnight = day
                    .succ_opt()
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
                    .map_or(end, |d| d.and_utc());
                let stop = end.min(midnight);
                let hours = (stop - start).num_milliseconds() as f64 / 3_600_000.0;
                let key = (
                    job.tenant.to_owned(),
                    matches!(by, GroupBy::Job | GroupBy::JobDay).then(|| job.job_id.to_owned()),
                    matches!(by, GroupBy::TenantDay | GroupBy::JobDay).then_some(day),
                );
                rows.entry(key).or_default().add(&Usage {
                    gpu_hours: gpus * hours,
                    gpu_memory_gib_hours: memory_gib * hours,
                    mig_slice_hours: f64::from(job.mig_slices) * hours,
                });
                start = stop;
            }
        }
    }
    rows.into_iter()
        .map(|((tenant, job_id, day), usage)| UsageRow {
            tenant,
            job_id,
            day,
            usage,
        })
        .collect()
}

/// Tenants whose monthly GPU-hour budget is spent, by id, each with why: a tenant is over
/// when it, or any tenant above it, has used (with all the tenants below it) at least its
/// budget. `used` is GPU-hours per tenant id, its own jobs only.
pub fn over_budget(
    tenants: &[crate::Tenant],
    used: &std::collections::HashMap<String, f64>,
    month: &str,
) -> std::collections::HashMap<String, String> {
    let parent: std::collections::HashMap<&str, Option<&str>> = tenants
        .iter()
        .map(|t| (t.id.as_str(), t.parent_id.as_deref()))
        .collect();
    // Each tenant's usage counts for it and every tenant above it.
    let mut subtree: std::collections::HashMap<&str, f64> = std::collections::HashMap::new();
    for t in tenants {
        let own = used.get(&t.id).copied().unwrap_or(0.0);
        let mut at = Some(t.id.as_str());
        let mut seen = 0;
        while let Some(id) = at {
            *subtree.entry(id).or_default() += own;
            at = parent.get(id).copied().flatten();
            seen += 1;
            if seen > tenants.len() {
                break;
            }
        }
    }
    let spent: std::collections::HashMap<&str, String> = tenants
        .iter()
        .filter_map(|t| {
            let budget = t.quota.gpu_hour_budget_milli? as f64 / 1000.0;
            let use_ = subtree.get(t.id.as_str()).copied().unwrap_or(0.0);
            (use_ >= budget).then(|| {
                (
                    t.id.as_str(),
                    format!(
                        "tenant {} used {use_:.3} of its {budget:.3} GPU-hours for {month}",
                        t.name
                    ),
                )
            })
        })
        .collect();
    let mut out = std::collections::HashMap::new();
    for t in tenants {
        let mut at = Some(t.id.as_str());
        let mut seen = 0;
        while let Some(id) = at {
            if let Some(why) = spent.get(id) {
                out.insert(t.id.clone(), why.clone());
                break;
            }
            at = parent.get(id).copied().flatten();
            seen += 1;
            if seen > tenants.len() {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("time")
            .with_timezone(&Utc)
    }

    fn ev(from: Option<JobState>, to: JobState, at: &str) -> JobEvent {
        JobEvent {
            from,
            to,
            at: t(at),
            message: None,
            share: None,
        }
    }

    #[test]
    fn each_run_counts_from_start_to_stop_and_a_requeue_does_not() {
        use JobState::*;
        let events = [
            ev(None, Pending, "2026-11-30T09:00:00Z"),
            ev(Some(Pending), Scheduled, "2026-11-30T09:01:00Z"),
            ev(Some(Scheduled), Running, "2026-11-30T09:02:00Z"),
            // Preempted and requeued: not running while pending again.
            ev(Some(Running), Pending, "2026-11-30T10:02:00Z"),
            ev(Some(Pending), Scheduled, "2026-11-30T11:00:00Z"),
            ev(Some(Scheduled), Running, "2026-11-30T11:00:30Z"),
        ];
        let now = t("2026-11-30T12:00:30Z");
        assert_eq!(
            running_intervals(&events, now),
            vec![
                Interval {
                    start: t("2026-11-30T09:02:00Z"),
                    end: t("2026-11-30T10:02:00Z")
                },
                Interval {
                    start: t("2026-11-30T11:00:30Z"),
                    end: now
                },
            ]
        );
    }

    #[test]
    fn a_resize_splits_the_run_at_the_new_share() {
        let ev = |to: JobState, at: &str, share: Option<(u32, u64)>| JobEvent {
            from: None,
            to,
            at: t(at),
            message: None,
            share: share.map(|(gpu_milli, gpu_memory_bytes)| Share {
                gpu_milli,
                gpu_memory_bytes,
            }),
        };
        let events = [
            ev(JobState::Pending, "2026-11-30T09:00:00Z", None),
            ev(JobState::Scheduled, "2026-11-30T09:00:00Z", Some((500, 10))),
            ev(JobState::Running, "2026-11-30T09:00:00Z", None),
            // Resized while running: from 11:00 it holds a fifth.
            ev(JobState::Running, "2026-11-30T11:00:00Z", Some((200, 4))),
            ev(JobState::Succeeded, "2026-11-30T12:00:00Z", None),
        ];
        let fallback = Share {
            gpu_milli: 1000,
            gpu_memory_bytes: 0,
        };
        let parts = running_by_share(&events, t("2026-11-30T13:00:00Z"), fallback);
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert_eq!(parts[0].0.gpu_milli, 500);
        assert_eq!(parts[0].1.end, t("2026-11-30T11:00:00Z"));
        assert_eq!(
            (parts[1].0.gpu_milli, parts[1].1.start),
            (200, t("2026-11-30T11:00:00Z"))
        );
        // 2 h at a half and 1 h at a fifth: 1.2 GPU-hours.
        let usage: Vec<JobUsage<'_>> = parts
            .iter()
            .map(|(s, iv)| JobUsage {
                job_id: "j",
                tenant: "a",
                gpus: 1,
                gpu_milli: s.gpu_milli,
                gpu_memory_bytes: s.gpu_memory_bytes,
                mig_slices: 0,
                running: vec![*iv],
            })
            .collect();
        let rows = report(
            &usage,
            t("2026-11-30T00:00:00Z"),
            t("2026-12-01T00:00:00Z"),
            GroupBy::Job,
        );
        assert_eq!(rows.len(), 1);
        assert!((rows[0].usage.gpu_hours - 1.2).abs() < 1e-9, "{rows:?}");
    }

    #[test]
    fn usage_splits_at_midnight_and_weighs_shares_memory_and_mig_slices() {
        let shared = JobUsage {
            job_id: "j1",
            tenant: "a",
            gpus: 1,
            gpu_milli: 250,
            gpu_memory_bytes: 20 << 30,
            mig_slices: 0,
            // 22:00 to 02:00: two hours each side of midnight.
            running: vec![Interval {
                start: t("2026-11-29T22:00:00Z"),
                end: t("2026-11-30T02:00:00Z"),
            }],
        };
        let whole = JobUsage {
            job_id: "j2",
            tenant: "a",
            gpus: 8,
            gpu_milli: 1000,
            gpu_memory_bytes: 0,
            mig_slices: 0,
            running: vec![Interval {
                start: t("2026-11-30T00:00:00Z"),
                end: t("2026-11-30T00:30:00Z"),
            }],
        };
        let mig = JobUsage {
            job_id: "j3",
            tenant: "b",
            gpus: 1,
            gpu_milli: 428,
            gpu_memory_bytes: 0,
            mig_slices: 3,
            running: vec![Interval {
                start: t("2026-11-30T01:00:00Z"),
                end: t("2026-11-30T03:00:00Z"),
            }],
        };
        let jobs = [shared, whole, mig];
        let (from, to) = (t("2026-11-29T00:00:00Z"), t("2026-12-01T00:00:00Z"));
        let by_day = report(&jobs, from, to, GroupBy::TenantDay);
        let day = |d: &str| NaiveDate::parse_from_str(d, "%Y-%m-%d").ok();
        let a29 = by_day
            .iter()
            .find(|r| r.tenant == "a" && r.day == day("2026-11-29"))
            .expect("a on the 29th");
        assert!((a29.usage.gpu_hours - 0.5).abs() < 1e-9, "{a29:?}");
        assert!((a29.usage.gpu_memory_gib_hours - 40.0).abs() < 1e-9);
        let a30 = by_day
            .iter()
            .find(|r| r.tenant == "a" && r.day == day("2026-11-30"))
            .expect("a on the 30th");
        assert!((a30.usage.gpu_hours - (0.5 + 4.0)).abs() < 1e-9, "{a30:?}");
        let b = by_day.iter().find(|r| r.tenant == "b").expect("b");
        assert!((b.usage.mig_slice_hours - 6.0).abs() < 1e-9);
        assert!((b.usage.gpu_hours - 0.856).abs() < 1e-9);
        // Clipped to the range; grouped by tenant only.
        let clipped = report(
            &jobs,
            t("2026-11-30T00:00:00Z"),
            t("2026-11-30T01:00:00Z"),
            GroupBy::Tenant,
        );
        assert_eq!(clipped.len(), 1, "{clipped:?}");
        assert!((clipped[0].usage.gpu_hours - (0.25 + 4.0)).abs() < 1e-9);
        let per_job = report(&jobs, from, to, GroupBy::Job);
        assert_eq!(
            per_job
                .iter()
                .map(|r| r.job_id.as_deref())
                .collect::<Vec<_>>(),
            [Some("j1"), Some("j2"), Some("j3")]
        );
        assert_eq!("job,day".parse::<GroupBy>(), Ok(GroupBy::JobDay));
        assert!("week".parse::<GroupBy>().is_err());
    }

    #[test]
    fn a_spent_budget_holds_back_the_tenant_and_everything_below_it() {
        let tenant = |id: &str, parent: Option<&str>, budget: Option<u64>| crate::Tenant {
            id: id.into(),
            name: crate::TenantName::parse("name", id).expect("name"),
            parent_id: parent.map(Into::into),
            quota: crate::Quota {
                gpu_hour_budget_milli: budget,
                ..crate::Quota::default()
            },
            policy: Default::default(),
            job_limits: Default::default(),
            uid_slot: 0,
            created_at: t("2026-11-01T00:00:00Z"),
        };
        let tenants = [
            tenant("org", None, Some(10_000)),
            tenant("team-a", Some("org"), None),
            tenant("team-b", Some("org"), Some(1_000)),
            tenant("other", None, None),
        ];
        // The teams together spend the org's 10 GPU-hours; team-b its own 1 too.
        let used = [
            ("team-a".to_owned(), 8.0),
            ("team-b".to_owned(), 2.5),
            ("other".to_owned(), 99.0),
        ]
        .into_iter()
        .collect();
        let over = over_budget(&tenants, &used, "November 2026");
        assert!(
            over["org"].contains("used 10.500 of its 10.000"),
            "{over:?}"
        );
        assert!(over.contains_key("team-a"));
        assert!(
            over["team-b"].contains("team-b"),
            "its own budget is named first"
        );
        assert!(!over.contains_key("other"), "no budget, no limit");
        let light = [("team-a".to_owned(), 1.0)].into_iter().collect();
        assert!(over_budget(&tenants, &light, "November 2026").is_empty());
    }
}
