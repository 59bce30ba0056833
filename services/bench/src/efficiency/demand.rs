//! The demand a replay sends: per service, the share of one GPU its requests keep busy over
//! time, read from a file (`t_s,service,busy[,gpu_memory_bytes,requested_gpus]`) or made
//! from a seed (`synthetic:SEED`), and turned into an open-loop Poisson stream of requests
//! compressed in time. What the control plane is told of it: nothing but what the mode
//! submits (a whole GPU, the owner's requested share, or `auto`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use rand::{Rng, SeedableRng};

use super::load::Request;

/// One service's demand: steps of (from second, busy share of one GPU), sorted.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    pub name: String,
    pub steps: Vec<(f64, f64)>,
    /// What its owner asked for, in GPUs (a share below 1, or whole GPUs).
    pub requested_gpus: f64,
    /// The GPU memory it holds, if the demand says.
    pub gpu_memory_bytes: Option<u64>,
}

impl Service {
    /// Its busy share at second `t` of the demand.
    pub fn busy_at(&self, t: f64) -> f64 {
        let i = self.steps.partition_point(|(at, _)| *at <= t);
        if i == 0 { 0.0 } else { self.steps[i - 1].1 }
    }

    /// Its mean busy share over `[0, span)`.
    pub fn mean(&self, span: f64) -> f64 {
        if span <= 0.0 {
            return 0.0;
        }
        let mut total = 0.0;
        for (i, (at, busy)) in self.steps.iter().enumerate() {
            let end = self
                .steps
                .get(i + 1)
                .map_or(span, |(next, _)| *next)
                .min(span);
            total += busy * (end - at.min(span)).max(0.0);
        }
        total / span
    }
}

/// A fleet's demand over `span` seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub services: Vec<Service>,
    pub span: f64,
}

impl Demand {
    /// `FILE.csv` or `synthetic:SEED`.
    pub fn load(spec: &str, synthetic_services: usize) -> anyhow::Result<Self> {
        match spec.strip_prefix("synthetic:") {
            Some(seed) => {
                let seed = seed
                    .parse()
                    .with_context(|| format!("--demand {spec}: the seed is a number"))?;
                Ok(synthetic(seed, synthetic_services))
            }
            None => {
                let text = std::fs::read_to_string(spec)
                    .with_context(|| format!("reading the demand file {spec}"))?;
                parse(&text).with_context(|| format!("the demand file {spec}"))
            }
        }
    }

    /// The requests of services `0..n` (in `self.services` order) for the demand replayed
    /// `time_scale` times faster: service `i`'s rate at replay time `t` is its busy share at
    /// `t × time_scale` over `request_cost_s`, its arrivals Poisson (drawn from `seed`).
    pub fn requests(&self, time_scale: f64, request_cost_s: f64, seed: u64) -> Vec<Request> {
        let mut requests = Vec::new();
        let replay = self.span / time_scale;
        for (service, s) in self.services.iter().enumerate() {
            let mut rng =
                rand::rngs::StdRng::seed_from_u64(seed ^ ((service as u64 + 1) * 0x9e37_79b9));
            let peak = s.steps.iter().map(|(_, b)| *b).fold(0.0, f64::max) / request_cost_s;
            if peak <= 0.0 {
                continue;
            }
            // Thinning: arrivals at the peak rate, each kept with the rate then over it.
            let mut t = 0.0;
            loop {
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                t += -u.ln() / peak;
                if t >= replay {
                    break;
                }
                let rate = s.busy_at(t * time_scale) / request_cost_s;
                if rng.random_range(0.0..1.0) < rate / peak {
                    requests.push(Request {
                        at: Duration::from_secs_f64(t),
                        service,
                    });
                }
            }
        }
        requests.sort_by_key(|r| r.at);
        requests
    }
}

impl Demand {
    /// The fewest GPUs an oracle would host the services on, averaged over the demand's
    /// minutes: each minute, every service's busy share with `headroom` (0.15: 15%) packed
    /// first-fit-decreasing onto GPUs filled to at most `fill` (0.9), as if each service's
    /// demand were known in advance and moving one cost nothing. What no scheduler does
    /// better; the replay reports it beside what Allot did.
    pub fn oracle_gpus(&self, headroom: f64, fill: f64) -> f64 {
        let minutes = (self.span / 60.0).ceil().max(1.0) as usize;
        let mut total = 0usize;
        for k in 0..minutes {
            let t = k as f64 * 60.0;
            let mut items: Vec<f64> = self
                .services
                .iter()
                .map(|s| (s.busy_at(t) * (1.0 + headroom)).min(fill))
                .collect();
            items.sort_by(|a, b| b.total_cmp(a));
            let mut bins: Vec<f64> = Vec::new();
            for x in items {
                match bins.iter_mut().find(|b| **b + x <= fill + 1e-9) {
                    Some(b) => *b += x,
                    None => bins.push(x),
                }
            }
            total += bins.iter().filter(|b| **b > 0.0).count();
        }
        total as f64 / minutes as f64
    }
}

