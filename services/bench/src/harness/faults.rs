//! What is done to the control plane: its leader killed or frozen (and a probe job timing
//! when another leads and places work), or every replica frozen at once (an outage).

use std::time::{Duration, Instant};

use anyhow::bail;
use reqwest::Method;

use super::processes::Server;
use super::submits::{Answer, Load, lock};

/// One failover: what was done to the leader, and how the others took over.
pub(crate) struct Failover {
    pub(crate) frozen: bool,
    /// From the fault to another replica leading.
    pub(crate) takeover: Option<Duration>,
    /// From the fault to the probe job, submitted through another replica just after it,
    /// being placed (its `scheduled_at`).
    pub(crate) resumed: Option<f64>,
}

/// Seconds from `since` to `probe` being placed (its `scheduled_at`), as any replica but
/// `avoid` answers now; `None` while it waits (or was never acknowledged).
pub(crate) async fn placed_since(
    load: &Load,
    probe: &Answer,
    avoid: Option<usize>,
    since: chrono::DateTime<chrono::Utc>,
) -> Option<f64> {
    let Answer::Acked(id) = probe else {
        return None;
    };
    for (i, base) in load.bases.iter().enumerate() {
        if Some(i) == avoid {
            continue;
        }
        let got = load
            .send_to(base, Method::GET, &format!("/api/v1/jobs/{id}"), None)
            .await;
        if let Some((200, job)) = got {
            return job["scheduled_at"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| (t.to_utc() - since).as_seconds_f64());
        }
    }
    None
}

/// Freezes every replica for `lasting`, wakes them, and submits a probe: the seconds from
/// the wake to the probe being placed (the control plane back at work), once it is, within
/// a minute.
pub(crate) async fn outage(servers: &[Server], load: &Load, lasting: Duration) -> Option<f64> {
    lock(&load.outages).push((Instant::now(), None));
    for s in servers {
        s.signal(nix::sys::signal::Signal::SIGSTOP);
    }
    tokio::time::sleep(lasting).await;
    for s in servers {
        s.signal(nix::sys::signal::Signal::SIGCONT);
    }
    let woke = chrono::Utc::now();
    let t0 = Instant::now();
    if let Some(last) = lock(&load.outages).last_mut() {
        last.1 = Some(Instant::now());
    }
    let probe = load.submit("outage-probe".to_owned(), 1, None).await;
    while t0.elapsed() < Duration::from_secs(60) {
        if let Some(s) = placed_since(load, &probe, None, woke).await {
            return Some(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Which replica leads, and under which epoch, as their metrics say.
pub(crate) async fn leader(servers: &[Server], http: &reqwest::Client) -> Option<(usize, i64)> {
    let mut found = None;
    for (i, s) in servers.iter().enumerate() {
        if let Some(e) = s.epoch(http).await.filter(|e| *e > 0)
            && found.is_none_or(|(_, best)| e > best)
        {
            found = Some((i, e));
        }
    }
    found
}

/// Kills (`frozen`: stops) the leader, submits a probe through another replica, waits for
/// another replica to lead and the probe to be placed, then starts the old leader again
/// after `down_for` (resumes it `frozen_for` after the fault, just after a submit through
/// another replica).
pub(crate) async fn fail_leader(
    servers: &mut [Server],
    http: &reqwest::Client,
    load: &Load,
    n: usize,
    frozen: bool,
    frozen_for: Duration,
    down_for: Duration,
) -> anyhow::Result<Failover> {
    let looking = Instant::now();
    let (at, epoch) = loop {
        if let Some(l) = leader(servers, http).await {
            break l;
        }
        if looking.elapsed() > Duration::from_secs(60) {
            bail!("no replica led for 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let fault_at = chrono::Utc::now();
    let t0 = Instant::now();
    if frozen {
        servers[at].signal(nix::sys::signal::Signal::SIGSTOP);
    } else {
        servers[at].kill().await;
    }
    let probe = load.submit(format!("probe-{n}"), 1, Some(at)).await;
    let (mut takeover, mut resumed) = (None, None);
    while t0.elapsed() < Duration::from_secs(60) {
        if takeover.is_none() {
            for (i, s) in servers.iter().enumerate() {
                if i != at && s.epoch(http).await.is_some_and(|e| e > epoch) {
                    takeover = Some(t0.elapsed());
                }
            }
        }
        if resumed.is_none() {
            resumed = placed_since(load, &probe, Some(at), fault_at).await;
        }
        if takeover.is_some() && (resumed.is_some() || !matches!(probe, Answer::Acked(_))) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if frozen {
        tokio::time::sleep_until((t0 + frozen_for).into()).await;
        // The worst moment to wake: work just submitted through another replica, so the
        // woken leader finds a pending job and an audit log grown past its last checkpoint
        // before it learns that its term is over. A fenced leader writes none of it.
        load.submit(format!("wake-{n}"), 1, Some(at)).await;
        servers[at].signal(nix::sys::signal::Signal::SIGCONT);
    } else {
        tokio::time::sleep(down_for).await;
        let respawned = Instant::now();
        servers[at].spawn()?;
        servers[at].ready(http, respawned).await?;
    }
    Ok(Failover {
        frozen,
        takeover,
        resumed,
    })
}
