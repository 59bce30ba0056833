//! The open-loop load: every request's send time is drawn in advance from a seed (Poisson
//! arrivals per service, at a rate following a diurnal curve, with bursts), sent at that
//! time whether or not earlier requests were answered, and timed from that scheduled time
//! to its answer, so a stalled server shows up as latency and not as fewer requests (no
//! coordinated omission). Requests that cannot be sent are refused; those unanswered when
//! the run ends are lost.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::time::Instant;

/// The load's shape.
#[derive(Debug, Clone)]
pub struct Shape {
    /// How long requests are sent.
    pub duration: Duration,
    /// Each service's mean request rate over the run (requests per second).
    pub mean_rps: f64,
    /// The diurnal swing: the rate goes from `1 − swing` times the mean (night) to
    /// `1 + swing` times it (midday)…
    pub swing: f64,
    /// …midday being this fraction of the way through the run (0.5: the run is one day
    /// from midnight to midnight; 0.25: it starts at dawn).
    pub peak_at: f64,
    /// Bursts per service over the run, on average.
    pub bursts_per_service: f64,
    /// A burst multiplies its service's rate by a factor drawn from this range…
    pub burst_factor: (f64, f64),
    /// …for a length drawn from this range (seconds).
    pub burst_secs: (f64, f64),
}

/// A burst of one service's load.
#[derive(Debug, Clone, PartialEq)]
pub struct Burst {
    pub service: usize,
    pub from_s: f64,
    pub to_s: f64,
    pub factor: f64,
}

/// One request: when it is sent (from the start of the load) and to which service.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    pub at: Duration,
    pub service: usize,
}

/// The diurnal curve at fraction `f` (0 to 1) of the run: its peak at `peak_at`, its trough
/// half a day away; its mean over the run is 1.
pub fn diurnal(f: f64, swing: f64, peak_at: f64) -> f64 {
    1.0 + swing * (2.0 * std::f64::consts::PI * (f - peak_at)).cos()
}

/// Service `service`'s rate (requests per second) at `t` seconds.
pub fn rate(shape: &Shape, bursts: &[Burst], service: usize, t: f64) -> f64 {
    let f = t / shape.duration.as_secs_f64().max(1e-9);
    let burst: f64 = bursts
        .iter()
        .filter(|b| b.service == service && (b.from_s..b.to_s).contains(&t))
        .map(|b| b.factor)
        .product();
    shape.mean_rps * diurnal(f, shape.swing, shape.peak_at) * burst
}

/// The bursts and the requests of `services` services, sorted by send time.
pub fn schedule(shape: &Shape, services: usize, seed: u64) -> (Vec<Burst>, Vec<Request>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let total = shape.duration.as_secs_f64();
    let mut bursts = Vec::new();
    for service in 0..services {
        // Poisson-many bursts at uniform times.
        let mut n = 0;
        let mut acc = rng.random::<f64>();
        let limit = (-shape.bursts_per_service).exp();
        while acc > limit {
            n += 1;
            acc *= rng.random::<f64>();
        }
        for _ in 0..n {
            let len = rng.random_range(shape.burst_secs.0..=shape.burst_secs.1);
            let from_s = rng.random_range(0.0..(total - len).max(f64::MIN_POSITIVE));
            bursts.push(Burst {
                service,
                from_s,
                to_s: from_s + len,
                factor: rng.random_range(shape.burst_factor.0..=shape.burst_factor.1),
            });
        }
    }
    let mut requests = Vec::new();
    for service in 0..services {
        // Thinning: candidates at the highest rate the service can reach, each kept with
        // the probability its rate at that time over the highest.
        let peak_burst: f64 = bursts
            .iter()
            .filter(|b| b.service == service)
            .map(|b| b.factor)
            .product::<f64>()
            .max(1.0);
        let max = shape.mean_rps * (1.0 + shape.swing) * peak_burst;
        if max <= 0.0 {
            continue;
        }
        let mut t = 0.0;
        loop {
            t += -(1.0 - rng.random::<f64>()).ln() / max;
            if t >= total {
                break;
            }
            if rng.random::<f64>() * max < rate(shape, &bursts, service, t) {
                requests.push(Request {
                    at: Duration::from_secs_f64(t),
                    service,
                });
            }
        }
    }
    requests.sort_by_key(|r| r.at);
    (bursts, requests)
}