/// Reads `t_s,service,busy[,gpu_memory_bytes,requested_gpus]` (a header first; columns by
/// name, in any order).
pub fn parse(text: &str) -> anyhow::Result<Demand> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines
        .next()
        .context("an empty file: the header is t_s,service,busy")?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name);
    let (Some(t_col), Some(s_col), Some(b_col)) = (col("t_s"), col("service"), col("busy")) else {
        bail!("the header `{header}` lacks t_s, service or busy");
    };
    let (m_col, r_col) = (col("gpu_memory_bytes"), col("requested_gpus"));
    let mut by_name: BTreeMap<String, Service> = BTreeMap::new();
    let mut order = Vec::new();
    let mut last_t: f64 = 0.0;
    for (n, line) in lines {
        let row = n + 1;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let get = |i: usize, name: &str| {
            fields
                .get(i)
                .copied()
                .with_context(|| format!("row {row}: no {name}"))
        };
        let number = |i: usize, name: &str| -> anyhow::Result<f64> {
            let v: f64 = get(i, name)?
                .parse()
                .with_context(|| format!("row {row}: {name} is not a number"))?;
            if !v.is_finite() {
                bail!("row {row}: {name} is not a finite number");
            }
            Ok(v)
        };
        let t = number(t_col, "t_s")?;
        let busy = number(b_col, "busy")?;
        if t < 0.0 {
            bail!("row {row}: t_s is negative");
        }
        if !(0.0..=1.0).contains(&busy) {
            bail!("row {row}: busy must be from 0 to 1 (a share of one GPU)");
        }
        let name = get(s_col, "service")?.to_owned();
        if name.is_empty() {
            bail!("row {row}: the service is empty");
        }
        let s = by_name.entry(name.clone()).or_insert_with(|| {
            order.push(name.clone());
            Service {
                name: name.clone(),
                steps: Vec::new(),
                requested_gpus: 1.0,
                gpu_memory_bytes: None,
            }
        });
        if s.steps.last().is_some_and(|(at, _)| t <= *at) {
            bail!("row {row}: service {name}'s rows go forward in time");
        }
        s.steps.push((t, busy));
        if let Some(i) = r_col
            && let Some(v) = fields.get(i).filter(|v| !v.is_empty())
        {
            let r: f64 = v
                .parse()
                .with_context(|| format!("row {row}: requested_gpus is not a number"))?;
            if !(r > 0.0 && r <= 8.0) {
                bail!("row {row}: requested_gpus must be above 0, at most 8");
            }
            s.requested_gpus = r;
        }
        if let Some(i) = m_col
            && let Some(v) = fields.get(i).filter(|v| !v.is_empty())
        {
            s.gpu_memory_bytes =
                Some(v.parse().with_context(|| {
                    format!("row {row}: gpu_memory_bytes is not a whole number")
                })?);
        }
        last_t = last_t.max(t);
    }
    if by_name.is_empty() {
        bail!("no rows after the header");
    }
    // The last row of each service holds for one more step: the file's median spacing.
    let mut gaps: Vec<f64> = by_name
        .values()
        .flat_map(|s| s.steps.windows(2).map(|w| w[1].0 - w[0].0))
        .collect();
    gaps.sort_by(f64::total_cmp);
    let step = gaps.get(gaps.len() / 2).copied().unwrap_or(60.0);
    let services = order
        .into_iter()
        .filter_map(|n| by_name.remove(&n))
        .collect();
    Ok(Demand {
        services,
        span: last_t + step,
    })
}

