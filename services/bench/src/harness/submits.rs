//! An open-loop load of submits and cancels sent on schedule through whichever replica
//! answers, what each answer was, and a poller of what the API shows meanwhile.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_client::Client;
use allot_domain::JobState;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{Value, json};

use super::processes::all_jobs;
use super::scenario::TENANT;

/// What became of one submit.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    /// 2xx, with the job's id.
    Acked(String),
    /// Answered, but not 2xx.
    Refused(u16),
    /// No answer: the connection failed or was cut by the kill.
    Unanswered,
}

/// What the load did, as its answers came back.
#[derive(Default)]
pub(crate) struct Ledger {
    /// By job name, with when each was sent.
    pub(crate) submits: Vec<(String, Answer, Instant)>,
    /// Jobs the benchmark asked to cancel, and whether the ask was acknowledged.
    pub(crate) cancels: HashMap<String, Answer>,
    /// Jobs whose cancel was drawn when they were submitted (sent later, or not yet): the
    /// negative control leaves them alone, so what it loses is never one the benchmark
    /// cancels too.
    pub(crate) cancels_planned: std::collections::HashSet<String>,
    /// Requests the load made (submits, cancels, probes), and those answered 2xx (after
    /// trying the other replicas, where there are several).
    pub(crate) requests: u64,
    pub(crate) answered_2xx: u64,
    /// Cancels answered 409 (the job had ended meanwhile).
    pub(crate) answered_conflict: u64,
    /// Requests left unanswered that were in flight while the whole control plane was
    /// frozen on purpose (an outage): counted apart from `requests`, since no replica
    /// could answer them.
    pub(crate) unanswered_in_outage: u64,
}

/// What the benchmark saw while the server was up.
#[derive(Default)]
pub(crate) struct Seen {
    /// Each job's (state, attempt), consecutive repeats dropped.
    pub(crate) states: HashMap<String, Vec<(JobState, u64)>>,
    /// Each log's signed checkpoints, by log id and size.
    pub(crate) checkpoints: HashMap<String, BTreeMap<u64, HashSet<String>>>,
    pub(crate) polls: u64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Load {
    pub(crate) http: reqwest::Client,
    /// Each replica's API: a request no replica answers (or that one answers 502–504) goes
    /// to the next, as through a load balancer that retries.
    pub(crate) bases: Vec<String>,
    /// Where the next request starts.
    pub(crate) next: std::sync::atomic::AtomicUsize,
    pub(crate) token: String,
    pub(crate) runs: PathBuf,
    pub(crate) seed: u64,
    pub(crate) rate: f64,
    pub(crate) cancel_share: f64,
    pub(crate) job_secs: (u64, u64),
    pub(crate) ledger: Arc<Mutex<Ledger>>,
    /// When every replica was frozen on purpose: from, and until (`None`: still frozen).
    pub(crate) outages: Mutex<Vec<(Instant, Option<Instant>)>>,
}

impl Load {
    /// Whether a request in flight from `begun` to `ended` met an outage.
    fn met_outage(&self, begun: Instant, ended: Instant) -> bool {
        lock(&self.outages)
            .iter()
            .any(|(from, until)| begun <= until.unwrap_or(ended) && ended >= *from)
    }

    /// Submits job `name`, sleeping `secs`, through any replica but `avoid`; records and
    /// returns the answer.
    pub(crate) async fn submit(&self, name: String, secs: u64, avoid: Option<usize>) -> Answer {
        self.submit_planning(name, secs, avoid, false).await
    }

    /// [`Self::submit`], recording with its answer (under one lock) whether the benchmark
    /// means to cancel it.
    async fn submit_planning(
        &self,
        name: String,
        secs: u64,
        avoid: Option<usize>,
        cancel_planned: bool,
    ) -> Answer {
        let sent = Instant::now();
        // The run leaves a line only when its sleep completed: a stopped job leaves none.
        let script = format!(
            "sleep {secs} && echo \"$ALLOT_NODE $ALLOT_ATTEMPT\" >> {}/$ALLOT_JOB_ID",
            self.runs.display()
        );
        let body = json!({
            "tenant": TENANT, "name": name, "gpus": 1, "max_retries": 5,
            "cpu_milli": crate::harness::SLEEP_JOB_CPU_MILLI, "memory_bytes": crate::harness::SLEEP_JOB_MEMORY_BYTES,
            "command": ["sh", "-c", script],
        });
        let answer = self
            .send_avoiding(Method::POST, "/api/v1/jobs", Some(&body), avoid)
            .await;
        let answer = match answer {
            Some((status, body)) if (200..300).contains(&status) => match body["id"].as_str() {
                Some(id) => Answer::Acked(id.to_owned()),
                None => Answer::Refused(status),
            },
            Some((status, _)) => Answer::Refused(status),
            None => Answer::Unanswered,
        };
        let mut ledger = lock(&self.ledger);
        if let (true, Answer::Acked(id)) = (cancel_planned, &answer) {
            ledger.cancels_planned.insert(id.clone());
        }
        ledger.submits.push((name, answer.clone(), sent));
        answer
    }

