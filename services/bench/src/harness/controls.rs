//! Negative controls: a violation put into a run on purpose, which its checks must count,
//! failing the run. A run with a control switched on that passes shows that its checks
//! see nothing.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use allot_client::Client;
use anyhow::{Context as _, bail};
use reqwest::Method;
use serde_json::Value;

use super::processes::{all_jobs, live_job_processes};

/// Which violation a run is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum NegativeControl {
    /// One job the benchmark submitted is cancelled behind its back (as a control plane
    /// that dropped it would leave it): it never succeeds, and was not asked to stop, so
    /// it must be counted lost.
    Lose,
    /// A second live copy of a running job's process is started beside it (as a second
    /// attempt would be): it must be counted as run twice.
    Double,
}

impl NegativeControl {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Lose => "lose",
            Self::Double => "double",
        }
    }
}

/// Cancels one of `ours` that has not ended, through the API, and returns its id.
async fn lose(client: &Client, ours: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    // Retried through a control plane being killed and started again meanwhile.
    let started = Instant::now();
    let mut last = String::from("no unfinished job of this run");
    while started.elapsed() < Duration::from_secs(120) {
        let victim = match all_jobs(client).await {
            Ok(jobs) => jobs.iter().find_map(|j| {
                let id = j["id"].as_str()?;
                let open = matches!(
                    j["state"].as_str(),
                    Some("pending" | "scheduled" | "running")
                );
                (open && ours(id)).then(|| id.to_owned())
            }),
            Err(e) => {
                last = e.to_string();
                None
            }
        };
        if let Some(id) = victim {
            match client
                .call::<(), Value>(Method::POST, &format!("/api/v1/jobs/{id}/cancel"), None)
                .await
            {
                Ok(_) => {
                    eprintln!("negative control: job {id} cancelled behind the benchmark's back");
                    return Ok(id);
                }
                Err(e) => last = format!("cancelling job {id}: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("the negative control could not lose a job: {last}")
}

/// How a run's job processes are told from others on the machine: the environment entry
/// `live_job_processes` looks for (`marker`), and what a copy of a job must carry to be
/// taken for one of them.
pub(crate) struct Marked {
    pub(crate) marker: String,
    copy_env: Vec<(&'static str, String)>,
}

impl Marked {
    /// Jobs run as processes, each in a job directory under `root`.
    pub(crate) fn job_dirs(root: &Path) -> Self {
        Self {
            marker: format!("ALLOT_JOB_DIR={}/", root.display()),
            copy_env: vec![
                (
                    "ALLOT_JOB_DIR",
                    format!("{}/negative-control", root.display()),
                ),
                ("ALLOT_NODE", "negative-control".to_owned()),
            ],
        }
    }

    /// Jobs in containers (whose job directory is their `/scratch`), on nodes whose names
    /// begin with `prefix`.
    pub(crate) fn node_names(prefix: &str) -> Self {
        Self {
            marker: format!("ALLOT_NODE={prefix}"),
            copy_env: vec![("ALLOT_NODE", format!("{prefix}negative-control"))],
        }
    }
}

/// Puts `control` into a run of jobs `marked` so, on one of `ours`: the job it was put on,
/// and the copy `double` started (which the caller keeps until its checks are done).
pub(crate) async fn apply(
    control: NegativeControl,
    client: &Client,
    marked: &Marked,
    ours: impl Fn(&str) -> bool,
) -> anyhow::Result<(String, Option<tokio::process::Child>)> {
    match control {
        NegativeControl::Lose => lose(client, ours).await.map(|id| (id, None)),
        NegativeControl::Double => double(marked, ours, 5)
            .await
            .map(|(id, child)| (id, Some(child))),
    }
}

/// Starts a copy of one running job of `ours` (as `live_job_processes` sees them): a
/// `sleep` carrying the job's id, the run's mark and an attempt of its own. Returns the
/// job's id and the copy, which ends by itself after `secs`.
async fn double(
    marked: &Marked,
    ours: impl Fn(&str) -> bool,
    secs: u64,
) -> anyhow::Result<(String, tokio::process::Child)> {
    let started = Instant::now();
    let mut foreign = HashSet::new();
    loop {
        let live = live_job_processes(&marked.marker, &mut foreign);
        if let Some(id) = live.keys().find(|id| ours(id)) {
            let child = tokio::process::Command::new("sleep")
                .arg(secs.to_string())
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .envs(marked.copy_env.iter().map(|(k, v)| (*k, v.as_str())))
                .env("ALLOT_JOB_ID", id)
                .env("ALLOT_ATTEMPT", "negative-control")
                .kill_on_drop(true)
                .spawn()
                .context("starting the negative control's copy of a job")?;
            eprintln!("negative control: a second copy of job {id} started beside it");
            return Ok((id.clone(), child));
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the negative control found no running job of this run to double");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
