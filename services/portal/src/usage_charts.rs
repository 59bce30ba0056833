//! The dashboard's charts: GPU-hours per tenant over days, weeks or months (stacked), and
//! one tenant's GPUs held against its guarantee and limit over the last week. Pure: the
//! accounting's spans in, charts out.

use allot_domain::accounting::{GroupBy, JobUsage, report};
use allot_domain::{Tenant, format_milli};
use chrono::{DateTime, Datelike, Duration, NaiveDate, Utc};

use crate::charts::{Chart, Series, stacked_bars, time_series};

/// What one column of the GPU-hours chart sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Period {
    Day,
    Week,
    Month,
}

impl Period {
    pub(crate) fn parse(s: Option<&str>) -> Result<Self, String> {
        match s.map(str::trim).unwrap_or("") {
            "" | "day" => Ok(Period::Day),
            "week" => Ok(Period::Week),
            "month" => Ok(Period::Month),
            other => Err(format!("`{other}` is not day, week or month")),
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// Each column's first day and label, oldest first: the last 14 days, 12 weeks (from
    /// Mondays) or 12 months.
    pub(crate) fn columns(self, today: NaiveDate) -> Vec<(NaiveDate, String)> {
        match self {
            Period::Day => (0..14)
                .rev()
                .map(|i| {
                    let d = today - Duration::days(i);
                    (d, d.format("%a %d").to_string())
                })
                .collect(),
            Period::Week => {
                let monday =
                    today - Duration::days(i64::from(today.weekday().num_days_from_monday()));
                (0..12)
                    .rev()
                    .map(|i| {
                        let d = monday - Duration::weeks(i);
                        (d, d.format("%d %b").to_string())
                    })
                    .collect()
            }
            Period::Month => {
                let mut months = Vec::new();
                let (mut y, mut m) = (today.year(), today.month());
                for _ in 0..12 {
                    if let Some(d) = NaiveDate::from_ymd_opt(y, m, 1) {
                        months.push((d, d.format("%b %y").to_string()));
                    }
                    (y, m) = if m == 1 { (y - 1, 12) } else { (y, m - 1) };
                }
                months.reverse();
                months
            }
        }
    }

    /// Where the chart starts: its first column's first day, at midnight UTC.
    pub(crate) fn start(self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.columns(now.date_naive())
            .first()
            .and_then(|(d, _)| d.and_hms_opt(0, 0, 0))
            .map_or(now, |t| t.and_utc())
    }
}

/// GPU-hours per tenant in each column of `period`, stacked, the largest users first.
pub(crate) fn usage_chart(period: Period, jobs: &[JobUsage<'_>], now: DateTime<Utc>) -> Chart {
    let columns = period.columns(now.date_naive());
    let rows = report(jobs, period.start(now), now, GroupBy::TenantDay);
    let mut totals: Vec<(String, f64)> = Vec::new();
    for r in &rows {
        match totals.iter_mut().find(|(t, _)| *t == r.tenant) {
            Some((_, h)) => *h += r.usage.gpu_hours,
            None => totals.push((r.tenant.clone(), r.usage.gpu_hours)),
        }
    }
    totals.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let names: Vec<String> = totals.into_iter().map(|(t, _)| t).collect();
    let mut values: Vec<(String, Vec<f64>)> = columns
        .iter()
        .map(|(_, label)| (label.clone(), vec![0.0; names.len()]))
        .collect();
    for r in &rows {
        let Some(day) = r.day else { continue };
        let Some(col) = columns.iter().rposition(|(first, _)| *first <= day) else {
            continue;
        };
        if let Some(t) = names.iter().position(|n| *n == r.tenant) {
            values[col].1[t] += r.usage.gpu_hours;
        }
    }
    let (what, x_title) = match period {
        Period::Day => ("GPU-hours per tenant and day, last 14 days", "day (UTC)"),
        Period::Week => (
            "GPU-hours per tenant and week, last 12 weeks",
            "week from Monday (UTC)",
        ),
        Period::Month => (
            "GPU-hours per tenant and month, last 12 months",
            "month (UTC)",
        ),
    };
    stacked_bars(what, "GPU-hours", x_title, &names, &values, &|v| hours(v))
}

fn hours(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `tenant`'s GPUs held over `[from, now]` (its own jobs, from their spans), against its
/// guarantee and limit as they are now (a quota's history is not kept).
pub(crate) fn allocation_chart(
    tenant: &Tenant,
    jobs: &[JobUsage<'_>],
    from: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Chart {
    let name = tenant.name.as_str();
    // +milli where a span starts, -milli where it ends.
    let mut changes: Vec<(DateTime<Utc>, i64)> = Vec::new();
    for j in jobs.iter().filter(|j| j.tenant == name) {
        let milli = i64::from(j.gpus) * i64::from(j.gpu_milli);
        for iv in &j.running {
            if iv.end <= from || iv.start >= now {
                continue;
            }
            changes.push((iv.start.max(from), milli));
            if iv.end < now {
                changes.push((iv.end, -milli));
            }
        }
    }
    changes.sort_by_key(|(t, d)| (*t, *d));
    let mut held = vec![(from, 0.0)];
    let mut milli = 0i64;
    for (t, d) in changes {
        milli += d;
        let gpus = milli.max(0) as f64 / 1000.0;
        match held.last_mut() {
            Some(last) if last.0 == t => last.1 = gpus,
            _ => held.push((t, gpus)),
        }
    }
    let guarantee = tenant.quota.guaranteed.gpu_milli as f64 / 1000.0;
    let mut series = vec![Series {
        name: "GPUs held".into(),
        points: held,
        steps: true,
        dashed: false,
    }];
    series.push(Series {
        name: format!(
            "guarantee ({})",
            format_milli(tenant.quota.guaranteed.gpu_milli)
        ),
        points: vec![(from, guarantee), (now, guarantee)],
        steps: false,
        dashed: true,
    });
    if let Some(limit) = tenant.quota.limit.gpu_milli {
        let l = limit as f64 / 1000.0;
        series.push(Series {
            name: format!("limit ({})", format_milli(limit)),
            points: vec![(from, l), (now, l)],
            steps: false,
            dashed: true,
        });
    }
    time_series(
        format!("GPUs {name} held against its guarantee, last 7 days"),
        "GPUs",
        &series,
        (from, now),
        None,
        "",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_domain::accounting::Interval;

    fn at(day: u32, hour: u32) -> DateTime<Utc> {
        NaiveDate::from_ymd_opt(2026, 11, day)
            .and_then(|d| d.and_hms_opt(hour, 0, 0))
            .expect("time")
            .and_utc()
    }

    fn usage<'a>(
        tenant: &'a str,
        gpus: u32,
        spans: &[(DateTime<Utc>, DateTime<Utc>)],
    ) -> JobUsage<'a> {
        JobUsage {
            job_id: "j",
            tenant,
            gpus,
            gpu_milli: 1000,
            gpu_memory_bytes: 0,
            mig_slices: 0,
            running: spans
                .iter()
                .map(|&(start, end)| Interval { start, end })
                .collect(),
        }
    }

    #[test]
    fn columns_cover_days_weeks_and_months() {
        let today = NaiveDate::from_ymd_opt(2026, 12, 2).expect("day"); // a Wednesday
        let days = Period::Day.columns(today);
        assert_eq!(days.len(), 14);
        assert_eq!(days.last().map(|c| c.0), Some(today));
        let weeks = Period::Week.columns(today);
        assert_eq!(
            weeks.last().map(|c| c.0),
            NaiveDate::from_ymd_opt(2026, 11, 30)
        );
        assert_eq!(weeks.len(), 12);
        let months = Period::Month.columns(today);
        assert_eq!(
            months.first().map(|c| c.0),
            NaiveDate::from_ymd_opt(2026, 1, 1)
        );
        assert_eq!(months.last().map(|c| c.1.as_str()), Some("Dec 26"));
        assert_eq!(
            Period::parse(Some("year")),
            Err("`year` is not day, week or month".into())
        );
    }

    #[test]
    fn gpu_hours_are_stacked_by_tenant_in_their_column() {
        let now = at(30, 12);
        let jobs = [
            usage("ml", 2, &[(at(29, 0), at(29, 3))]), // 6 GPU-hours on the 29th
            usage("cv", 1, &[(at(30, 0), at(30, 2))]), // 2 on the 30th
        ];
        let c = usage_chart(Period::Day, &jobs, now);
        let titles: Vec<&str> = c.bars.iter().map(|b| b.title.as_str()).collect();
        assert_eq!(titles, ["ml, Sun 29: 6.00", "cv, Mon 30: 2.00"]);
        let weekly = usage_chart(Period::Week, &jobs, now);
        // The 29th is a Sunday: its week began on the 23rd; the 30th begins the next.
        let titles: Vec<&str> = weekly.bars.iter().map(|b| b.title.as_str()).collect();
        assert_eq!(titles, ["ml, 23 Nov: 6.00", "cv, 30 Nov: 2.00"]);
    }

    #[test]
    fn held_gpus_step_with_each_span() {
        let mut t = Tenant {
            id: "t-ml".into(),
            name: allot_domain::TenantName::parse("name", "ml").expect("name"),
            parent_id: None,
            quota: allot_domain::Quota::default(),
            policy: Default::default(),
            job_limits: Default::default(),
            uid_slot: 0,
            created_at: at(1, 0),
        };
        t.quota.guaranteed.gpu_milli = 2000;
        let from = at(23, 0);
        let now = at(30, 0);
        let jobs = [
            usage("ml", 2, &[(at(20, 0), at(24, 0))]), // began before the chart
            usage("ml", 1, &[(at(25, 0), now)]),       // still running
            usage("cv", 4, &[(at(25, 0), now)]),       // another tenant's
        ];
        let c = allocation_chart(&t, &jobs, from, now);
        assert_eq!(c.lines.len(), 2, "held and the guarantee; no limit set");
        // (from,2) (24th,2) (24th,0) (25th,0) (25th,1) (now,1): six points.
        assert_eq!(
            c.lines[0].points.split(' ').count(),
            6,
            "{}",
            c.lines[0].points
        );
        assert_eq!(c.y_ticks.last().map(|t| t.label.as_str()), Some("2.0"));
        assert!(c.lines[1].dashed);
    }
}