/// A day of `n` services (one row a minute): each with a base load drawn log-uniformly
/// from 0.5% to 20% of a GPU, a daily curve (busiest at a time of its own), seeded bursts
/// of two to four times its load for 5 to 30 minutes, and an owner who asked for 2 to 10
/// times its mean, up to a whole GPU. The base range makes what production serving traces
/// show of inference GPUs held exclusively: single-digit mean duty cycles (about 6% over a
/// fleet) with a heavy tail (a few services twenty times busier than the rest).
pub fn synthetic(seed: u64, n: usize) -> Demand {
    const DAY: f64 = 86_400.0;
    const STEP: f64 = 60.0;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let services = (0..n)
        .map(|i| {
            let base = (0.005f64.ln() + rng.random_range(0.0..1.0) * (0.20f64 / 0.005).ln()).exp();
            let swing = rng.random_range(0.3..0.8);
            let peak_at = rng.random_range(0.0..DAY);
            let bursts: Vec<(f64, f64, f64)> = (0..rng.random_range(1..=4))
                .map(|_| {
                    let from = rng.random_range(0.0..DAY);
                    (
                        from,
                        from + rng.random_range(300.0..1800.0),
                        rng.random_range(2.0..4.0),
                    )
                })
                .collect();
            let steps: Vec<(f64, f64)> = (0..(DAY / STEP) as usize)
                .map(|k| {
                    let t = k as f64 * STEP;
                    let phase = 2.0 * std::f64::consts::PI * (t - peak_at) / DAY;
                    let mut busy = base * (1.0 + swing * phase.cos());
                    for (from, to, factor) in &bursts {
                        if (*from..*to).contains(&t) {
                            busy *= factor;
                        }
                    }
                    (t, busy.clamp(0.0, 0.95))
                })
                .collect();
            let mut s = Service {
                name: format!("svc-{i}"),
                steps,
                requested_gpus: 1.0,
                gpu_memory_bytes: None,
            };
            let over = rng.random_range(2.0..10.0);
            s.requested_gpus = (s.mean(DAY) * over).clamp(0.05, 1.0);
            s
        })
        .collect();
    Demand {
        services,
        span: DAY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_as_steps_per_service_and_bad_rows_name_what_is_wrong() {
        let d =
            parse("t_s,service,busy,requested_gpus\n0,a,0.1,0.5\n0,b,0.2,\n60,a,0.4,\n120,a,0\n")
                .expect("demand");
        assert_eq!(d.services.len(), 2);
        assert_eq!(d.services[0].name, "a");
        assert_eq!(d.services[0].requested_gpus, 0.5);
        assert_eq!(d.services[1].requested_gpus, 1.0);
        assert_eq!(d.span, 180.0, "the last row holds one more step");
        assert_eq!(d.services[0].busy_at(59.0), 0.1);
        assert_eq!(d.services[0].busy_at(60.0), 0.4);
        assert!((d.services[0].mean(180.0) - 0.5 / 3.0).abs() < 1e-9);
        for (bad, says) in [
            ("t,service,busy\n0,a,1\n", "lacks"),
            ("t_s,service,busy\n0,a,1.5\n", "from 0 to 1"),
            ("t_s,service,busy\n0,a,x\n", "busy is not a number"),
            ("t_s,service,busy\n5,a,0.1\n5,a,0.2\n", "forward in time"),
            ("t_s,service,busy\n", "no rows"),
        ] {
            let err = format!("{:#}", parse(bad).expect_err(bad));
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn requests_follow_the_demand_compressed_in_time() {
        let d =
            parse("t_s,service,busy\n0,a,0.2\n600,a,0.0\n1200,a,0.4\n1800,a,0\n").expect("demand");
        // 2400 s replayed 60 times faster: 40 s; requests of 3 ms: 0.2 → 66.7 per second.
        let r = d.requests(60.0, 0.003, 7);
        let count = |from: f64, to: f64| {
            r.iter()
                .filter(|q| (from..to).contains(&q.at.as_secs_f64()))
                .count() as f64
        };
        assert!(
            (count(0.0, 10.0) / 10.0 - 66.7).abs() < 10.0,
            "{}",
            count(0.0, 10.0)
        );
        assert_eq!(count(10.0, 20.0), 0.0);
        assert!((count(20.0, 30.0) / 10.0 - 133.3).abs() < 15.0);
        assert_eq!(count(30.0, 41.0), 0.0);
        assert_eq!(r, d.requests(60.0, 0.003, 7), "seeded");
    }

    #[test]
    fn a_synthetic_day_is_seeded_heterogeneous_and_over_requested() {
        let a = synthetic(1, 8);
        assert_eq!(a, synthetic(1, 8));
        assert_ne!(a, synthetic(2, 8));
        let means: Vec<f64> = a.services.iter().map(|s| s.mean(a.span)).collect();
        let (lo, hi) = means
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), m| (l.min(*m), h.max(*m)));
        assert!(hi / lo > 3.0, "heterogeneous: {means:?}");
        for s in &a.services {
            assert!(
                s.requested_gpus >= s.mean(a.span) * 1.9 || s.requested_gpus == 1.0,
                "{}",
                s.name
            );
        }
        // Single-digit mean duty cycles over a fleet, as production serving traces show.
        for seed in 1..=3 {
            let d = synthetic(seed, 10);
            let fleet = d.services.iter().map(|s| s.mean(d.span)).sum::<f64>() / 10.0;
            assert!((0.02..0.10).contains(&fleet), "seed {seed}: {fleet}");
        }
    }

    #[test]
    fn the_oracle_packs_what_each_minute_needs() {
        // Two services at 0.4 and one at 0.3 all day: 0.46 + 0.46 + 0.345 with 15%
        // headroom, two GPUs filled to 0.9.
        let d =
            parse("t_s,service,busy\n0,a,0.4\n0,b,0.4\n0,c,0.3\n60,a,0.4\n60,b,0.4\n60,c,0.3\n")
                .expect("demand");
        assert_eq!(d.oracle_gpus(0.15, 0.9), 2.0);
        // Without headroom, on whole GPUs: 1.1 needs two still; at 0.1 each, one.
        assert_eq!(d.oracle_gpus(0.0, 1.0), 2.0);
        let small =
            parse("t_s,service,busy\n0,a,0.1\n0,b,0.1\n60,a,0.1\n60,b,0.1\n").expect("demand");
        assert_eq!(small.oracle_gpus(0.15, 0.9), 1.0);
    }
}
