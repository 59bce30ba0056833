//! The checks of what became of a run's jobs: each history follows the state machine, what
//! was seen is in it in order, the audit logs verify offline and say the same, each job's
//! runs are counted from the files they leave, and no job row was last written by a deposed
//! leader.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::str::FromStr;

use allot_audit::TrustedKeys;
use allot_audit::bundle::{Bundle, verify};
use allot_client::Client;
use allot_domain::JobState;
use anyhow::Context;
use serde_json::Value;

/// Whether `seen` (in order) is a subsequence of `history`.
pub(crate) fn in_order(seen: &[JobState], history: &[JobState]) -> bool {
    let mut h = history.iter();
    seen.iter().all(|s| h.any(|x| x == s))
}

/// A job's history as the API shows it: the states in order, and how many of its steps
/// skip (a step not from the state before it) or break the state machine.
pub(crate) fn history(job: &Value) -> (Vec<JobState>, u64) {
    let mut states = Vec::new();
    let mut bad = 0;
    for e in job["events"].as_array().into_iter().flatten() {
        let Some(to) = e["to"].as_str().and_then(|s| JobState::from_str(s).ok()) else {
            bad += 1;
            continue;
        };
        let from = e["from"].as_str().and_then(|s| JobState::from_str(s).ok());
        match (from, states.last().copied()) {
            // Created pending.
            (None, None) if to == JobState::Pending => {}
            // A resize: the state stays.
            (Some(f), Some(prev)) if f == prev && f == to => continue,
            (Some(f), Some(prev)) if f == prev && f.can_become(to) => {}
            _ => bad += 1,
        }
        states.push(to);
    }
    let current = job["state"]
        .as_str()
        .and_then(|s| JobState::from_str(s).ok());
    if current.is_none() || states.last().copied() != current {
        bad += 1;
    }
    (states, bad)
}

/// One log, exported whole and verified offline.
pub(crate) struct Verified {
    pub(crate) log: String,
    pub(crate) entries: u64,
    pub(crate) checkpoints_verified: usize,
    pub(crate) external: usize,
    pub(crate) problems: Vec<String>,
    /// Entries a leader wrote (its term named as their source) after an entry of a later
    /// term: written by a deposed leader, and accepted.
    pub(crate) deposed: u64,
    /// `job.submit` targets and `job.transition` (from, to) steps, by job id.
    pub(crate) submits: HashSet<String>,
    pub(crate) transitions: HashMap<String, Vec<(String, String)>>,
}

pub(crate) async fn verify_log(
    client: &Client,
    log: &Value,
    trusted: &TrustedKeys,
    sink: &Path,
    fetched: &HashMap<String, BTreeMap<u64, HashSet<String>>>,
) -> anyhow::Result<Verified> {
    let id = log["log"].as_str().unwrap_or_default().to_owned();
    let name = log["tenant"].as_str().unwrap_or(&id).to_owned();
    let bytes = client
        .get_bytes(&format!("/api/v1/audit/logs/{name}/export"), &[])
        .await?;
    let bundle = Bundle::from_tar(&bytes).with_context(|| format!("the export of log {name}"))?;
    // The server's own copies outside the database, and the checkpoints fetched while it ran.
    let mut external: Vec<(u64, String)> =
        allot_server::checkpoints::read_dir_sink(sink, &id).unwrap_or_default();
    for (size, notes) in fetched.get(&id).into_iter().flatten() {
        for note in notes {
            if !external.iter().any(|(s, n)| s == size && n == note) {
                external.push((*size, note.clone()));
            }
        }
    }
    external.sort_by_key(|(s, _)| *s);
    let report = verify(&bundle, Some(trusted), &external);
    let mut submits = HashSet::new();
    let mut transitions: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let (mut latest_epoch, mut deposed) = (0u64, 0);
    for line in bundle.entries_jsonl.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        // In log order, which is commit order: a term's entries never follow a later one's.
        if let Some(epoch) = e["actor"]["source"]
            .as_str()
            .filter(|s| s.starts_with("leader "))
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
        {
            if epoch < latest_epoch {
                deposed += 1;
            }
            latest_epoch = latest_epoch.max(epoch);
        }
        let Some(job) = e["target"].as_str().and_then(|t| t.strip_prefix("job/")) else {
            continue;
        };
        match e["action"].as_str() {
            Some("job.submit") => {
                submits.insert(job.to_owned());
            }
            Some("job.transition") => transitions.entry(job.to_owned()).or_default().push((
                e["before"]["state"].as_str().unwrap_or_default().to_owned(),
                e["after"]["state"].as_str().unwrap_or_default().to_owned(),
            )),
            _ => {}
        }
    }
    Ok(Verified {
        log: name,
        entries: report.entries,
        checkpoints_verified: report.checkpoints_verified,
        external: external.len(),
        problems: report.problems.iter().map(ToString::to_string).collect(),
        deposed,
        submits,
        transitions,
    })
}

