//! The fleet simulation behind `allot bench elastic`: a diurnal, bursty inference load
//! (requests served by replicas that each need a fraction of a GPU) beside a backlog of
//! preemptible training, run three ways on the same seeded load:
//!
//! - `exclusive`: every inference replica holds a whole GPU; the replicas are sized once for
//!   the daily peak; training gets the rest.
//! - `static`: the same replicas, packed `replicas_per_gpu` to a GPU.
//! - `elastic`: packed replicas whose count follows demand: the observed request rate and a
//!   Holt-Winters forecast of the next half hour, with headroom, shrinking only after demand
//!   has stayed lower for a while; GPUs come from training by preemption (each preempted
//!   training GPU gets the policy's grace period and loses, on average, half a checkpoint
//!   interval of work) within the policy's window share, plus the burst share while the
//!   queue wait is over target.
//!
//! Time moves in `step_secs` steps. Queue waits come from M/M/c per step, with a backlog
//! carried across steps when the replicas cannot keep up (see [`crate::queue`]); their
//! percentiles weigh each step by its requests. Utilization counts what GPUs compute:
//! training at `training_busy`, and a busy replica at its fraction of a GPU.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Duration, Timelike, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::forecast::{DEFAULT_SMOOTHING, HoltWinters, mape};
use crate::policy::ElasticPolicy;
use crate::queue::{Waits, quantile};

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub hours: u32,
    pub seed: u64,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub step_secs: u32,
    /// How many replicas share one GPU when packed (each computes on 1/this of it).
    pub replicas_per_gpu: u32,
    /// Mean time a replica takes per request.
    pub service_ms: f64,
    /// The request rate at the daily peak (bursts go above it).
    pub peak_rps: f64,
    /// Replicas are sized to run at most this busy.
    pub target_busy: f64,
    pub slo_ms: f64,
    /// How long a new replica takes to start serving.
    pub replica_start_secs: u32,
    pub checkpoint_minutes: u32,
    /// How busy a GPU running training is.
    pub training_busy: f64,
    /// Bursts a day, on average.
    pub bursts_per_day: f64,
    /// Days of load history the forecaster is fitted on before the run.
    pub history_days: u32,
    /// When the run starts (a Monday, so the week's windows all appear).
    pub start: DateTime<Utc>,
}

impl SimConfig {
    pub fn new(hours: u32, seed: u64) -> Self {
        Self {
            hours,
            seed,
            nodes: 16,
            gpus_per_node: 8,
            step_secs: 10,
            replicas_per_gpu: 8,
            service_ms: 25.0,
            peak_rps: 1920.0,
            target_busy: 0.55,
            slo_ms: 100.0,
            replica_start_secs: 20,
            checkpoint_minutes: 30,
            training_busy: 0.95,
            bursts_per_day: 4.0,
            history_days: 2,
            start: DateTime::from_timestamp(1_796_601_600, 0).unwrap_or_default(), // Mon 2026-12-07 00:00 UTC
        }
    }

    fn gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }

    fn mu(&self) -> f64 {
        1000.0 / self.service_ms
    }

    /// Replicas that serve `rps` at the target busyness.
    fn replicas_for(&self, rps: f64) -> u32 {
        (rps / (self.mu() * self.target_busy)).ceil().max(1.0) as u32
    }
}

/// One mode's results.
#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    pub mean_gpu_utilization: f64,
    pub inference_tasks_per_gpu: f64,
    pub p99_queue_ms: f64,
    pub p999_queue_ms: f64,
    /// Training work done (GPU-hours), net of work lost to preemption.
    pub training_gpu_hours: f64,
    pub mean_inference_gpus: f64,
    /// Share of requests that waited longer than the SLO.
    pub slo_violation_share: f64,
    /// Training GPUs taken back for inference.
    pub preempted_training_gpus: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_mape: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub hours: u32,
    pub seed: u64,
    pub gpus: u32,
    pub peak_rps: f64,
    pub slo_ms: f64,
    pub modes: BTreeMap<&'static str, ModeReport>,
}

