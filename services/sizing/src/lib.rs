//! How much of a GPU an auto-sized job gets (`--gpus auto`, `--gpu-memory auto`), decided
//! from what it used. Pure: the caller feeds each job's samples and the time, and applies
//! (and records) what [`Sizer::decide`] says within the limits it passes.
//!
//! The rules, after Google's Autopilot (EuroSys '20): demand is forecast as a high quantile
//! of what the job used over a sliding window, and its share is the forecast plus headroom.
//!
//! - **Up quickly**: a job whose launches were held back by its share (the shim's pacer
//!   made them wait) used all it was given and wanted more; its demand is estimated above
//!   what it used, and it grows at once by at least [`Policy::grow`], up to its ceiling.
//!   So does one whose memory nears its limit, and one whose forecast ate more than half
//!   of its headroom (back to the full headroom).
//! - **Down slowly**: only when even the window's peak demand plus headroom stayed below
//!   the share by [`Policy::shrink_margin`] for [`Policy::shrink_after`], and then by at
//!   most [`Policy::shrink_step`] at a time (hysteresis: constant load changes nothing).
//! - **Memory never below what it used**: the limit stays at or above the job's observed
//!   peak plus [`Policy::memory_headroom`] (within its ceiling, which wins: a quota is
//!   never exceeded).
//! - After each change the window starts again: samples taken under another share measure
//!   something else (a job held to a small share uses no more than it).

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// A whole GPU, in thousandths.
pub const GPU_MILLI: u32 = 1000;

/// The rules' parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// How far back samples count.
    pub window: Duration,
    /// The quantile of demand over the window that is forecast (0.95: what the job needs
    /// 95% of the time).
    pub quantile: f64,
    /// Share given above the forecast (0.15: 15%).
    pub headroom: f64,
    /// Memory given above the observed peak (the seed's 10–20%).
    pub memory_headroom: f64,
    /// Shares are multiples of this many thousandths.
    pub step_milli: u32,
    /// The least share an auto-sized job holds.
    pub min_milli: u32,
    /// The least memory limit, in bytes.
    pub min_memory_bytes: u64,
    /// Held back longer than this share of the time: the share is too small.
    pub held_back: f64,
    /// A share that is too small grows by at least this factor (1.5: by half).
    pub grow: f64,
    /// Memory used above this share of the limit: the limit is too small.
    pub memory_near: f64,
    /// A share (or memory limit) shrinks only when what it needs is below it by this share.
    pub shrink_margin: f64,
    /// ... and has been for this long.
    pub shrink_after: Duration,
    /// A shrink takes at most this share off at once.
    pub shrink_step: f64,
    /// After a change, samples for this long are awaited before the next decision.
    pub settle: Duration,
    /// The fewest samples a decision is made on.
    pub min_samples: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(300),
            quantile: 0.95,
            headroom: 0.15,
            memory_headroom: 0.15,
            step_milli: 10,
            min_milli: 50,
            min_memory_bytes: 256 << 20,
            held_back: 0.02,
            grow: 1.5,
            memory_near: 0.9,
            shrink_margin: 0.2,
            shrink_after: Duration::from_secs(120),
            shrink_step: 0.3,
            settle: Duration::from_secs(10),
            min_samples: 3,
        }
    }
}

impl Policy {
    /// The rules' times made no shorter than samples allow, when a sample comes every
    /// `every`: a window of at least ten samples, a shrink after at least five, a settle of
    /// at least two (a window shorter than a sample never holds enough to decide on).
    pub fn sampled_every(mut self, every: Duration) -> Self {
        self.window = self.window.max(every * 10);
        self.shrink_after = self.shrink_after.max(every * 5);
        self.settle = self.settle.max(every * 2);
        self
    }

