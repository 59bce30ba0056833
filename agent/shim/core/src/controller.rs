//! The compute-share controller: sets the launch pacer's rate from measured utilization so
//! that a job with a 30% share gets about 30% of the GPU.
//!
//! Kernels differ in length, so a launch rate alone says nothing about GPU time. Each
//! control period the controller learns what a launch costs (measured utilization over the
//! period ÷ launches in it, smoothed), sets the rate that would give the share at that
//! cost, and corrects what the model misses with an integral term. When the job launches
//! less than its rate allows (it wants less than its share), the integral stands still so
//! that it does not wind up.

use std::sync::atomic::Ordering;

use crate::pacer;
use crate::region::{GpuLimits, GpuUsage};

/// How often the controller runs (per GPU, in one of the job's processes).
pub const PERIOD_NS: u64 = 200_000_000;
/// Weight of the newest cost measurement.
const COST_SMOOTHING: f64 = 0.4;
/// Integral gain per period.
const KI: f64 = 0.4;
/// Below this utilization a period tells too little about the cost of a launch.
const MIN_MEASURABLE: f64 = 0.01;

/// What one control period saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The job's share of the GPU's time in the period, 0 to 1.
    pub utilization: f64,
    /// Launches the job made in the period.
    pub launches: u64,
    pub period_s: f64,
}

/// What the controller carries between periods.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct State {
    /// GPU-seconds one launch costs (0: not known yet).
    pub cost: f64,
    /// Correction to the share the rate aims at.
    pub integral: f64,
}

/// One control step: the new launch rate (launches per second), or `None` when the period
/// tells nothing (no launches, or too little work to measure).
pub fn step(
    share: f64,
    current_rate: Option<f64>,
    state: &mut State,
    obs: Observation,
) -> Option<f64> {
    if obs.launches == 0 || obs.period_s <= 0.0 || obs.utilization < MIN_MEASURABLE {
        return None;
    }
    let measured = obs.utilization * obs.period_s / obs.launches as f64;
    state.cost = if state.cost > 0.0 {
        (1.0 - COST_SMOOTHING) * state.cost + COST_SMOOTHING * measured
    } else {
        measured
    };
    let launch_rate = obs.launches as f64 / obs.period_s;
    // Demand-limited: launching well under the rate allowed, so the pacer was not what held
    // utilization down. Integrating then would only wind up.
    let demand_limited = current_rate.is_some_and(|r| launch_rate < 0.8 * r);
    if !demand_limited {
        let bound = (share * 0.5).max(0.05);
        state.integral = (state.integral + KI * (share - obs.utilization)).clamp(-bound, bound);
    }
    let target = (share + state.integral).clamp(0.005, 1.0);
    Some((target / state.cost).clamp(1.0, 1e7))
}