/// What the load saw.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Each answered request: when it was due (from the start) and its latency
    /// (milliseconds from then).
    pub latencies_ms: Vec<(Duration, f64)>,
    pub sent: u64,
    /// Requests that could not be sent (no replica of their service reachable).
    pub refused: u64,
    /// Requests sent and never answered.
    pub lost: u64,
}

/// The replicas each service's requests go to, in turn; replicas come and go while the
/// load runs. As a load balancer with retries does: a request whose replica goes away
/// before answering is sent again to another (or the service's next) replica, and a request
/// for a service with no replica waits for one, up to [`HOLD`]; either way its latency
/// counts from when it was due.
#[derive(Clone, Default)]
pub struct Router {
    inner: Arc<Mutex<Routes>>,
}

/// The longest a request waits for a replica of its service before it is refused.
pub const HOLD: Duration = Duration::from_secs(10);

/// A replica's connection, shared by the sends to it.
type Conn = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

#[derive(Default)]
struct Routes {
    /// Per service: each replica's key and connection.
    replicas: HashMap<usize, Vec<(String, Conn)>>,
    next: HashMap<usize, usize>,
    /// Requests sent to each replica (by key) and not answered yet, with their service.
    outstanding: HashMap<String, HashMap<u64, usize>>,
    /// Requests whose replica went away before answering: (id, service), to send again.
    retry: Vec<(u64, usize)>,
}

/// Where answers go: each request's id and when its answer came.
pub type Answers = Arc<Mutex<Vec<(u64, Instant)>>>;

impl Router {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connects to a replica of `service` at `addr`, under `key` (unique to this
    /// connection); its answers are recorded in `answers` until `until`. When it closes,
    /// it leaves the rotation and what it had not answered is sent again.
    pub async fn add(
        &self,
        service: usize,
        key: &str,
        addr: SocketAddr,
        answers: &Answers,
        until: Instant,
    ) -> std::io::Result<()> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut read, write) = stream.into_split();
        let answers = answers.clone();
        let router = self.clone();
        let reader_key = key.to_owned();
        tokio::spawn(async move {
            let mut buf = [0u8; 8];
            while let Ok(Ok(_)) = tokio::time::timeout_at(until, read.read_exact(&mut buf)).await {
                let now = Instant::now();
                let id = u64::from_le_bytes(buf);
                answers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((id, now));
                if let Some(o) = router.routes().outstanding.get_mut(&reader_key) {
                    o.remove(&id);
                }
            }
            // Gone (or the run is over): out of the rotation, its unanswered requests again.
            let mut routes = router.routes();
            for list in routes.replicas.values_mut() {
                list.retain(|(k, _)| *k != reader_key);
            }
            if let Some(o) = routes.outstanding.remove(&reader_key) {
                routes.retry.extend(o);
            }
        });
        let mut routes = self.routes();
        routes
            .replicas
            .entry(service)
            .or_default()
            .push((key.to_owned(), Arc::new(tokio::sync::Mutex::new(write))));
        routes.outstanding.entry(key.to_owned()).or_default();
        Ok(())
    }

    /// Sends no more requests to the replica `key` (those sent to it are still answered).
    pub fn remove(&self, key: &str) {
        let mut routes = self.routes();
        for list in routes.replicas.values_mut() {
            list.retain(|(k, _)| k != key);
        }
    }

    /// The replica of `service` whose turn it is, `id` counted as sent to it.
    fn pick(&self, service: usize, id: u64) -> Option<(String, Conn)> {
        let mut routes = self.routes();
        let n = routes.replicas.get(&service).map_or(0, Vec::len);
        if n == 0 {
            return None;
        }
        let turn = routes.next.entry(service).or_default();
        let i = *turn % n;
        *turn = turn.wrapping_add(1);
        let (key, conn) = routes.replicas.get(&service).map(|l| l[i].clone())?;
        routes
            .outstanding
            .entry(key.clone())
            .or_default()
            .insert(id, service);
        Some((key, conn))
    }

    /// Requests to send again, taken.
    fn retries(&self) -> Vec<(u64, usize)> {
        std::mem::take(&mut self.routes().retry)
    }

    /// A send of `id` to `key` failed: sent again.
    fn failed(&self, key: &str, id: u64, service: usize) {
        let mut routes = self.routes();
        if let Some(o) = routes.outstanding.get_mut(key) {
            o.remove(&id);
        }
        routes.retry.push((id, service));
    }
}

