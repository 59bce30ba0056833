//! Queue waits of requests served by `c` identical replicas (M/M/c, Erlang C), and
//! percentiles of the wait over many intervals, weighted by the requests in each.

/// The probability an arriving request waits, with `c` servers and offered load `a`
/// (arrival rate over one server's service rate); 1 when the servers cannot keep up.
pub fn erlang_c(c: u32, a: f64) -> f64 {
    if c == 0 || a >= f64::from(c) {
        return 1.0;
    }
    if a <= 0.0 {
        return 0.0;
    }
    // Erlang B by its stable recurrence, then C from B.
    let mut b = 1.0;
    for k in 1..=c {
        b = a * b / (f64::from(k) + a * b);
    }
    let rho = a / f64::from(c);
    b / (1.0 - rho * (1.0 - b))
}

/// The waits of the requests of one interval.
#[derive(Debug, Clone, Copy)]
pub enum Waits {
    /// Steady state: P(wait > t) = `p_wait` * exp(-`rate` t), rate in 1/ms.
    Steady { p_wait: f64, rate: f64 },
    /// A backlog: every request waits about this long (ms).
    Backlog { ms: f64 },
}

impl Waits {
    /// With `c` replicas each serving `mu` requests a second, `lambda` arriving a second,
    /// and `backlog` requests already queued.
    pub fn of(c: u32, lambda: f64, mu: f64, backlog: f64) -> Self {
        let capacity = f64::from(c) * mu;
        if backlog > 0.5 || lambda >= capacity || c == 0 {
            let ms = if capacity > 0.0 {
                (backlog.max(0.0) + 0.5 * (lambda - capacity).max(0.0)) / capacity * 1000.0
            } else {
                f64::INFINITY
            };
            return Waits::Backlog { ms };
        }
        Waits::Steady {
            p_wait: erlang_c(c, lambda / mu),
            rate: (capacity - lambda) / 1000.0,
        }
    }

    fn above(&self, ms: f64) -> f64 {
        match *self {
            Waits::Steady { p_wait, rate } => p_wait * (-rate * ms).exp(),
            Waits::Backlog { ms: w } => f64::from(u8::from(w > ms)),
        }
    }
}

/// The `q` quantile (e.g. 0.999) of the wait over `(requests, waits)` intervals, in ms (at
/// most `cap_ms`).
pub fn quantile(intervals: &[(f64, Waits)], q: f64, cap_ms: f64) -> f64 {
    let total: f64 = intervals.iter().map(|(n, _)| n).sum();
    if total <= 0.0 {
        return 0.0;
    }
    let share_above = |ms: f64| intervals.iter().map(|(n, w)| n * w.above(ms)).sum::<f64>() / total;
    if share_above(0.0) <= 1.0 - q {
        return 0.0;
    }
    if share_above(cap_ms) > 1.0 - q {
        return cap_ms;
    }
    let (mut lo, mut hi) = (0.0, cap_ms);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if share_above(mid) > 1.0 - q {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erlang_c_matches_known_values() {
        // One server: the probability of waiting is the utilization.
        assert!((erlang_c(1, 0.5) - 0.5).abs() < 1e-12);
        // Two servers at a = 1: C = 1/3.
        assert!((erlang_c(2, 1.0) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(erlang_c(4, 4.0), 1.0);
        assert_eq!(erlang_c(4, 0.0), 0.0);
        // Pooling: the same utilization on more servers waits less often.
        assert!(erlang_c(80, 48.0) < erlang_c(8, 4.8));
    }

    #[test]
    fn quantiles_weigh_intervals_by_their_requests() {
        let calm = Waits::of(10, 100.0, 40.0, 0.0);
        let jam = Waits::of(10, 500.0, 40.0, 2000.0);
        // 0.05% of requests in a jam: p99.9 stays calm, p99.99 sees the jam.
        let mix = [(9995.0, calm), (5.0, jam)];
        let p999 = quantile(&mix, 0.999, 60_000.0);
        let p9999 = quantile(&mix, 0.9999, 60_000.0);
        assert!(p999 < 5.0, "{p999}");
        assert!(p9999 > 1000.0, "{p9999}");
        assert_eq!(quantile(&[], 0.99, 1000.0), 0.0);
    }
}
