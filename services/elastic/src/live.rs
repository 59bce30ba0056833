//! Elastic shares in the live cluster, without IO: each scheduling pass the control plane
//! describes the fleet and each workload class's jobs, and [`plan`] says what the policy
//! asks of the pass.
//!
//! - **Entitlement.** In the window in force, a class is entitled to its share of the fleet's
//!   GPUs. Ahead of a window change (within [`LEAD`]) a class the next window gives more is
//!   entitled to it early when its demand forecast says it will need it, so capacity moves
//!   before the peak rather than after it.
//! - **Burst.** The burst class (say, inference) whose oldest pending job has waited longer
//!   than its target gets `max_extra_share` more, taken from the others; it gives it back
//!   once no job of it has waited past the target for `cooldown_minutes` (hysteresis, so it
//!   does not flap).
//! - **Taking capacity back.** A class under its entitlement with work pending gets the idle
//!   GPUs first; for the rest, preemptible jobs of classes over their entitlement are stopped
//!   (youngest and least important first, never taking a class below its own entitlement).
//!   They get a termination signal and the policy's grace period to checkpoint before they
//!   stop, and are requeued.
//! - **Holding back.** A class at or over its entitlement places nothing new while a class
//!   under its entitlement has work pending: beyond its share, a class only borrows what
//!   nobody entitled wants.
//!
//! Jobs without a workload class are outside the policy: never entitled, never stopped or
//! held back by it.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};

use crate::policy::ElasticPolicy;

/// How far ahead of a window change capacity may move toward the next window's shares.
pub const LEAD: Duration = Duration::hours(1);

/// A running job the policy may stop.
#[derive(Debug, Clone, PartialEq)]
pub struct Victim {
    pub job_id: String,
    /// GPUs it holds (shares count as fractions).
    pub gpus: f64,
    pub priority: i32,
    pub started_at: DateTime<Utc>,
}

/// One workload class's jobs in this pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClassLoad {
    /// GPUs its scheduled and running jobs hold (those being stopped aside).
    pub held: f64,
    /// GPUs its jobs being stopped (preempted already) still hold: room on its way.
    pub leaving: f64,
    /// GPUs its pending jobs ask for.
    pub pending: f64,
    /// When its longest-waiting pending job was submitted (or requeued).
    pub oldest_pending_since: Option<DateTime<Utc>>,
    /// Its preemptible running jobs.
    pub preemptible: Vec<Victim>,
}

/// What the planner remembers between passes: the burst's hysteresis.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct BurstState {
    /// Since when the burst class borrows beyond its share.
    pub active_since: Option<DateTime<Utc>>,
    /// Since when its waits have been under target (while active).
    pub calm_since: Option<DateTime<Utc>>,
}

/// What the policy asks of one pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// The window in force.
    pub window: String,
    /// GPUs each class named by the policy is entitled to now.
    pub entitlement: BTreeMap<String, f64>,
    /// Classes whose pending jobs wait this pass, and why.
    pub held_back: BTreeMap<String, String>,
    /// Running jobs to stop (with the grace period) and requeue, and why.
    pub preempt: Vec<(String, String)>,
    pub burst_active: bool,
}

/// The entitlements at `now`: window shares, moved ahead toward the next window where the
/// forecast (GPUs each class will want in the next hour) asks for it.
fn entitlements(
    policy: &ElasticPolicy,
    now: DateTime<Utc>,
    fleet: f64,
    classes: &BTreeSet<String>,
    forecast: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    let next_at = now + LEAD;
    let changes =
        policy.window_at(now).map(|w| &w.name) != policy.window_at(next_at).map(|w| &w.name);
    classes
        .iter()
        .map(|c| {
            let share = policy.share(c, now);
            let mut gpus = share * fleet;
            if changes {
                let next = policy.share(c, next_at) * fleet;
                if let Some(want) = forecast.get(c) {
                    // Early, but never past the next window's share.
                    gpus = gpus.max(want.min(next));
                }
            }
            (c.clone(), gpus)
        })
        .collect()
}