/// The sends of one run: those in flight, those waiting for a replica, when each was due.
struct Sends<'r> {
    router: &'r Router,
    tasks: tokio::task::JoinSet<()>,
    /// Requests whose service has no replica now: (id, service).
    waiting: Vec<(u64, usize)>,
    due: HashMap<u64, Instant>,
    refused: u64,
}

impl Sends<'_> {
    /// Sends `id` on a task of its own, or keeps it waiting for a replica.
    fn send(&mut self, id: u64, service: usize) {
        let Some((key, conn)) = self.router.pick(service, id) else {
            self.waiting.push((id, service));
            return;
        };
        let router = self.router.clone();
        self.tasks.spawn(async move {
            if conn
                .lock()
                .await
                .write_all(&id.to_le_bytes())
                .await
                .is_err()
            {
                router.failed(&key, id, service);
            }
        });
    }

    /// Sends again what lost its replica, and what waits where a replica now is; refuses
    /// what waited longer than [`HOLD`].
    fn sweep(&mut self) {
        let now = Instant::now();
        let mut again = self.router.retries();
        again.append(&mut self.waiting);
        for (id, service) in again {
            let waited = self
                .due
                .get(&id)
                .map_or(Duration::ZERO, |d| now.saturating_duration_since(*d));
            if waited > HOLD {
                self.due.remove(&id);
                self.refused += 1;
            } else {
                self.send(id, service);
            }
        }
        while self.tasks.try_join_next().is_some() {}
    }
}

