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
//!   most [`Policy::shrink_step`] at a time (hysteresis: constant load changes nothing);
//!   and, for [`Policy::remember_held_back`] after its launches were held back at a share,
//!   never back to that share, and at most halfway down towards it: bursty work, whose mean use is well under the share its
//!   bursts need, finds that share in a few steps instead of shrinking and growing again
//!   without end.
//! - **Memory never below what it used**: the limit stays at or above the job's observed
//!   peak plus [`Policy::memory_headroom`] (within its ceiling, which wins: a quota is
//!   never exceeded).
//! - After each change the window starts again: samples taken under another share measure
//!   something else (a job held to a small share uses no more than it).
//! - **The day ahead**: once two whole days were seen, the forecast is never below the peak
//!   the job's daily pattern (additive Holt-Winters over slices of the day, as the elastic
//!   planner forecasts demand) foresees over [`Policy::horizon`]: a service that rises
//!   every morning gets its morning share before it is held back.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

mod seasonal;

use seasonal::Seasonal;

/// A whole GPU, in thousandths.
pub const GPU_MILLI: u32 = 1000;

/// The rules' parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// How far back samples count; zero: the last sample alone.
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
    /// For this long after its launches were held back at a share, a job is not shrunk
    /// back to that share.
    pub remember_held_back: Duration,
    /// Windows a job runs before it has settled where it runs (and may be moved to pack
    /// its GPU's work onto others).
    pub settled_after: u32,
    /// The demand forecast is of each sample averaged over the samples this long before it:
    /// what a share must cover over about the latency objective of a request (the pacer
    /// banks a tenth of a second of credit, and an elastic share has the GPU's idle time
    /// besides), not each quarter second's count of a few requests. Not compressed
    /// ([`Policy::compressed`]): how bursty requests are does not change with how fast a
    /// day is replayed. Samples this far apart or more are taken as they are.
    pub sample_span: Duration,
    /// The fewest samples a decision is made on.
    pub min_samples: usize,
    /// The cycle of a job's daily pattern (a day); zero: no seasonal term.
    pub season: Duration,
    /// Slices of a season whose peaks the seasonal term models.
    pub season_slices: usize,
    /// How far ahead the seasonal term looks.
    pub horizon: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(300),
            quantile: 0.95,
            headroom: 0.2,
            memory_headroom: 0.15,
            step_milli: 10,
            min_milli: 20,
            min_memory_bytes: 1 << 30,
            held_back: 0.02,
            grow: 1.5,
            memory_near: 0.9,
            shrink_margin: 0.2,
            shrink_after: Duration::from_secs(120),
            shrink_step: 0.3,
            settle: Duration::from_secs(10),
            remember_held_back: Duration::from_secs(3_600),
            settled_after: 2,
            sample_span: Duration::from_secs(1),
            min_samples: 3,
            season: Duration::from_secs(86_400),
            season_slices: 144,
            horizon: Duration::from_secs(1_800),
        }
    }
}

impl Policy {
    /// The rules' times made no shorter than samples allow, when a sample comes every
    /// `every`: a window of at least ten samples, a shrink after at least five, a settle of
    /// at least two (a window shorter than a sample never holds enough to decide on), and
    /// where it was held back remembered for at least six windows.
    pub fn sampled_every(mut self, every: Duration) -> Self {
        self.window = self.window.max(every * 10);
        self.shrink_after = self.shrink_after.max(every * 5);
        self.settle = self.settle.max(every * 2);
        self.remember_held_back = self.remember_held_back.max(self.window * 6);
        self
    }

    /// The same rules sized on the last sample alone: no window, no headroom, no
    /// hysteresis, no memory of being held back, no daily term, no smoothing. The negative
    /// control the forecast is measured against (its bounds and steps stay).
    pub fn on_the_last_sample(self) -> Self {
        Policy {
            window: Duration::ZERO,
            quantile: 1.0,
            min_samples: 1,
            headroom: 0.0,
            held_back: 0.0,
            grow: 1.0,
            shrink_margin: 0.0,
            shrink_after: Duration::ZERO,
            shrink_step: 1.0,
            settle: Duration::ZERO,
            remember_held_back: Duration::ZERO,
            season: Duration::ZERO,
            sample_span: Duration::ZERO,
            ..self
        }
    }