    /// The same rules with their times divided by `k` (a day replayed `k` times faster is
    /// sized on windows `k` times shorter); `k` at or below 0 changes nothing.
    pub fn compressed(mut self, k: f64) -> Self {
        if k > 0.0 && k.is_finite() {
            let scale = |d: Duration| Duration::from_secs_f64(d.as_secs_f64() / k);
            self.window = scale(self.window);
            self.shrink_after = scale(self.shrink_after);
            self.settle = scale(self.settle);
        }
        self
    }
}

/// One measurement of a job, over the interval since the one before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When it was taken (any fixed origin; the caller's clock).
    pub at: Duration,
    /// The share of one GPU's time the job kept busy, 0 to 1.
    pub busy: f64,
    /// The share of the interval the job's launches waited for its share, 0 to 1.
    pub held_back: f64,
    /// GPU memory the job held, in bytes.
    pub memory_bytes: u64,
}

/// What the job holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    pub gpu_milli: u32,
    /// Its GPU memory limit, in bytes.
    pub memory_bytes: u64,
}

/// What the job may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The most share: the job's own ceiling (`auto:MAX`), the GPU's room and its
    /// tenant's quota, whichever is least.
    pub max_milli: u32,
    /// The most memory limit (the same, for memory).
    pub max_memory_bytes: u64,
    /// Whether its memory limit is sized too (else it stays as it is).
    pub memory: bool,
}

/// Why a job is resized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reason {
    /// Its launches waited for its share this share of the time.
    HeldBack { held_back: f64 },
    /// The forecast outgrew the share.
    Outgrown,
    /// The forecast has stayed well under the share.
    Oversized,
    /// Its memory use neared its limit.
    MemoryNearLimit { used: u64 },
    /// Its memory limit was under its observed peak plus headroom.
    BelowPeak,
    /// Its memory limit has stayed well above its peak plus headroom.
    MemoryOversized,
    /// Its share is above what it may have now (its ceiling, a lowered quota).
    OverCeiling,
}

/// A resize decided: the new share and memory limit, why, and the figures it rests on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub gpu_milli: u32,
    pub memory_bytes: u64,
    pub reason: Reason,
    /// The forecast demand, in thousandths of a GPU (before headroom).
    pub forecast_milli: u32,
    /// The share of time recent launches were held back.
    pub held_back: f64,
    /// The most memory the job was seen to hold.
    pub peak_memory_bytes: u64,
    /// Samples the decision rests on, and the time they span.
    pub samples: usize,
    pub span: Duration,
    /// What the job held before.
    pub from: Holding,
}

impl Decision {
    /// The same decision, granted `gpu_milli` instead (a growth that did not fit whole).
    pub fn granted(self, gpu_milli: u32) -> Self {
        Self { gpu_milli, ..self }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.reason {
            Reason::HeldBack { held_back } => {
                format!("held back {:.0}% of the time", held_back * 100.0)
            }
            Reason::Outgrown => "forecast above its share".to_owned(),
            Reason::Oversized => "forecast well below its share".to_owned(),
            Reason::MemoryNearLimit { used } => {
                format!("memory near its limit ({})", mib(used))
            }
            Reason::BelowPeak => "memory limit below its peak plus headroom".to_owned(),
            Reason::MemoryOversized => "memory limit well above its peak".to_owned(),
            Reason::OverCeiling => "above its ceiling".to_owned(),
        };
        write!(
            f,
            "{why}: {} → {} GPU, memory {} → {} (forecast {} GPU, peak memory {}, {} \
             samples over {:.0} s)",
            milli(self.from.gpu_milli),
            milli(self.gpu_milli),
            mib(self.from.memory_bytes),
            mib(self.memory_bytes),
            milli(self.forecast_milli),
            mib(self.peak_memory_bytes),
            self.samples,
            self.span.as_secs_f64()
        )
    }
}

fn milli(m: u32) -> String {
    format!("{:.3}", f64::from(m) / f64::from(GPU_MILLI))
}

fn mib(b: u64) -> String {
    format!("{} MiB", b.div_ceil(1 << 20))
}