/// Plans a pass. `fleet` is the GPUs that take work (whole GPUs outside MIG, on ready
/// nodes); `classes` every class with jobs, by name; `forecast` each class's forecast demand
/// (GPUs) for the next hour, where there is one.
pub fn plan(
    policy: &ElasticPolicy,
    now: DateTime<Utc>,
    fleet: f64,
    classes: &BTreeMap<String, ClassLoad>,
    forecast: &BTreeMap<String, f64>,
    burst: &mut BurstState,
) -> Plan {
    let window = policy
        .window_at(now)
        .map(|w| w.name.clone())
        .unwrap_or_default();
    let mut names: BTreeSet<String> = classes.keys().cloned().collect();
    if let Some(w) = policy.window_at(now) {
        names.extend(w.shares.keys().cloned());
    }
    let mut entitlement = entitlements(policy, now, fleet, &names, forecast);

    // The burst, with hysteresis.
    if let Some(b) = &policy.burst {
        let load = classes.get(&b.class);
        let waited_ms = load
            .and_then(|l| l.oldest_pending_since)
            .map_or(0.0, |since| (now - since).num_milliseconds() as f64);
        let over = waited_ms > b.queue_ms;
        match (burst.active_since, over) {
            (None, true) => {
                burst.active_since = Some(now);
                burst.calm_since = None;
            }
            (Some(_), true) => burst.calm_since = None,
            (Some(_), false) => {
                let calm = *burst.calm_since.get_or_insert(now);
                if now - calm >= Duration::minutes(i64::from(b.cooldown_minutes)) {
                    burst.active_since = None;
                    burst.calm_since = None;
                }
            }
            (None, false) => {}
        }
        if burst.active_since.is_some() {
            let extra = b.max_extra_share * fleet;
            let others: f64 = entitlement
                .iter()
                .filter(|(c, _)| **c != b.class)
                .map(|(_, g)| *g)
                .sum();
            // The extra comes out of the others' entitlements, in proportion.
            if others > 0.0 {
                let taken = extra.min(others);
                for (c, g) in entitlement.iter_mut() {
                    if *c != b.class {
                        *g -= taken * *g / others;
                    }
                }
                *entitlement.entry(b.class.clone()).or_default() += taken;
            }
        }
    }

    let load_of = |c: &str| classes.get(c).cloned().unwrap_or_default();
    let entitled = |c: &str| entitlement.get(c).copied().unwrap_or(0.0);
    let held_total: f64 = classes.values().map(|l| l.held + l.leaving).sum();
    // Idle GPUs, and those freeing as preempted jobs stop: both go to the short first.
    let mut idle = (fleet - held_total).max(0.0) + classes.values().map(|l| l.leaving).sum::<f64>();
    // Classes under their entitlement that want more, most wanting first.
    let mut short: Vec<(String, f64)> = names
        .iter()
        .filter_map(|c| {
            let l = load_of(c);
            let deficit = (entitled(c) - l.held).min(l.pending);
            (deficit > 1e-9).then(|| (c.clone(), deficit))
        })
        .collect();
    short.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));

    let mut held_back = BTreeMap::new();
    if !short.is_empty() {
        for c in &names {
            let l = load_of(c);
            if l.pending > 0.0 && l.held + 1e-9 >= entitled(c) {
                let waiting: Vec<&str> = short.iter().map(|(s, _)| s.as_str()).collect();
                held_back.insert(
                    c.clone(),
                    format!(
                        "elastic window `{window}`: {c} holds {:.1} of its {:.1} GPUs; {} {} entitled to the rest and waiting",
                        l.held,
                        entitled(c),
                        waiting.join(", "),
                        if waiting.len() == 1 { "is" } else { "are" },
                    ),
                );
            }
        }
    }

    // What each over-entitled class can give back.
    let mut spare: BTreeMap<String, f64> = names
        .iter()
        .map(|c| (c.clone(), (load_of(c).held - entitled(c)).max(0.0)))
        .collect();
    let mut preempt = Vec::new();
    for (class, deficit) in &short {
        let mut need = deficit - idle.min(*deficit);
        idle = (idle - deficit).max(0.0);
        for donor in &names {
            if need <= 1e-9 {
                break;
            }
            if donor == class {
                continue;
            }
            let mut victims = load_of(donor).preemptible;
            // Least important first, then the youngest (it loses the least work).
            victims.sort_by(|a, b| {
                a.priority
                    .cmp(&b.priority)
                    .then(b.started_at.cmp(&a.started_at))
                    .then(a.job_id.cmp(&b.job_id))
            });
            for v in victims {
                let can_give = spare.get(donor).copied().unwrap_or(0.0);
                if need <= 1e-9 || v.gpus > can_give + 1e-9 {
                    continue;
                }
                if preempt.iter().any(|(id, _)| *id == v.job_id) {
                    continue;
                }
                need -= v.gpus;
                if let Some(s) = spare.get_mut(donor) {
                    *s -= v.gpus;
                }
                preempt.push((
                    v.job_id.clone(),
                    format!(
                        "elastic window `{window}`: {class} is entitled to {:.1} GPUs and holds {:.1}; {donor} holds {:.1}, over its {:.1}",
                        entitled(class),
                        load_of(class).held,
                        load_of(donor).held,
                        entitled(donor),
                    ),
                ));
            }
        }
    }
    Plan {
        window,
        entitlement,
        held_back,
        preempt,
        burst_active: burst.active_since.is_some(),
    }
}