    /// The same rules with their times divided by `k` (a day replayed `k` times faster is
    /// sized on windows `k` times shorter, its seasons and horizon too); `k` at or below 0
    /// changes nothing.
    pub fn compressed(mut self, k: f64) -> Self {
        if k > 0.0 && k.is_finite() {
            let scale = |d: Duration| Duration::from_secs_f64(d.as_secs_f64() / k);
            self.window = scale(self.window);
            self.shrink_after = scale(self.shrink_after);
            self.settle = scale(self.settle);
            self.remember_held_back = scale(self.remember_held_back);
            self.season = scale(self.season);
            self.horizon = scale(self.horizon);
        }
        self
    }

    /// One slice of the season.
    fn slice(&self) -> Duration {
        if self.season_slices == 0 {
            Duration::ZERO
        } else {
            self.season / u32::try_from(self.season_slices).unwrap_or(u32::MAX)
        }
    }

    /// Slices the horizon spans (at least one).
    fn horizon_slices(&self) -> usize {
        let slice = self.slice().as_secs_f64();
        if slice <= 0.0 {
            return 1;
        }
        ((self.horizon.as_secs_f64() / slice).ceil() as usize).max(1)
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
    /// When the first sample under the current share was taken.
    measuring_since: Option<Duration>,
    /// When the first sample of this attempt was taken.
    running_since: Option<Duration>,
    /// The daily pattern of its demand (kept across its attempts).
    seasonal: Seasonal,
    /// The largest share its launches were held back at lately.
    held_back_at: Option<HeldAt>,
}

/// Where a job's launches were held back.
#[derive(Debug, Clone, Copy, PartialEq)]
struct HeldAt {
    milli: u32,
    at: Duration,
}

impl Sizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// A sizer for the job's next attempt: measured afresh, its daily pattern kept.
    pub fn restarted(&self) -> Self {
        Self {
            seasonal: self.seasonal.clone(),
            held_back_at: self.held_back_at,
            ..Self::default()
        }
    }

    /// Takes a sample in (out-of-order ones, before the last taken, are dropped); with
    /// `policy`'s season, into the job's daily pattern too.
    pub fn observe_under(&mut self, s: Sample, policy: &Policy) {
        if self.samples.back().is_some_and(|last| s.at < last.at) {
            return;
        }
        if !policy.season.is_zero() {
            self.seasonal.observe(
                s.at,
                demand_of(clamp01(s.busy), clamp01(s.held_back)),
                policy.slice(),
                policy.season_slices,
            );
        }
        self.observe(s);
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
        self.measuring_since.get_or_insert(s.at);
        self.running_since.get_or_insert(s.at);
        self.samples.push_back(s);
    }