/// Runs a control step for one GPU if a period has passed since the last one (in any of the
/// job's processes). `measure` returns the job's utilization since the last period, and
/// where its samples end.
pub fn tick(
    limits: &GpuLimits,
    usage: &GpuUsage,
    now_ns: u64,
    measure: impl FnOnce(u64) -> Option<(f64, u64)>,
) {
    let last = usage.control_at_ns.load(Ordering::Acquire);
    if now_ns.saturating_sub(last) < PERIOD_NS {
        return;
    }
    // One process per period: the one that moves the mark.
    if usage
        .control_at_ns
        .compare_exchange(last, now_ns, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let launches_now = usage.launches.load(Ordering::Acquire);
    let launches =
        launches_now.saturating_sub(usage.control_launches.swap(launches_now, Ordering::AcqRel));
    let Some((utilization, seen_us)) = measure(usage.nvml_seen_us.load(Ordering::Acquire)) else {
        return;
    };
    usage.nvml_seen_us.store(seen_us, Ordering::Release);
    if last == 0 {
        // The first period has no start: it only sets the marks.
        return;
    }
    let mut state = State {
        cost: f64::from_bits(usage.cost_bits.load(Ordering::Acquire)),
        integral: f64::from_bits(usage.integral_bits.load(Ordering::Acquire)),
    };
    let share = f64::from(limits.compute_milli()) / 1000.0;
    let obs = Observation {
        utilization,
        launches,
        period_s: (now_ns - last) as f64 / 1e9,
    };
    // The job's own GPU time, for its node to report.
    let busy = (utilization.clamp(0.0, 1.0) * (now_ns - last) as f64) as u64;
    usage.busy_ns.fetch_add(busy, Ordering::AcqRel);
    usage.measured_ns.fetch_add(now_ns - last, Ordering::AcqRel);
    if let Some(rate) = step(share, pacer::rate(usage), &mut state, obs) {
        pacer::set_rate(usage, rate);
    }
    usage
        .cost_bits
        .store(state.cost.to_bits(), Ordering::Release);
    usage
        .integral_bits
        .store(state.integral.to_bits(), Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU that runs each launch for `cost` seconds, fed by a job that launches as fast
    /// as the rate allows: the controller must bring its utilization to the share.
    fn converge(share: f64, cost: f64) -> f64 {
        let mut state = State::default();
        let mut rate: Option<f64> = None;
        let period = 0.2;
        let mut util = 0.0;
        for _ in 0..40 {
            // Unpaced, the job keeps the GPU busy; paced, it gets rate × cost of it.
            util = rate.map_or(1.0, |r| (r * cost).min(1.0));
            let launches = (util * period / cost).round() as u64;
            let obs = Observation {
                utilization: util,
                launches,
                period_s: period,
            };
            if let Some(r) = step(share, rate, &mut state, obs) {
                rate = Some(r);
            }
        }
        util
    }

    #[test]
    fn utilization_settles_at_the_share() {
        for share in [0.1, 0.3, 0.5, 0.7] {
            for cost in [0.0001, 0.001, 0.02] {
                let u = converge(share, cost);
                assert!(
                    (u - share).abs() < 0.01 * share.max(0.1),
                    "share {share} cost {cost}: {u}"
                );
            }
        }
    }

    #[test]
    fn a_lagging_measurement_still_settles() {
        // NVML's samples trail the launches: each period sees the previous one's
        // utilization against this one's launches. The loop must settle, not oscillate.
        let mut state = State::default();
        let mut rate: Option<f64> = None;
        let (cost, share, period) = (0.001, 0.3, 0.2);
        let mut previous = 1.0;
        let mut history = Vec::new();
        for _ in 0..60 {
            let util = rate.map_or(1.0, |r| (r * cost).min(1.0));
            let launches = (util * period / cost).round() as u64;
            let obs = Observation {
                utilization: previous,
                launches,
                period_s: period,
            };
            previous = util;
            history.push(util);
            if let Some(r) = step(share, rate, &mut state, obs) {
                rate = Some(r);
            }
        }
        let tail = &history[40..];
        assert!(tail.iter().all(|u| (u - share).abs() < 0.03), "{tail:?}");
    }

    #[test]
    fn idle_periods_change_nothing() {
        let mut state = State {
            cost: 0.001,
            integral: 0.01,
        };
        let obs = Observation {
            utilization: 0.0,
            launches: 0,
            period_s: 0.2,
        };
        assert_eq!(step(0.3, Some(300.0), &mut state, obs), None);
        assert_eq!(
            state,
            State {
                cost: 0.001,
                integral: 0.01
            }
        );
    }

    #[test]
    fn a_job_wanting_less_than_its_share_does_not_wind_up() {
        let mut state = State {
            cost: 0.001,
            integral: 0.0,
        };
        // Rate allows 300/s, the job launches 50/s: 5% of the GPU.
        for _ in 0..100 {
            let obs = Observation {
                utilization: 0.05,
                launches: 10,
                period_s: 0.2,
            };
            step(0.3, Some(300.0), &mut state, obs);
        }
        assert_eq!(state.integral, 0.0);
    }
}