/// Hourly demand per class, kept for forecasting: the GPUs each class held or asked for,
/// averaged over each hour.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DemandHistory {
    /// Hour (Unix hours) → class → (sum, count).
    hours: BTreeMap<i64, BTreeMap<String, (f64, u32)>>,
    /// Past forecasts: hour → class → forecast, to score against what came. The one for
    /// the next hour is also the answer for the rest of this hour: it uses complete hours
    /// only, so it does not change until the hour does.
    forecasts: BTreeMap<i64, BTreeMap<String, f64>>,
}

/// Hours of history kept (two weeks).
const KEEP_HOURS: i64 = 24 * 14;

impl DemandHistory {
    /// Records each class's demand (held + pending GPUs) at `at`.
    pub fn record(&mut self, at: DateTime<Utc>, demand: &BTreeMap<String, f64>) {
        let hour = at.timestamp().div_euclid(3600);
        let slot = self.hours.entry(hour).or_default();
        for (c, d) in demand {
            let e = slot.entry(c.clone()).or_default();
            e.0 += d;
            e.1 += 1;
        }
        self.hours.retain(|h, _| *h > hour - KEEP_HOURS);
        self.forecasts.retain(|h, _| *h > hour - KEEP_HOURS);
    }

    fn series(&self, class: &str, until_hour: i64) -> Vec<f64> {
        let Some(first) = self.hours.keys().next().copied() else {
            return Vec::new();
        };
        (first..until_hour)
            .map(|h| {
                self.hours
                    .get(&h)
                    .and_then(|s| s.get(class))
                    .map_or(0.0, |(sum, n)| sum / f64::from((*n).max(1)))
            })
            .collect()
    }

    /// Each class's forecast demand for the next hour, from a Holt-Winters model with a
    /// daily cycle over the complete hours so far (two days at least); remembered, to be
    /// scored once the hour has passed.
    pub fn forecast(&mut self, now: DateTime<Utc>) -> BTreeMap<String, f64> {
        let hour = now.timestamp().div_euclid(3600);
        if let Some(made) = self.forecasts.get(&(hour + 1)) {
            return made.clone();
        }
        let classes: BTreeSet<String> = self
            .hours
            .values()
            .flat_map(|s| s.keys().cloned())
            .collect();
        let mut out = BTreeMap::new();
        for c in classes {
            let series = self.series(&c, hour);
            let model =
                crate::forecast::HoltWinters::fit(&series, 24, crate::forecast::DEFAULT_SMOOTHING);
            if let Some(m) = model {
                // The current hour is under way: the one after it is next.
                out.insert(c, m.forecast(2));
            }
        }
        self.forecasts.insert(hour + 1, out.clone());
        out
    }

    /// Mean absolute percentage error of the forecasts made so far, per class, against the
    /// demand of the hours they were for.
    pub fn forecast_error(&self, now: DateTime<Utc>) -> BTreeMap<String, f64> {
        let hour = now.timestamp().div_euclid(3600);
        let mut pairs: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for (h, forecast) in self.forecasts.range(..hour) {
            for (c, f) in forecast {
                if let Some((sum, n)) = self.hours.get(h).and_then(|s| s.get(c)) {
                    pairs
                        .entry(c.clone())
                        .or_default()
                        .push((*f, sum / f64::from((*n).max(1))));
                }
            }
        }
        pairs
            .into_iter()
            .map(|(c, p)| (c, crate::forecast::mape(&p)))
            .collect()
    }
}

#[cfg(test)]
mod tests;