    /// Whether the job has settled where it runs: measured for [`Policy::settled_after`]
    /// windows since it started, and a whole window under its current share (a job moved,
    /// started or resized a moment ago has not).
    pub fn settled(&self, now: Duration, policy: &Policy) -> bool {
        let since =
            |t: Option<Duration>, d: Duration| t.is_some_and(|t| now.saturating_sub(t) >= d);
        self.samples.len() >= policy.min_samples.max(1)
            && since(self.measuring_since, policy.window)
            && since(
                self.running_since,
                policy.window * policy.settled_after.max(1),
            )
            && self
                .changed_at
                .is_none_or(|at| now.saturating_sub(at) >= policy.settle)
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
        if policy.window.is_zero() {
            while self.samples.len() > 1 {
                self.samples.pop_front();
            }
        } else {
            let oldest = now.saturating_sub(policy.window);
            while self.samples.front().is_some_and(|s| s.at < oldest) {
                self.samples.pop_front();
            }
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
        // Where it was held back is forgotten after a while (a load that fell for good is
        // then sized down to what it is).
        if self
            .held_back_at
            .is_some_and(|h| now.saturating_sub(h.at) >= policy.remember_held_back)
        {
            self.held_back_at = None;
        }
        let floor = self
            .held_back_at
            .map_or(0, |h| h.milli.saturating_add(step));
        let mut reason = None;
        let mut gpu_milli = current;
        if held_back > policy.held_back && current < max_milli {
            let grown = round_up(f64::from(current) * policy.grow / 1000.0, step);
            gpu_milli = target.max(grown).min(max_milli);
            reason = Some(Reason::HeldBack { held_back });
            let before = self.held_back_at;
            self.held_back_at = Some(HeldAt {
                milli: before.map_or(0, |h| h.milli).max(current),
                at: now,
            });
        } else if target > current
            && forecast * (1.0 + policy.headroom / 2.0) * 1000.0 > f64::from(current)
        {
            // More than half its headroom eaten: grown back to the full headroom (a sample
            // a little above the others, within its headroom, changes nothing).
            gpu_milli = target;
            reason = Some(Reason::Outgrown);
        } else if f64::from(down) <= f64::from(current) * (1.0 - policy.shrink_margin)
            && floor < current
        {
            let since = *self.under_since.get_or_insert(now);
            if now.saturating_sub(since) >= policy.shrink_after {
                let least = round_down(f64::from(current) * (1.0 - policy.shrink_step), step);
                // Held back lately: at most halfway down to where it was.
                let halfway = if floor > 0 {
                    (floor + current).div_ceil(2).div_ceil(step) * step
                } else {
                    0
                };
                gpu_milli = down
                    .max(least)
                    .max(floor)
                    .max(halfway)
                    .clamp(min_milli, max_milli);
                reason = Some(Reason::Oversized);
            }
        } else {
            self.under_since = None;
        }
        // Under the least share (it started there): up to it.
        if gpu_milli < min_milli {
            gpu_milli = min_milli;
            reason = reason.or(Some(Reason::Outgrown));
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
            } else if self.peak_memory > 0
                && (floor as f64) <= limit as f64 * (1.0 - policy.shrink_margin)
            {
                // Never cut before it was seen holding any: a job still loading (no CUDA
                // context yet) would find its limit too small for one when it starts.
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
            self.measuring_since = None;
        }
        self.changed_at = Some(at);
        self.memory_under_since = None;
    }

    /// The forecast demand (fraction of a GPU), the window's peak demand, and the share of
    /// time recent launches were held back.
    fn forecast(&self, policy: &Policy) -> (f64, f64, f64) {
        // A job held back `h` of the time wanted more than it used: at least
        // `busy / (1 - h)` (estimated no higher than four times what it used).
        let raw: Vec<(Duration, f64)> = self
            .samples
            .iter()
            .map(|s| (s.at, demand_of(s.busy, s.held_back)))
            .collect();
        // Each sample's demand averaged over the samples of the span before it: what a share
        // must cover is a request's worth of time, not each quarter second's handful.
        // (Those with less than a span of samples before them only when that is all there
        // is.)
        let first = raw.first().map_or(Duration::ZERO, |r| r.0);
        let spanned = raw
            .last()
            .is_some_and(|r| r.0.saturating_sub(first) >= policy.sample_span);
        let mut demand = Vec::with_capacity(raw.len());
        let mut from = 0;
        let mut sum = 0.0;
        for (i, &(at, d)) in raw.iter().enumerate() {
            sum += d;
            while from < i && at.saturating_sub(raw[from].0) >= policy.sample_span {
                sum -= raw[from].1;
                from += 1;
            }
            if !spanned || at.saturating_sub(first) >= policy.sample_span {
                demand.push((sum / (i + 1 - from) as f64).clamp(0.0, 1.0));
            }
        }
        demand.sort_by(f64::total_cmp);
        let q = policy.quantile.clamp(0.0, 1.0);
        let rank = ((demand.len() as f64 * q).ceil() as usize).clamp(1, demand.len());
        // What its day foresees over the horizon, once two days were seen.
        let ahead = if policy.season.is_zero() {
            0.0
        } else {
            self.seasonal.ahead(policy.horizon_slices()).unwrap_or(0.0)
        };
        let forecast = demand[rank - 1].max(ahead);
        let peak = demand[demand.len() - 1].max(ahead);
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

/// What a job wanted when it used `busy` and its launches waited `held_back` of the time:
/// at least `busy / (1 - held_back)` (estimated no higher than four times what it used).
fn demand_of(busy: f64, held_back: f64) -> f64 {
    (busy / (1.0 - held_back).max(0.25)).min(1.0)
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