/// Sends `requests` through `router` from `start`, and waits up to `drain` after the last
/// scheduled send for answers (sending again meanwhile what lost its replica).
pub async fn run(
    router: &Router,
    answers: &Answers,
    requests: &[Request],
    start: Instant,
    drain: Duration,
) -> Outcome {
    let mut sends = Sends {
        router,
        tasks: tokio::task::JoinSet::new(),
        waiting: Vec::new(),
        due: HashMap::with_capacity(requests.len()),
        refused: 0,
    };
    for (id, r) in requests.iter().enumerate() {
        let scheduled = start + r.at;
        // While requests wait for a replica, they are tried every 10 ms.
        while Instant::now() < scheduled {
            if sends.waiting.is_empty() {
                tokio::time::sleep_until(scheduled).await;
            } else {
                let tick = Instant::now() + Duration::from_millis(10);
                tokio::time::sleep_until(scheduled.min(tick)).await;
            }
            sends.sweep();
        }
        let id = id as u64;
        sends.due.insert(id, scheduled);
        sends.send(id, r.service);
        sends.sweep();
    }
    let last = start + requests.last().map_or(Duration::ZERO, |r| r.at);
    while Instant::now() < last + drain {
        tokio::time::sleep(Duration::from_millis(10)).await;
        sends.sweep();
    }
    while sends.tasks.join_next().await.is_some() {}
    // Still waiting for a replica at the end: refused.
    for (id, _) in std::mem::take(&mut sends.waiting) {
        sends.due.remove(&id);
        sends.refused += 1;
    }
    let mut outcome = Outcome {
        refused: sends.refused,
        ..Outcome::default()
    };
    let answered = std::mem::take(&mut *answers.lock().unwrap_or_else(|e| e.into_inner()));
    for (id, at) in answered {
        if let Some(scheduled) = sends.due.remove(&id) {
            outcome.latencies_ms.push((
                scheduled.saturating_duration_since(start),
                at.saturating_duration_since(scheduled).as_secs_f64() * 1e3,
            ));
        }
    }
    outcome.lost = sends.due.len() as u64;
    outcome.sent = outcome.latencies_ms.len() as u64 + outcome.lost;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            duration: Duration::from_secs(600),
            mean_rps: 20.0,
            swing: 0.5,
            peak_at: 0.5,
            bursts_per_service: 1.0,
            burst_factor: (1.5, 2.5),
            burst_secs: (10.0, 30.0),
        }
    }

    #[test]
    fn the_diurnal_curve_has_a_trough_at_the_ends_a_peak_midway_and_mean_one() {
        assert!((diurnal(0.0, 0.5, 0.5) - 0.5).abs() < 1e-9);
        assert!((diurnal(0.5, 0.5, 0.5) - 1.5).abs() < 1e-9);
        // Starting at dawn: day in the first half, night in the second.
        assert!((diurnal(0.25, 0.8, 0.25) - 1.8).abs() < 1e-9);
        assert!((diurnal(0.75, 0.8, 0.25) - 0.2).abs() < 1e-9);
        for peak_at in [0.25, 0.5] {
            let mean: f64 = (0..1000)
                .map(|i| diurnal(f64::from(i) / 1000.0, 0.5, peak_at))
                .sum::<f64>()
                / 1000.0;
            assert!((mean - 1.0).abs() < 1e-3, "{mean}");
        }
    }

    #[test]
    fn a_schedule_is_the_seeds_and_follows_the_rate() {
        let (b1, r1) = schedule(&shape(), 4, 7);
        let (b2, r2) = schedule(&shape(), 4, 7);
        assert_eq!((b1.clone(), r1.clone()), (b2, r2));
        let (_, other) = schedule(&shape(), 4, 8);
        assert_ne!(r1, other, "another seed, another load");
        assert!(
            r1.windows(2).all(|w| w[0].at <= w[1].at),
            "sorted by send time"
        );
        // Each service's count is about its integrated rate (Poisson: within 5 sigma).
        for s in 0..4 {
            let expected: f64 = (0..6000)
                .map(|i| rate(&shape(), &b1, s, f64::from(i) / 10.0) / 10.0)
                .sum();
            let got = r1.iter().filter(|r| r.service == s).count() as f64;
            assert!(
                (got - expected).abs() < 5.0 * expected.sqrt(),
                "service {s}: {got} requests, {expected:.0} expected"
            );
        }
        // Midday carries more than the night.
        let night = r1
            .iter()
            .filter(|r| r.at < Duration::from_secs(100))
            .count();
        let noon = r1
            .iter()
            .filter(|r| (250..350).contains(&r.at.as_secs()))
            .count();
        assert!(noon > 2 * night, "noon {noon}, night {night}");
    }

    #[tokio::test]
    async fn a_stalled_server_shows_as_latency_from_the_scheduled_send() {
        // A server that answers each request only after 300 ms, one at a time: requests
        // sent every 100 ms queue behind each other, and their latency grows, measured
        // from when each was due rather than when the previous one was answered.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 8];
            while s.read_exact(&mut buf).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = s.write_all(&buf).await;
            }
        });
        let router = Router::default();
        let answers: Answers = Arc::default();
        let start = Instant::now() + Duration::from_millis(50);
        router
            .add(0, "r", addr, &answers, start + Duration::from_secs(5))
            .await
            .expect("connect");
        let requests: Vec<Request> = (0..4)
            .map(|i| Request {
                at: Duration::from_millis(100 * i),
                service: 0,
            })
            .collect();
        // One request to a service with no replica: refused.
        let mut with_refused = requests.clone();
        with_refused.push(Request {
            at: Duration::from_millis(350),
            service: 1,
        });
        let out = run(
            &router,
            &answers,
            &with_refused,
            start,
            Duration::from_secs(2),
        )
        .await;
        assert_eq!((out.sent, out.refused, out.lost), (4, 1, 0));
        let mut l: Vec<f64> = out.latencies_ms.iter().map(|(_, ms)| *ms).collect();
        l.sort_by(f64::total_cmp);
        // Answers at 300, 600, 900, 1200 ms for requests due at 0, 100, 200, 300.
        assert_eq!(out.latencies_ms[1].0, Duration::from_millis(100));
        assert!((l[0] - 300.0).abs() < 60.0, "{l:?}");
        assert!((l[3] - 900.0).abs() < 60.0, "{l:?}");
    }
}
