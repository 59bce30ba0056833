//! Arrays and dependencies in the scheduling pass: an array's tasks beyond its cap
//! (`--array 0-199%16`) wait with `ArrayLimit`, lowest indices first to run; a job whose
//! dependencies are not met waits with `Dependency`, saying for what; one whose dependency
//! can never be met ends cancelled, saying why (`allot_domain::workflow`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use allot_domain::workflow::{DependencyVerdict, array_admits, dependency_verdict};
use allot_domain::{AuditContext, Job, JobState, PendingReason};
use allot_store::{Fenced, JobRepo, JobUpdate, StoreError};

use crate::scheduling::note_wait;

/// The pending jobs that may be weighed for placement now; the others' reasons go to
/// `reasons`, and jobs whose dependencies can never be met are ended.
pub async fn hold_back<'a>(
    store: &Fenced,
    holding: &[Job],
    pending: Cow<'a, [Job]>,
    reasons: &mut Vec<(String, Option<PendingReason>)>,
) -> Result<Cow<'a, [Job]>, StoreError> {
    let pending = dependencies(store, pending, reasons).await?;
    Ok(arrays(holding, pending, reasons))
}

async fn dependencies<'a>(
    store: &Fenced,
    pending: Cow<'a, [Job]>,
    reasons: &mut Vec<(String, Option<PendingReason>)>,
) -> Result<Cow<'a, [Job]>, StoreError> {
    if pending.iter().all(|j| j.spec.dependencies.is_empty()) {
        return Ok(pending);
    }
    let ids: HashSet<String> = pending
        .iter()
        .flat_map(|j| j.spec.dependencies.iter().map(|d| d.job_id.clone()))
        .collect();
    let states: HashMap<String, JobState> = store
        .jobs_by_id(ids.into_iter().collect())
        .await?
        .into_iter()
        .map(|j| (j.id, j.state))
        .collect();
    let ctx = AuditContext::system("dependencies");
    let mut left = Vec::with_capacity(pending.len());
    for j in pending.iter() {
        if j.spec.dependencies.is_empty() {
            left.push(j.clone());
            continue;
        }
        match dependency_verdict(&j.spec.dependencies, |id| states.get(id).copied()) {
            DependencyVerdict::Met => left.push(j.clone()),
            DependencyVerdict::Waiting(why) => note_wait(j, "Dependency", why, reasons),
            DependencyVerdict::Never(why) => {
                let ended = store
                    .transition_job(
                        &ctx,
                        &j.id,
                        JobState::Pending,
                        JobState::Cancelled,
                        JobUpdate {
                            message: Some(why.clone()),
                            ..Default::default()
                        },
                    )
                    .await;
                match ended {
                    Ok(_) => {
                        tracing::info!(job = %j.id, %why, "job ended: its dependency can never be met")
                    }
                    // Changed meanwhile (cancelled by its owner, say): the next pass sees it.
                    Err(StoreError::Conflict(m)) => tracing::debug!(job = %j.id, %m, "not ended"),
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(Cow::Owned(left))
}

fn arrays<'a>(
    holding: &[Job],
    pending: Cow<'a, [Job]>,
    reasons: &mut Vec<(String, Option<PendingReason>)>,
) -> Cow<'a, [Job]> {
    if !pending.iter().any(|j| capped(j).is_some()) {
        return pending;
    }
    let mut running: HashMap<&str, usize> = HashMap::new();
    for j in holding {
        if let Some(a) = &j.array_task {
            *running.entry(a.array_id.as_str()).or_default() += 1;
        }
    }
    // Each capped array's pending tasks, and how many of them may go now.
    let mut waiting: BTreeMap<&str, (u32, Vec<u32>)> = BTreeMap::new();
    for j in pending.iter() {
        if let Some((task, cap)) = capped(j) {
            let entry = waiting
                .entry(task.array_id.as_str())
                .or_insert((cap, Vec::new()));
            entry.1.push(task.index);
        }
    }
    let mut admitted: HashSet<(&str, u32)> = HashSet::new();
    for (array, (cap, indices)) in &mut waiting {
        let held = running.get(array).copied().unwrap_or(0);
        let n = array_admits(Some(*cap), held, indices);
        admitted.extend(indices[..n].iter().map(|&i| (*array, i)));
    }
    let mut left = Vec::with_capacity(pending.len());
    for j in pending.iter() {
        match capped(j) {
            Some((task, cap)) if !admitted.contains(&(task.array_id.as_str(), task.index)) => {
                let held = running.get(task.array_id.as_str()).copied().unwrap_or(0);
                note_wait(
                    j,
                    "ArrayLimit",
                    format!(
                        "array {}: {held} of its tasks hold capacity, and it runs at most {cap} at once (%{cap})",
                        allot_domain::job::short_id(&task.array_id)
                    ),
                    reasons,
                );
            }
            _ => left.push(j.clone()),
        }
    }
    Cow::Owned(left)
}

/// A task of an array with a cap: the task, and the cap.
fn capped(j: &Job) -> Option<(&allot_domain::workflow::ArrayTask, u32)> {
    j.array_task
        .as_ref()
        .zip(j.spec.array.as_ref().and_then(|a| a.max_running))
}