/// The job rows whose last write a deposed leader made, as the database itself records
/// them (each row's writer's epoch against when each term began): read once the replicas
/// have stopped, so nothing writes meanwhile. It sees what the audit log's order cannot
/// show (a deposed write audited in no log, or in one the new leader had not yet written
/// to), but only a row's last write: a later write by the new leader hides an earlier
/// deposed one.
pub(crate) async fn deposed_job_rows(
    database_url: &str,
) -> anyhow::Result<Vec<allot_store::DeposedWrite>> {
    use allot_store::LeadershipRepo;
    let store =
        allot_store::Store::connect(database_url, std::sync::Arc::new(allot_domain::SystemClock))
            .await
            .context("connecting to the replicas' database")?;
    store
        .deposed_job_writes()
        .await
        .context("reading the job rows' writers")
}

/// Completed runs of each job, from the lines the jobs appended.
pub(crate) fn completed_runs(runs: &Path) -> HashMap<String, usize> {
    std::fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let text = std::fs::read_to_string(e.path()).ok()?;
            Some((name, text.lines().filter(|l| !l.trim().is_empty()).count()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn job(state: &str, steps: &[(Option<&str>, &str)]) -> Value {
        json!({
            "state": state,
            "events": steps.iter().map(|(from, to)| json!({ "from": from, "to": to })).collect::<Vec<_>>(),
        })
    }

    #[test]
    pub(crate) fn a_whole_history_passes_and_each_kind_of_break_is_counted() {
        use JobState::*;
        let whole = job(
            "succeeded",
            &[
                (None, "pending"),
                (Some("pending"), "scheduled"),
                (Some("scheduled"), "running"),
                (Some("running"), "pending"),
                (Some("pending"), "scheduled"),
                (Some("scheduled"), "running"),
                (Some("running"), "running"),
                (Some("running"), "succeeded"),
            ],
        );
        let (states, bad) = history(&whole);
        assert_eq!(bad, 0);
        assert_eq!(
            states,
            [
                Pending, Scheduled, Running, Pending, Scheduled, Running, Succeeded
            ]
        );
        // A step the state machine does not have.
        let skipped = job(
            "running",
            &[(None, "pending"), (Some("pending"), "running")],
        );
        assert_eq!(history(&skipped).1, 1);
        // A step that does not start where the one before ended (one was lost).
        let gap = job(
            "running",
            &[(None, "pending"), (Some("scheduled"), "running")],
        );
        assert_eq!(history(&gap).1, 1);
        // Out of a terminal state.
        let revived = job(
            "running",
            &[
                (None, "pending"),
                (Some("pending"), "cancelled"),
                (Some("cancelled"), "running"),
            ],
        );
        assert_eq!(history(&revived).1, 1);
        // A record whose state is not where its history ends.
        let stale = job("running", &[(None, "pending")]);
        assert_eq!(history(&stale).1, 1);
    }

    #[test]
    pub(crate) fn what_was_seen_must_be_in_the_history_in_the_order_seen() {
        use JobState::*;
        let h = [
            Pending, Scheduled, Running, Pending, Scheduled, Running, Succeeded,
        ];
        assert!(in_order(&[Pending, Running, Succeeded], &h));
        assert!(in_order(&[Running, Pending, Running], &h));
        // Seen running, then the history has it pending and never running again.
        assert!(!in_order(&[Running, Scheduled, Running, Running], &h[..6]));
        // Seen succeeded, then running: backwards.
        assert!(!in_order(&[Succeeded, Running], &h));
        // Seen cancelled, which the history forgot.
        assert!(!in_order(&[Pending, Cancelled], &h));
    }
}