/// One job's samples and what was decided for it.
#[derive(Debug, Clone, Default)]
pub struct Sizer {
    samples: VecDeque<Sample>,
    peak_memory: u64,
    changed_at: Option<Duration>,
    /// Since when the compute (memory) forecast has been well under the share (limit).
    under_since: Option<Duration>,
    memory_under_since: Option<Duration>,
}

impl Sizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a sample in (out-of-order ones, before the last taken, are dropped).
    pub fn observe(&mut self, s: Sample) {
        if self.samples.back().is_some_and(|last| s.at < last.at) {
            return;
        }
        let s = Sample {
            busy: clamp01(s.busy),
            held_back: clamp01(s.held_back),
            ..s
        };
        self.peak_memory = self.peak_memory.max(s.memory_bytes);
        self.samples.push_back(s);
    }

    /// The most memory the job was seen to hold.
    pub fn peak_memory(&self) -> u64 {
        self.peak_memory
    }

    /// What the job should hold at `now`, if not what it holds: `None` keeps it.
    pub fn decide(
        &mut self,
        now: Duration,
        holding: Holding,
        bounds: Bounds,
        policy: &Policy,
    ) -> Option<Decision> {
        let oldest = now.saturating_sub(policy.window);
        while self.samples.front().is_some_and(|s| s.at < oldest) {
            self.samples.pop_front();
        }
        if self
            .changed_at
            .is_some_and(|at| now.saturating_sub(at) < policy.settle)
            || self.samples.len() < policy.min_samples.max(1)
        {
            return None;
        }
        let max_milli = bounds.max_milli.min(GPU_MILLI);
        let min_milli = policy.min_milli.min(max_milli);
        let step = policy.step_milli.max(1);
        let (forecast, peak, held_back) = self.forecast(policy);
        let target = round_up(forecast * (1.0 + policy.headroom), step).clamp(min_milli, max_milli);
        // Down slowly: to no less than the window's peak demand plus headroom (a share
        // that covers the forecast but not the peak is kept, not cut).
        let down = round_up(peak * (1.0 + policy.headroom), step).clamp(min_milli, max_milli);
        let current = holding.gpu_milli;
        let mut reason = None;
        let mut gpu_milli = current;
        if held_back > policy.held_back && current < max_milli {
            let grown = round_up(f64::from(current) * policy.grow / 1000.0, step);
            gpu_milli = target.max(grown).min(max_milli);
            reason = Some(Reason::HeldBack { held_back });
        } else if target > current
            && forecast * (1.0 + policy.headroom / 2.0) * 1000.0 > f64::from(current)
        {
            // More than half its headroom eaten: grown back to the full headroom (a sample
            // a little above the others, within its headroom, changes nothing).
            gpu_milli = target;
            reason = Some(Reason::Outgrown);
        } else if f64::from(down) <= f64::from(current) * (1.0 - policy.shrink_margin) {
            let since = *self.under_since.get_or_insert(now);
            if now.saturating_sub(since) >= policy.shrink_after {
                let least = round_down(f64::from(current) * (1.0 - policy.shrink_step), step);
                gpu_milli = down.max(least).clamp(min_milli, max_milli);
                reason = Some(Reason::Oversized);
            }
        } else {
            self.under_since = None;
        }
        // Over its ceiling (a lowered quota): down to it.
        if gpu_milli > max_milli {
            gpu_milli = max_milli;
            reason = Some(Reason::OverCeiling);
        }
        let mut memory_bytes = holding.memory_bytes;
        if bounds.memory {
            let ceiling = bounds.max_memory_bytes;
            let floor = round_up_mib(self.peak_memory as f64 * (1.0 + policy.memory_headroom))
                .max(policy.min_memory_bytes)
                .min(ceiling);
            let used = self.samples.back().map_or(0, |s| s.memory_bytes);
            let limit = holding.memory_bytes;
            if used as f64 >= limit as f64 * policy.memory_near && limit < ceiling {
                memory_bytes = floor
                    .max(round_up_mib(used as f64 * policy.grow))
                    .min(ceiling);
                reason = reason.or(Some(Reason::MemoryNearLimit { used }));
            } else if limit < floor {
                memory_bytes = floor;
                reason = reason.or(Some(Reason::BelowPeak));
            } else if (floor as f64) <= limit as f64 * (1.0 - policy.shrink_margin) {
                let since = *self.memory_under_since.get_or_insert(now);
                if now.saturating_sub(since) >= policy.shrink_after {
                    let least = round_up_mib(limit as f64 * (1.0 - policy.shrink_step));
                    memory_bytes = floor.max(least);
                    reason = reason.or(Some(Reason::MemoryOversized));
                }
            } else {
                self.memory_under_since = None;
            }
            if memory_bytes > ceiling {
                memory_bytes = ceiling;
                reason = reason.or(Some(Reason::OverCeiling));
            }
        }
        if gpu_milli == current && memory_bytes == holding.memory_bytes {
            return None;
        }
        let mut reason = reason?;
        // A change of memory alone says why its memory changed.
        if gpu_milli == current && matches!(reason, Reason::Oversized | Reason::Outgrown) {
            reason = Reason::MemoryOversized;
        }
        let span = match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) => b.at.saturating_sub(a.at),
            _ => Duration::ZERO,
        };
        let decision = Decision {
            gpu_milli,
            memory_bytes,
            reason,
            forecast_milli: (forecast * 1000.0).round() as u32,
            held_back,
            peak_memory_bytes: self.peak_memory,
            samples: self.samples.len(),
            span,
            from: holding,
        };
        Some(decision)
    }

    /// `decision` was applied at `at`: when its share changed, samples start again (those
    /// under the old share measured it, not the job's demand).
    pub fn applied(&mut self, at: Duration, decision: &Decision) {
        if decision.gpu_milli != decision.from.gpu_milli {
            self.samples.clear();
            self.under_since = None;
        }
        self.changed_at = Some(at);
        self.memory_under_since = None;
    }

    /// The forecast demand (fraction of a GPU), the window's peak demand, and the share of
    /// time recent launches were held back.
    fn forecast(&self, policy: &Policy) -> (f64, f64, f64) {
        // A job held back `h` of the time wanted more than it used: at least
        // `busy / (1 - h)` (estimated no higher than four times what it used).
        let mut demand: Vec<f64> = self
            .samples
            .iter()
            .map(|s| (s.busy / (1.0 - s.held_back).max(0.25)).min(1.0))
            .collect();
        demand.sort_by(f64::total_cmp);
        let q = policy.quantile.clamp(0.0, 1.0);
        let rank = ((demand.len() as f64 * q).ceil() as usize).clamp(1, demand.len());
        let forecast = demand[rank - 1];
        let peak = demand[demand.len() - 1];
        let recent = policy.min_samples.max(1).min(self.samples.len());
        let held_back = self
            .samples
            .iter()
            .rev()
            .take(recent)
            .map(|s| s.held_back)
            .sum::<f64>()
            / recent as f64;
        (forecast, peak, held_back)
    }
}

fn clamp01(x: f64) -> f64 {
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

/// `fraction` of a GPU in thousandths, rounded up to a multiple of `step`.
fn round_up(fraction: f64, step: u32) -> u32 {
    let milli = (fraction * 1000.0).ceil().clamp(0.0, f64::from(GPU_MILLI));
    let milli = milli as u32;
    milli.div_ceil(step).saturating_mul(step).min(GPU_MILLI)
}

/// `milli` thousandths rounded down to a multiple of `step`.
fn round_down(milli: f64, step: u32) -> u32 {
    let m = milli.floor().clamp(0.0, f64::from(GPU_MILLI)) as u32;
    m / step * step
}

fn round_up_mib(bytes: f64) -> u64 {
    let b = if bytes.is_finite() && bytes > 0.0 {
        bytes.ceil() as u64
    } else {
        0
    };
    b.div_ceil(1 << 20).saturating_mul(1 << 20)
}

#[cfg(test)]
mod tests;
