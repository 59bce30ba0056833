//! The daily term of a job's forecast: the peak demand of each slice of the day (ten
//! minutes of a day by default), modelled as the elastic planner models demand (additive
//! Holt-Winters, [`allot_elastic::HoltWinters`]) once two whole days were seen, and read
//! ahead over the forecast's horizon. A service that rises every morning is given its
//! morning share before its launches wait for it.

use std::time::Duration;

use allot_elastic::HoltWinters;

/// Smoothing for peaks per slice of a day: the level follows a day's changes, the
/// seasonal term learns a day's shape over a few days.
const SMOOTHING: (f64, f64, f64) = (0.3, 0.01, 0.3);

/// A job's demand by slice of the season.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seasonal {
    /// The slice being filled (its index since the clock's origin) and its peak so far.
    open: Option<(u64, f64)>,
    /// Closed slices' peaks, until the model is fitted on two seasons of them.
    history: Vec<f64>,
    model: Option<HoltWinters>,
}

impl Seasonal {
    /// Takes in a demand measured at `at`, slices of `slice` long, `per_season` to a season.
    pub(crate) fn observe(
        &mut self,
        at: Duration,
        demand: f64,
        slice: Duration,
        per_season: usize,
    ) {
        if slice.is_zero() || per_season == 0 || !demand.is_finite() {
            return;
        }
        let index = (at.as_nanos() / slice.as_nanos().max(1)) as u64;
        match self.open {
            Some((i, peak)) if i == index => self.open = Some((i, peak.max(demand))),
            Some((i, _)) if i > index => {}
            Some((i, peak)) => {
                // The slices between (none measured: the job did not run) repeat the last.
                let missed = (index - i).min(per_season as u64 * 2);
                for _ in 0..missed {
                    self.close(peak, per_season);
                }
                self.open = Some((index, demand));
            }
            None => self.open = Some((index, demand)),
        }
    }

    fn close(&mut self, peak: f64, per_season: usize) {
        match &mut self.model {
            Some(m) => m.observe(peak),
            None => {
                self.history.push(peak);
                if self.history.len() >= 2 * per_season {
                    self.model = HoltWinters::fit(&self.history, per_season, SMOOTHING);
                    self.history = Vec::new();
                }
            }
        }
    }

    /// The highest peak forecast over the next `slices` slices after the open one, once two
    /// seasons were seen.
    pub(crate) fn ahead(&self, slices: usize) -> Option<f64> {
        let m = self.model.as_ref()?;
        // The open slice is not in the model yet: it is the first ahead.
        (1..=slices.max(1) + 1)
            .map(|h| m.forecast(h))
            .reduce(f64::max)
            .map(|f| f.clamp(0.0, 1.0))
    }
}
