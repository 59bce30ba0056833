//! The leader's pending jobs, kept between scheduling passes: each pass reads only the jobs
//! whose record changed since the last one (`updated_at`, an index), so reading the backlog
//! costs what changed, not how much waits.
//!
//! A change is read again on every pass for [`PendingJobs::OVERLAP`] after its `updated_at`: a
//! transaction that commits a little after it stamped its rows, or a replica whose clock is
//! a little behind, is not missed. And the whole backlog is read again every
//! [`PendingJobs::FULL_READ_EVERY`] (and when leadership begins: the view starts empty), so nothing
//! missed stays missed for long.

use std::collections::HashMap;

use crate::{JobFilter, JobRepo, Store, StoreError, TenantScope};
use allot_domain::{Job, JobState, PendingReason};
use chrono::{DateTime, Duration, Utc};

/// The pending jobs, newest first (by id), as of the last [`PendingJobs::refresh`].
/// One per leadership term: it starts empty, so its first refresh reads everything.
#[derive(Default)]
pub struct PendingJobs {
    jobs: Vec<Job>,
    /// The version (`updated_at`) of each job read within the last [`PendingJobs::OVERLAP`]: a change
    /// listed again is fetched again only if it is a newer one.
    seen: HashMap<String, DateTime<Utc>>,
    /// Changes up to here are in `jobs`.
    read_to: Option<DateTime<Utc>>,
    full_read_at: Option<DateTime<Utc>>,
}

impl PendingJobs {
    /// How far back each incremental read reaches past the previous one.
    pub const OVERLAP: Duration = Duration::seconds(10);
    /// How often the whole backlog is read again.
    pub const FULL_READ_EVERY: Duration = Duration::seconds(60);

    /// The pending jobs as of the last refresh, newest first.
    pub fn jobs(&self) -> &[Job] {
        &self.jobs
    }

    /// Brings the view up to date.
    pub async fn refresh(&mut self, store: &Store) -> Result<(), StoreError> {
        let now = store.clock().now();
        let incremental = match (self.read_to, self.full_read_at) {
            (Some(to), Some(full)) if full <= now && now - full < Self::FULL_READ_EVERY => Some(to),
            _ => None,
        };
        match incremental {
            Some(to) => {
                let since = to - Self::OVERLAP;
                let newer: Vec<String> = store
                    .job_changes_since(since)
                    .await?
                    .into_iter()
                    .filter(|(id, at)| self.seen.get(id) != Some(at))
                    .map(|(id, _)| id)
                    .collect();
                let changed = if newer.is_empty() {
                    Vec::new()
                } else {
                    store.jobs_by_id(newer).await?
                };
                self.seen
                    .extend(changed.iter().map(|j| (j.id.clone(), j.updated_at)));
                self.seen.retain(|_, at| *at >= since);
                self.apply(changed);
            }
            None => {
                self.jobs = store
                    .list_jobs(JobFilter {
                        states: vec![JobState::Pending],
                        ..JobFilter::new(TenantScope::All)
                    })
                    .await?
                    .jobs;
                self.seen = self
                    .jobs
                    .iter()
                    .filter(|j| j.updated_at >= now - Self::OVERLAP)
                    .map(|j| (j.id.clone(), j.updated_at))
                    .collect();
                self.full_read_at = Some(now);
            }
        }
        self.read_to = Some(now);
        Ok(())
    }

    /// Replaces what changed: a job still pending as it is now, one that left pending not
    /// at all.
    fn apply(&mut self, changed: Vec<Job>) {
        if changed.is_empty() {
            return;
        }
        let mut changed: HashMap<String, Job> =
            changed.into_iter().map(|j| (j.id.clone(), j)).collect();
        let known = self.jobs.len();
        self.jobs.retain(|j| !changed.contains_key(&j.id));
        let replaced = known != self.jobs.len();
        let before = self.jobs.len();
        self.jobs.extend(
            changed
                .drain()
                .map(|(_, j)| j)
                .filter(|j| j.state == JobState::Pending),
        );
        // Newest first, as a full read lists them (new ids are the newest: usually they
        // only go on the front).
        if replaced || self.jobs.len() != before {
            self.jobs.sort_by(|a, b| b.id.cmp(&a.id));
        }
    }

    /// Records reasons the pass has just written, so they are not written again.
    pub fn reasons_written(&mut self, written: Vec<(String, Option<PendingReason>)>) {
        if written.is_empty() {
            return;
        }
        let written: HashMap<String, Option<PendingReason>> = written.into_iter().collect();
        for j in &mut self.jobs {
            if let Some(r) = written.get(&j.id) {
                j.pending_reason = r.clone();
            }
        }
    }
}
