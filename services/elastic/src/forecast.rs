//! Demand forecasting: additive Holt-Winters (level, trend and one seasonal cycle, e.g. a
//! day of 10-minute buckets), fitted on history and updated with each new observation.

/// An additive Holt-Winters model.
#[derive(Debug, Clone)]
pub struct HoltWinters {
    alpha: f64,
    beta: f64,
    gamma: f64,
    level: f64,
    trend: f64,
    season: Vec<f64>,
    /// Observations seen: the next one is at `t` (its season index is `t % period`).
    t: usize,
}

/// Smoothing factors that suit request rates in 10-minute buckets with a daily cycle.
pub const DEFAULT_SMOOTHING: (f64, f64, f64) = (0.3, 0.01, 0.3);

impl HoltWinters {
    /// Fits on `history` (at least two whole periods), then runs through all of it.
    pub fn fit(
        history: &[f64],
        period: usize,
        (alpha, beta, gamma): (f64, f64, f64),
    ) -> Option<Self> {
        if period == 0 || history.len() < 2 * period {
            return None;
        }
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        let first = mean(&history[..period]);
        let second = mean(&history[period..2 * period]);
        let cycles = history.len() / period;
        let mut season = vec![0.0; period];
        for c in 0..cycles {
            let chunk = &history[c * period..(c + 1) * period];
            let m = mean(chunk);
            for (i, y) in chunk.iter().enumerate() {
                season[i] += (y - m) / cycles as f64;
            }
        }
        let mut model = Self {
            alpha,
            beta,
            gamma,
            level: first,
            trend: (second - first) / period as f64,
            season,
            t: 0,
        };
        for &y in history {
            model.observe(y);
        }
        Some(model)
    }

    /// Takes in the next observation.
    pub fn observe(&mut self, y: f64) {
        let period = self.season.len();
        let i = self.t % period;
        let last_level = self.level;
        self.level =
            self.alpha * (y - self.season[i]) + (1.0 - self.alpha) * (self.level + self.trend);
        self.trend = self.beta * (self.level - last_level) + (1.0 - self.beta) * self.trend;
        self.season[i] = self.gamma * (y - self.level) + (1.0 - self.gamma) * self.season[i];
        self.t += 1;
    }

    /// The forecast `h` observations ahead (1: the next one); never negative.
    pub fn forecast(&self, h: usize) -> f64 {
        let period = self.season.len();
        let i = (self.t + h.max(1) - 1) % period;
        (self.level + h.max(1) as f64 * self.trend + self.season[i]).max(0.0)
    }
}

/// Mean absolute percentage error of (forecast, actual) pairs, skipping zero actuals.
pub fn mape(pairs: &[(f64, f64)]) -> f64 {
    let terms: Vec<f64> = pairs
        .iter()
        .filter(|(_, a)| *a > 0.0)
        .map(|(f, a)| ((f - a) / a).abs())
        .collect();
    if terms.is_empty() {
        0.0
    } else {
        terms.iter().sum::<f64>() / terms.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_seasonal_signal_is_forecast_closely() {
        let period = 24;
        let signal = |t: usize| {
            100.0
                + 50.0 * ((t % period) as f64 / period as f64 * std::f64::consts::TAU).sin()
                + 0.1 * t as f64
        };
        let history: Vec<f64> = (0..3 * period).map(signal).collect();
        let mut m = HoltWinters::fit(&history, period, DEFAULT_SMOOTHING).expect("enough history");
        let mut pairs = Vec::new();
        for t in 3 * period..6 * period {
            pairs.push((m.forecast(1), signal(t)));
            m.observe(signal(t));
        }
        let err = mape(&pairs);
        assert!(err < 0.02, "MAPE {err}");
        // And far better than assuming tomorrow is flat.
        let flat: Vec<(f64, f64)> = (3 * period..6 * period)
            .map(|t| (100.0, signal(t)))
            .collect();
        assert!(mape(&flat) > 5.0 * err);
    }

    #[test]
    fn too_little_history_fits_nothing() {
        assert!(HoltWinters::fit(&[1.0; 10], 6, DEFAULT_SMOOTHING).is_none());
        assert!(HoltWinters::fit(&[1.0; 10], 0, DEFAULT_SMOOTHING).is_none());
        assert_eq!(mape(&[]), 0.0);
        assert_eq!(mape(&[(1.0, 0.0)]), 0.0);
        assert!((mape(&[(90.0, 100.0), (110.0, 100.0)]) - 0.1).abs() < 1e-12);
    }
}
