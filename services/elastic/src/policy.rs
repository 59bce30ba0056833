//! The elastic share policy: per time window (days of the week, hours, in a time zone), the
//! share of the fleet each workload class is guaranteed; a burst rule; the preemption grace.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, NaiveTime, Timelike, Utc, Weekday};
use chrono_tz::Tz;
use serde::Deserialize;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("elastic policy: {0}")]
    Parse(String),
    #[error("elastic policy: {field}: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    time_zone: String,
    window: Vec<RawWindow>,
    burst: Option<Burst>,
    preemption: Option<Preemption>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    name: String,
    days: Vec<String>,
    from: String,
    to: String,
    shares: BTreeMap<String, f64>,
}

/// Borrowing beyond the share while a class's queue wait is over target.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Burst {
    pub class: String,
    pub queue_ms: f64,
    pub max_extra_share: f64,
    pub cooldown_minutes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preemption {
    pub grace_seconds: u32,
}

/// A window: when it applies and the shares it sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub name: String,
    days: Vec<Weekday>,
    from: NaiveTime,
    to: NaiveTime,
    pub shares: BTreeMap<String, f64>,
}

impl Window {
    /// Whether the window covers this local weekday and time (a window whose `to` is not
    /// after its `from` runs past midnight into the next day).
    fn covers(&self, day: Weekday, time: NaiveTime) -> bool {
        if self.from < self.to {
            self.days.contains(&day) && time >= self.from && time < self.to
        } else {
            (self.days.contains(&day) && time >= self.from)
                || (self.days.contains(&day.pred()) && time < self.to)
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ElasticPolicy {
    pub time_zone: Tz,
    pub windows: Vec<Window>,
    pub burst: Option<Burst>,
    pub preemption: Preemption,
}

const SHIPPED: &str = include_str!("../../../policies/elastic.toml");

fn weekday(s: &str) -> Option<Weekday> {
    Some(match s.to_ascii_lowercase().as_str() {
        "mon" | "monday" => Weekday::Mon,
        "tue" | "tuesday" => Weekday::Tue,
        "wed" | "wednesday" => Weekday::Wed,
        "thu" | "thursday" => Weekday::Thu,
        "fri" | "friday" => Weekday::Fri,
        "sat" | "saturday" => Weekday::Sat,
        "sun" | "sunday" => Weekday::Sun,
        _ => return None,
    })
}

impl ElasticPolicy {
    /// The policy shipped in `policies/elastic.toml`.
    pub fn builtin() -> Result<Self, PolicyError> {
        Self::parse(SHIPPED)
    }

    /// Parses and validates: known days and times, shares between 0 and 1 summing to at
    /// most 1, and windows that cover every quarter hour of the week exactly once.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let raw: RawPolicy = toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
        let time_zone: Tz = raw.time_zone.parse().map_err(|_| {
            invalid(
                "time_zone",
                format!("`{}` is not an IANA time zone", raw.time_zone),
            )
        })?;
        let mut windows = Vec::new();
        for (i, w) in raw.window.into_iter().enumerate() {
            let field = |f: &str| format!("window[{i}].{f}");
            let days = w
                .days
                .iter()
                .map(|d| {
                    weekday(d).ok_or_else(|| {
                        invalid(field("days"), format!("`{d}` is not a day (mon..sun)"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if days.is_empty() {
                return Err(invalid(field("days"), "must name at least one day"));
            }
            let time = |f: &str, v: &str| {
                NaiveTime::parse_from_str(v, "%H:%M")
                    .map_err(|_| invalid(field(f), format!("`{v}` is not HH:MM")))
            };
            let (from, to) = (time("from", &w.from)?, time("to", &w.to)?);
            let mut total = 0.0;
            for (class, share) in &w.shares {
                if !(0.0..=1.0).contains(share) {
                    return Err(invalid(
                        field(&format!("shares.{class}")),
                        "must be from 0 to 1",
                    ));
                }
                total += share;
            }
            if total > 1.0 + 1e-9 {
                return Err(invalid(
                    field("shares"),
                    format!("add up to {total:.2}, more than 1"),
                ));
            }
            windows.push(Window {
                name: w.name,
                days,
                from,
                to,
                shares: w.shares,
            });
        }
        if let Some(b) = &raw.burst {
            if !(0.0..=1.0).contains(&b.max_extra_share) {
                return Err(invalid("burst.max_extra_share", "must be from 0 to 1"));
            }
            if b.queue_ms.is_nan() || b.queue_ms <= 0.0 {
                return Err(invalid("burst.queue_ms", "must be positive"));
            }
        }
        let policy = Self {
            time_zone,
            windows,
            burst: raw.burst,
            preemption: raw.preemption.unwrap_or(Preemption { grace_seconds: 30 }),
        };
        // Every quarter hour of the week in exactly one window.
        for day in [
            Weekday::Mon,
            Weekday::Tue,
            Weekday::Wed,
            Weekday::Thu,
            Weekday::Fri,
            Weekday::Sat,
            Weekday::Sun,
        ] {
            for q in 0..96u32 {
                let t = NaiveTime::from_hms_opt(q / 4, (q % 4) * 15, 0).unwrap_or_default();
                let n = policy.windows.iter().filter(|w| w.covers(day, t)).count();
                if n != 1 {
                    return Err(invalid(
                        "window",
                        format!(
                            "{day} {} is in {n} windows: windows must cover the week exactly once",
                            t.format("%H:%M")
                        ),
                    ));
                }
            }
        }
        Ok(policy)
    }

    /// The window in force at `at`.
    pub fn window_at(&self, at: DateTime<Utc>) -> Option<&Window> {
        let local = at.with_timezone(&self.time_zone);
        let time = NaiveTime::from_hms_opt(local.hour(), local.minute(), local.second())?;
        self.windows
            .iter()
            .find(|w| w.covers(local.weekday(), time))
    }

    /// The share of the fleet `class` is guaranteed at `at` (0 when no window names it).
    pub fn share(&self, class: &str, at: DateTime<Utc>) -> f64 {
        self.window_at(at)
            .and_then(|w| w.shares.get(class).copied())
            .unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("time")
            .with_timezone(&Utc)
    }

    #[test]
    fn the_shipped_policy_validates_and_flips_at_night() {
        let p = ElasticPolicy::builtin().expect("valid");
        // Monday 2026-11-30, Berlin is UTC+1 in winter.
        assert_eq!(p.share("inference", at("2026-11-30T10:00:00Z")), 0.8);
        assert_eq!(p.share("training", at("2026-11-30T10:00:00Z")), 0.2);
        assert_eq!(p.share("inference", at("2026-11-30T19:30:00Z")), 0.2);
        // Friday night runs into Saturday morning.
        assert_eq!(p.share("inference", at("2026-12-05T05:00:00Z")), 0.2);
        assert_eq!(p.share("inference", at("2026-12-05T12:00:00Z")), 0.5);
        assert_eq!(p.share("nobody", at("2026-12-05T12:00:00Z")), 0.0);
        assert_eq!(p.preemption.grace_seconds, 30);
    }

    #[test]
    fn gaps_overlaps_and_bad_values_are_refused_naming_the_field() {
        let one = |days: &str, from: &str, to: &str, shares: &str| {
            format!(
                "time_zone = \"UTC\"\n[[window]]\nname = \"w\"\ndays = {days}\nfrom = \"{from}\"\nto = \"{to}\"\nshares = {shares}\n"
            )
        };
        let week = r#"["mon","tue","wed","thu","fri","sat","sun"]"#;
        assert!(ElasticPolicy::parse(&one(week, "00:00", "00:00", "{ a = 1.0 }")).is_ok());
        let field = |text: &str| match ElasticPolicy::parse(text) {
            Err(PolicyError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(&one(week, "08:00", "20:00", "{ a = 1.0 }")), "window");
        assert_eq!(
            field(&one(r#"["mon","funday"]"#, "00:00", "00:00", "{}")),
            "window[0].days"
        );
        assert_eq!(field(&one(week, "8am", "00:00", "{}")), "window[0].from");
        assert_eq!(
            field(&one(week, "00:00", "00:00", "{ a = 1.5 }")),
            "window[0].shares.a"
        );
        assert_eq!(
            field(&one(week, "00:00", "00:00", "{ a = 0.7, b = 0.7 }")),
            "window[0].shares"
        );
        let twice = format!(
            "{}[[window]]\nname = \"again\"\ndays = {week}\nfrom = \"00:00\"\nto = \"00:00\"\nshares = {{}}\n",
            one(week, "00:00", "00:00", "{}")
        );
        assert_eq!(field(&twice), "window");
        assert_eq!(
            field(&one(week, "00:00", "00:00", "{}").replace("UTC", "Mars/Olympus")),
            "time_zone"
        );
        assert!(matches!(
            ElasticPolicy::parse("nonsense ="),
            Err(PolicyError::Parse(_))
        ));
    }
}