/// The request rate at every step of the history and the run.
fn load(cfg: &SimConfig, policy: &ElasticPolicy, steps: usize, from: DateTime<Utc>) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let dt = f64::from(cfg.step_secs);
    let mut noise = 0.0f64;
    let mut burst: Option<(usize, usize, f64)> = None; // (start, end, multiplier)
    let ramp = (120.0 / dt).max(1.0);
    (0..steps)
        .map(|i| {
            let at = from + Duration::seconds(i as i64 * i64::from(cfg.step_secs));
            let local = at.with_timezone(&policy.time_zone);
            let hour = f64::from(local.hour()) + f64::from(local.minute()) / 60.0;
            let bump = if (6.0..23.0).contains(&hour) {
                ((hour - 6.0) / 17.0 * std::f64::consts::PI).sin().powi(2)
            } else {
                0.0
            };
            let weekend = matches!(local.weekday(), chrono::Weekday::Sat | chrono::Weekday::Sun);
            let diurnal = (0.12 + 0.88 * bump) * if weekend { 0.6 } else { 1.0 };
            // Smooth noise: an AR(1) walk of about 5%.
            let shock: f64 = (0..3).map(|_| rng.random::<f64>() - 0.5).sum::<f64>() * 0.02;
            noise = 0.995 * noise + shock;
            if burst.is_some_and(|(_, end, _)| i >= end) {
                burst = None;
            }
            if burst.is_none() && rng.random::<f64>() < cfg.bursts_per_day * dt / 86_400.0 {
                let len = rng.random_range(300.0..1800.0) / dt;
                burst = Some((i, i + len as usize, rng.random_range(1.5..2.2)));
            }
            let b = burst.map_or(1.0, |(start, end, m)| {
                let up = ((i - start) as f64 / ramp).min(1.0);
                let down = ((end - i) as f64 / ramp).min(1.0);
                1.0 + (m - 1.0) * up.min(down)
            });
            cfg.peak_rps * diurnal * noise.exp() * b
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Exclusive,
    Static,
    Elastic,
}

/// The replicas a mode has, and the GPUs they hold.
struct Fleet {
    /// Replicas serving now.
    ready: u32,
    /// Replicas starting, with the step at which each serves.
    starting: Vec<(usize, u32)>,
    /// Steps demand has stayed below what is held (elastic shrinks after a while).
    low_for: usize,
    /// Steps left in the burst share (the policy's cooldown).
    burst_left: usize,
    inference_gpus: u32,
}

/// Runs the three modes over the same load.
pub fn simulate(cfg: &SimConfig, policy: &ElasticPolicy) -> Report {
    let per_day = (86_400 / cfg.step_secs) as usize;
    let history = cfg.history_days as usize * per_day;
    let run = (cfg.hours as usize * 3600) / cfg.step_secs as usize;
    let from = cfg.start - Duration::days(i64::from(cfg.history_days));
    let rates = load(cfg, policy, history + run, from);
    let mut modes = BTreeMap::new();
    for (name, mode) in [
        ("exclusive", Mode::Exclusive),
        ("static", Mode::Static),
        ("elastic", Mode::Elastic),
    ] {
        modes.insert(name, run_mode(cfg, policy, mode, &rates, history));
    }
    Report {
        hours: cfg.hours,
        seed: cfg.seed,
        gpus: cfg.gpus(),
        peak_rps: cfg.peak_rps,
        slo_ms: cfg.slo_ms,
        modes,
    }
}

fn run_mode(
    cfg: &SimConfig,
    policy: &ElasticPolicy,
    mode: Mode,
    rates: &[f64],
    history: usize,
) -> ModeReport {
    let g = cfg.gpus();
    let dt = f64::from(cfg.step_secs);
    let mu = cfg.mu();
    let per_gpu = match mode {
        Mode::Exclusive => 1,
        Mode::Static | Mode::Elastic => cfg.replicas_per_gpu,
    };
    let gpus_for = |replicas: u32| replicas.div_ceil(per_gpu).min(g);
    // Exclusive and static are sized once, for the daily peak.
    let sized = cfg.replicas_for(cfg.peak_rps).min(g * per_gpu);
    let mut fleet = Fleet {
        ready: sized,
        starting: Vec::new(),
        low_for: 0,
        burst_left: 0,
        inference_gpus: gpus_for(sized),
    };
    // Forecasting in 10-minute buckets with a daily cycle.
    let bucket = (600 / cfg.step_secs) as usize;
    let period = 86_400 / 600;
    let buckets: Vec<f64> = rates[..history]
        .chunks(bucket)
        .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        .collect();
    let mut model = (mode == Mode::Elastic)
        .then(|| HoltWinters::fit(&buckets, period as usize, DEFAULT_SMOOTHING))
        .flatten();
    let horizon = 6; // one hour ahead, for the reported error
    let mut forecasts: BTreeMap<usize, f64> = BTreeMap::new();
    let mut pairs = Vec::new();
    let mut bucket_sum = 0.0;

    let grace_steps = (f64::from(policy.preemption.grace_seconds) / dt).ceil() as usize;
    let start_steps = (f64::from(cfg.replica_start_secs) / dt).ceil() as usize;
    let shrink_after = (300.0 / dt) as usize;
    let cooldown = policy
        .burst
        .as_ref()
        .map_or(0, |b| (f64::from(b.cooldown_minutes) * 60.0 / dt) as usize);

    let mut backlog = 0.0;
    let mut waits = Vec::with_capacity(rates.len() - history);
    let (mut util_sum, mut tasks_sum, mut inf_gpu_sum) = (0.0, 0.0, 0.0);
    let (mut training_hours, mut lost_hours, mut preempted) = (0.0, 0.0, 0u64);
    let mut last_wait_ms = 0.0;
    for (i, &lambda) in rates.iter().enumerate().skip(history) {
        let at = cfg.start + Duration::seconds(((i - history) as i64) * i64::from(cfg.step_secs));
        if mode == Mode::Elastic {
            // Replicas that finished starting serve from now on.
            let (now_ready, still): (Vec<_>, Vec<_>) =
                fleet.starting.iter().partition(|(step, _)| *step <= i);
            fleet.ready += now_ready.iter().map(|(_, n)| n).sum::<u32>();
            fleet.starting = still;
            // How many replicas demand wants: now, and the next half hour as forecast.
            let observed = rates[i - 1];
            let predicted = model
                .as_ref()
                .map_or(0.0, |m| (1..=3).map(|h| m.forecast(h)).fold(0.0, f64::max));
            let mut want = cfg.replicas_for(observed.max(predicted));
            // The window's share caps the GPUs inference holds, plus the burst share while
            // the queue wait is over target.
            let burst = policy.burst.as_ref();
            if burst.is_some_and(|b| last_wait_ms > b.queue_ms) {
                fleet.burst_left = cooldown;
            } else {
                fleet.burst_left = fleet.burst_left.saturating_sub(1);
            }
            let extra = if fleet.burst_left > 0 {
                burst.map_or(0.0, |b| b.max_extra_share)
            } else {
                0.0
            };
            let cap_gpus =
                (((policy.share("inference", at) + extra) * f64::from(g)).floor() as u32).max(1);
            want = want.min(cap_gpus * per_gpu);
            let held = fleet.ready + fleet.starting.iter().map(|(_, n)| n).sum::<u32>();
            if want > held {
                fleet.low_for = 0;
                let more = want - held;
                let gpus_after = gpus_for(want);
                let new_gpus = gpus_after.saturating_sub(fleet.inference_gpus);
                // On GPUs already held they start at once; on GPUs taken from training
                // after its grace period.
                let wait = start_steps + if new_gpus > 0 { grace_steps } else { 0 };
                fleet.starting.push((i + wait, more));
                if new_gpus > 0 {
                    preempted += u64::from(new_gpus);
                    lost_hours +=
                        f64::from(new_gpus) * f64::from(cfg.checkpoint_minutes) / 2.0 / 60.0;
                    fleet.inference_gpus = gpus_after;
                }
            } else if want < held * 4 / 5 {
                fleet.low_for += 1;
                if fleet.low_for >= shrink_after {
                    // Shrink to what demand wants, with a tenth to spare.
                    let keep = (want + want / 10).max(1).min(held);
                    fleet.starting.clear();
                    fleet.ready = fleet.ready.min(keep);
                    fleet.inference_gpus = gpus_for(keep);
                    fleet.low_for = 0;
                }
            } else {
                fleet.low_for = 0;
            }
        }
        // Serve this step's requests.
        let c = fleet.ready;
        let capacity = f64::from(c) * mu;
        let w = Waits::of(c, lambda, mu, backlog);
        backlog = (backlog + (lambda - capacity) * dt).max(0.0);
        waits.push((lambda * dt, w));
        last_wait_ms = quantile(&[(1.0, w)], 0.99, 60_000.0);
        let busy_replicas = lambda.min(capacity) / mu;
        let training_gpus = g - fleet.inference_gpus;
        let computed = busy_replicas / f64::from(cfg.replicas_per_gpu)
            + f64::from(training_gpus) * cfg.training_busy;
        util_sum += computed / f64::from(g);
        tasks_sum += f64::from(c) / f64::from(fleet.inference_gpus.max(1));
        inf_gpu_sum += f64::from(fleet.inference_gpus);
        training_hours += f64::from(training_gpus) * dt / 3600.0;
        // The forecaster sees each finished bucket.
        bucket_sum += lambda;
        if (i + 1 - history).is_multiple_of(bucket) {
            let actual = bucket_sum / bucket as f64;
            bucket_sum = 0.0;
            let index = (i + 1 - history) / bucket;
            if let Some(m) = model.as_mut() {
                if let Some(f) = forecasts.remove(&index) {
                    pairs.push((f, actual));
                }
                m.observe(actual);
                forecasts.insert(index + horizon, m.forecast(horizon));
            }
        }
    }
    let steps = (rates.len() - history).max(1) as f64;
    let slo_share = {
        let total: f64 = waits.iter().map(|(n, _)| n).sum();
        let late: f64 = waits
            .iter()
            .map(|(n, w)| {
                n * f64::from(u8::from(quantile(&[(1.0, *w)], 0.5, 60_000.0) > cfg.slo_ms))
            })
            .sum();
        if total > 0.0 { late / total } else { 0.0 }
    };
    ModeReport {
        mean_gpu_utilization: util_sum / steps,
        inference_tasks_per_gpu: tasks_sum / steps,
        p99_queue_ms: quantile(&waits, 0.99, 60_000.0),
        p999_queue_ms: quantile(&waits, 0.999, 60_000.0),
        training_gpu_hours: training_hours - lost_hours,
        mean_inference_gpus: inf_gpu_sum / steps,
        slo_violation_share: slo_share,
        preempted_training_gpus: preempted,
        forecast_mape: (mode == Mode::Elastic).then(|| mape(&pairs)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_report() {
        let policy = ElasticPolicy::builtin().expect("policy");
        let cfg = SimConfig::new(6, 7);
        let a = simulate(&cfg, &policy);
        let b = simulate(&cfg, &policy);
        assert_eq!(
            serde_json_like(&a),
            serde_json_like(&b),
            "deterministic for a seed"
        );
    }

    fn serde_json_like(r: &Report) -> String {
        format!("{:?}", r.modes)
    }

    #[test]
    fn elastic_sharing_packs_replicas_and_follows_demand() {
        let policy = ElasticPolicy::builtin().expect("policy");
        let r = simulate(&SimConfig::new(24, 3), &policy);
        let (ex, st, el) = (
            &r.modes["exclusive"],
            &r.modes["static"],
            &r.modes["elastic"],
        );
        assert!((ex.inference_tasks_per_gpu - 1.0).abs() < 1e-9);
        assert!(st.inference_tasks_per_gpu > 7.0);
        assert!(el.inference_tasks_per_gpu > 5.0 * ex.inference_tasks_per_gpu);
        // Following demand leaves training more than a fixed pool sized for the peak.
        assert!(el.mean_inference_gpus < st.mean_inference_gpus);
        assert!(el.mean_gpu_utilization > ex.mean_gpu_utilization);
        assert!(el.forecast_mape.is_some_and(|m| m < 0.5), "{el:?}");
    }
}
