//! Fair share over time: each tenant's past GPU use, decayed with a half-life, as Slurm's
//! fair-tree and Kueue's admission fair sharing keep it. With it on, a tenant that used the
//! fleet all week yields spare capacity to one that did not, beside what each holds now.
//! Pure: the pass records what was held and when; no clock of its own.

use std::collections::HashMap;

/// Decayed GPU-seconds per quota queue (tenant id).
#[derive(Debug, Clone, PartialEq)]
pub struct PastUsage {
    half_life_secs: f64,
    by_queue: HashMap<String, f64>,
    /// When the last record was made (Unix seconds).
    at: Option<f64>,
}

impl PastUsage {
    /// `half_life`: after it, past use counts half as much.
    pub fn new(half_life: std::time::Duration) -> Self {
        Self {
            half_life_secs: half_life.as_secs_f64().max(1.0),
            by_queue: HashMap::new(),
            at: None,
        }
    }

    /// Decays what was recorded to `now` and adds what `holding` (queue, GPUs held) held
    /// since the last record, as if held throughout (passes are seconds apart). A clock
    /// that went back records nothing.
    pub fn record<'a>(&mut self, now: f64, holding: impl IntoIterator<Item = (&'a str, f64)>) {
        let Some(at) = self.at.replace(now) else {
            return;
        };
        let dt = now - at;
        if dt <= 0.0 {
            return;
        }
        let decay = (-dt / self.half_life_secs).exp2();
        for used in self.by_queue.values_mut() {
            *used *= decay;
        }
        // What was held over the interval, decayed from its middle.
        let mid_decay = (-dt / 2.0 / self.half_life_secs).exp2();
        for (queue, gpus) in holding {
            *self.by_queue.entry(queue.to_owned()).or_default() += gpus * dt * mid_decay;
        }
        self.by_queue.retain(|_, u| *u > 1e-6);
    }

    /// Decayed GPU-seconds by queue.
    pub fn by_queue(&self) -> &HashMap<String, f64> {
        &self.by_queue
    }

    /// When the last record was made (Unix seconds), if any.
    pub fn recorded_at(&self) -> Option<f64> {
        self.at
    }

    /// Takes up a history saved at `recorded_at` (Unix seconds), as its recorder would have
    /// carried on: the next record adds what is held then over the time since, as if held
    /// throughout (jobs run on while no leader records them), but for at most `max_gap`
    /// seconds before `now` (a control plane down longer counts the rest as no use: its
    /// jobs were stopped by then). Taken up at once, with the next record at the same
    /// moment the recorder's would have been, it decides exactly as the recorder would.
    pub fn restore(
        &mut self,
        by_queue: HashMap<String, f64>,
        recorded_at: f64,
        now: f64,
        max_gap: f64,
    ) {
        let resume = recorded_at
            .max(now - max_gap.max(0.0))
            .min(now.max(recorded_at));
        let decay = (-(resume - recorded_at).max(0.0) / self.half_life_secs).exp2();
        self.by_queue = by_queue
            .into_iter()
            .filter(|(_, u)| u.is_finite() && *u > 0.0)
            .map(|(q, u)| (q, u * decay))
            .filter(|(_, u)| *u > 1e-6)
            .collect();
        self.at = Some(resume);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_use_halves_each_half_life_and_holding_adds_to_it() {
        let mut p = PastUsage::new(std::time::Duration::from_secs(100));
        p.record(0.0, [("a", 2.0)]);
        assert!(
            p.by_queue().is_empty(),
            "the first record only sets the clock"
        );
        p.record(10.0, [("a", 2.0)]);
        let a = p.by_queue()["a"];
        assert!((a - 20.0 * (-0.05f64).exp2()).abs() < 1e-9, "{a}");
        p.record(110.0, []);
        assert!(
            (p.by_queue()["a"] - a / 2.0).abs() < 1e-9,
            "halved after one half-life"
        );
        // A clock that went back changes nothing.
        let before = p.clone();
        p.record(50.0, [("a", 100.0)]);
        assert_eq!(p.by_queue(), before.by_queue());
    }

    #[test]
    fn a_saved_history_is_taken_up_as_its_recorder_would_have_carried_on() {
        // The recorder: records at 0, 10, then 20.
        let mut recorder = PastUsage::new(std::time::Duration::from_secs(100));
        recorder.record(0.0, [("a", 2.0)]);
        recorder.record(10.0, [("a", 2.0)]);
        // Another takes up what it saved at 10, at 15, and records at 20 as it would have.
        let mut next = PastUsage::new(std::time::Duration::from_secs(100));
        next.restore(
            HashMap::from([
                ("a".to_owned(), recorder.by_queue()["a"]),
                ("b".into(), -1.0),
            ]),
            10.0,
            15.0,
            600.0,
        );
        assert_eq!(next.by_queue().len(), 1, "nonsense left out");
        recorder.record(20.0, [("a", 2.0)]);
        next.record(20.0, [("a", 2.0)]);
        assert_eq!(next.by_queue(), recorder.by_queue(), "the same history");
        assert_eq!(next.recorded_at(), Some(20.0));

        // Down longer than `max_gap`: only the last `max_gap` counts as held.
        let mut late = PastUsage::new(std::time::Duration::from_secs(100));
        late.restore(HashMap::from([("a".to_owned(), 80.0)]), 0.0, 260.0, 60.0);
        assert!((late.by_queue()["a"] - 20.0).abs() < 1e-9, "decayed to 200");
        assert_eq!(late.recorded_at(), Some(200.0));
        late.record(260.0, [("a", 1.0)]);
        let expected = 20.0 * (-0.6f64).exp2() + 60.0 * (-0.3f64).exp2();
        assert!((late.by_queue()["a"] - expected).abs() < 1e-9, "60 s held");
    }
}