    /// Sends submit `i`, and its cancel if drawn; records both answers.
    pub(crate) async fn one(self: Arc<Self>, i: u64) {
        let mut rng = StdRng::seed_from_u64(self.seed.wrapping_add(i.wrapping_mul(0x9e37_79b9)));
        let secs = rng.random_range(self.job_secs.0..=self.job_secs.1);
        let cancel_after = rng
            .random_bool(self.cancel_share.clamp(0.0, 1.0))
            .then(|| Duration::from_millis(rng.random_range(0..4000)));
        let answer = self
            .submit_planning(format!("crash-{i}"), secs, None, cancel_after.is_some())
            .await;
        let (Answer::Acked(id), Some(after)) = (answer, cancel_after) else {
            return;
        };
        tokio::time::sleep(after).await;
        let cancel = match self
            .send(Method::POST, &format!("/api/v1/jobs/{id}/cancel"), None)
            .await
        {
            Some((status, _)) if (200..300).contains(&status) => Answer::Acked(id.clone()),
            Some((status, _)) => Answer::Refused(status),
            None => Answer::Unanswered,
        };
        lock(&self.ledger).cancels.insert(id, cancel);
    }

    /// Sends a request (to the next replica, and on to the others while none answers), and
    /// counts it.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Option<(u16, Value)> {
        self.send_avoiding(method, path, body, None).await
    }

    /// [`Load::send`], never to replica `avoid` (where there is another).
    pub(crate) async fn send_avoiding(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        avoid: Option<usize>,
    ) -> Option<(u16, Value)> {
        let begun = Instant::now();
        let n = self.bases.len();
        let tries = if n > 1 { 3 * n } else { 1 };
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let mut answer = None;
        for t in 0..tries {
            if t > 0 && t % n == 0 {
                // Every replica tried: give a takeover a moment.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let at = (first + t) % n;
            if n > 1 && avoid == Some(at) {
                continue;
            }
            answer = self
                .send_to(&self.bases[at], method.clone(), path, body)
                .await;
            // 408: the replica gave up on the request before reading it (a replica
            // resumed after a freeze times out the connections it held); nothing was done,
            // and HTTP lets a client send it again.
            if answer
                .as_ref()
                .is_some_and(|(status, _)| *status != 408 && !(502..=504).contains(status))
            {
                break;
            }
        }
        if answer.is_none() && self.met_outage(begun, Instant::now()) {
            lock(&self.ledger).unanswered_in_outage += 1;
            return None;
        }
        let mut ledger = lock(&self.ledger);
        ledger.requests += 1;
        match answer.as_ref().map(|(status, _)| *status) {
            Some(200..=299) => ledger.answered_2xx += 1,
            // A cancel that found its job already ended: the right answer, not a failure.
            Some(409) if path.ends_with("/cancel") => ledger.answered_conflict += 1,
            _ => {}
        }
        answer
    }

    pub(crate) async fn send_to(
        &self,
        base: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Option<(u16, Value)> {
        let mut req = self
            .http
            .request(method, format!("{base}{path}"))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.ok()?;
        let status = res.status().as_u16();
        // An answer cut off by the kill is no answer.
        let text = res.text().await.ok()?;
        Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }
}

/// One poll of every job's state and every log's checkpoint, from the first replica that
/// answers; `None` while none does.
pub(crate) async fn poll(clients: &[Client], seen: &Mutex<Seen>) -> Option<()> {
    let mut answer = None;
    for client in clients {
        if let (Ok(jobs), Ok(logs)) = (
            all_jobs(client).await,
            client.get::<Vec<Value>>("/api/v1/audit/logs", &[]).await,
        ) {
            answer = Some((jobs, logs));
            break;
        }
    }
    let (jobs, logs) = answer?;
    let mut seen = lock(seen);
    seen.polls += 1;
    for j in &jobs {
        let (Some(id), Some(state)) = (
            j["id"].as_str(),
            j["state"].as_str().and_then(|s| JobState::from_str(s).ok()),
        ) else {
            continue;
        };
        let now = (state, j["attempt"].as_u64().unwrap_or(0));
        let states = seen.states.entry(id.to_owned()).or_default();
        if states.last() != Some(&now) {
            states.push(now);
        }
    }
    for l in &logs {
        let (Some(log), Some(note)) = (l["log"].as_str(), l["checkpoint"].as_str()) else {
            continue;
        };
        let Some(size) = note.lines().nth(1).and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        seen.checkpoints
            .entry(log.to_owned())
            .or_default()
            .entry(size)
            .or_default()
            .insert(note.to_owned());
    }
    Some(())
}
