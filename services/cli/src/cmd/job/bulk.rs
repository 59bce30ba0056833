//! Actions on many jobs at once, as `scancel` takes them: by name (a glob), state, tenant,
//! submitter or array, with a count and a confirmation at a terminal (`--yes` for scripts).

use std::io::IsTerminal;

use allot_api::views::JobView;
use anyhow::bail;
use reqwest::Method;

use crate::client::Client;

/// Which jobs a bulk action takes.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct Selection {
    /// Jobs whose name matches this glob (`*` any run of characters, `?` any one), e.g.
    /// 'sweep-*'.
    #[arg(long)]
    pub name: Option<String>,
    /// Comma-separated states (of pending, scheduled, running: default all three).
    #[arg(long)]
    pub state: Option<String>,
    /// Jobs of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Jobs submitted by this person or token (as `job list`'s USER column shows them).
    #[arg(long)]
    pub user: Option<String>,
    /// The tasks of this array (its id, or a unique prefix of it).
    #[arg(long)]
    pub array: Option<String>,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.state.is_none()
            && self.tenant.is_none()
            && self.user.is_none()
            && self.array.is_none()
    }

    /// The query `job list` and bulk actions send for it (unfinished jobs unless states are
    /// given).
    pub async fn query(
        &self,
        client: &Client,
        unfinished_by_default: bool,
    ) -> anyhow::Result<Vec<(&'static str, String)>> {
        let mut q = Vec::new();
        if let Some(n) = &self.name {
            q.push(("name", n.clone()));
        }
        if let Some(t) = &self.tenant {
            q.push(("tenant", t.clone()));
        }
        if let Some(u) = &self.user {
            q.push(("user", u.clone()));
        }
        match &self.state {
            Some(s) if unfinished_by_default => {
                // Only what has not ended can be cancelled.
                let open: Vec<&str> = s
                    .split(',')
                    .map(str::trim)
                    .filter(|s| matches!(*s, "pending" | "scheduled" | "running"))
                    .collect();
                if open.is_empty() {
                    bail!("--state {s}: only pending, scheduled or running jobs can be cancelled");
                }
                q.push(("state", open.join(",")));
            }
            Some(s) => q.push(("state", s.clone())),
            None if unfinished_by_default => {
                q.push(("state", "pending,scheduled,running".to_owned()));
            }
            None => {}
        }
        if let Some(a) = &self.array {
            // A prefix or short id names the array by its first task.
            let first: JobView = client.get(&format!("/api/v1/jobs/{a}"), &[]).await?;
            let Some(id) = first.array_id else {
                bail!("--array {a}: job {} is not a task of an array", first.id);
            };
            q.push(("array", id));
        }
        Ok(q)
    }
}

/// Cancels every job `selection` matches, after saying how many and asking at a terminal
/// (unless `yes`). Returns how many were cancelled.
pub async fn cancel(client: &Client, selection: &Selection, yes: bool) -> anyhow::Result<usize> {
    let query = selection.query(client, true).await?;
    let jobs = super::list_jobs(client, query, u64::MAX, None).await?.items;
    if jobs.is_empty() {
        eprintln!("no unfinished job matches");
        return Ok(0);
    }
    let n = jobs.len();
    if !yes {
        if !std::io::stdin().is_terminal() {
            bail!("{n} jobs match: give --yes to cancel them without being asked");
        }
        // What they are (a task with its index) and whose: a member's glob may take
        // teammates' jobs too.
        let names: Vec<String> = jobs
            .iter()
            .take(5)
            .map(|j| match j.array_index {
                Some(i) => format!("{}[{i}]", j.name),
                None => j.name.clone(),
            })
            .collect();
        let more = if n > 5 {
            format!(", and {} more", n - 5)
        } else {
            String::new()
        };
        let mut whose: Vec<&str> = jobs
            .iter()
            .map(|j| j.user.as_deref().unwrap_or("-"))
            .collect();
        whose.sort_unstable();
        whose.dedup();
        let question = format!(
            "cancel {n} jobs ({}{more}), submitted by {}? [y/N] ",
            names.join(", "),
            whose.join(", ")
        );
        eprint!("{}", crate::output::terminal_safe(&question));
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("nothing cancelled");
            return Ok(0);
        }
    }
    let mut cancelled = 0;
    let mut failed = Vec::new();
    // A few at a time: a sweep of hundreds is cancelled in seconds without flooding.
    for chunk in jobs.chunks(16) {
        let calls = chunk.iter().map(|j| async move {
            let r: anyhow::Result<JobView> = client
                .call::<(), _>(Method::POST, &format!("/api/v1/jobs/{}/cancel", j.id), None)
                .await
                .map_err(Into::into);
            (j, r)
        });
        for (j, r) in futures_util::future::join_all(calls).await {
            match r {
                Ok(_) => cancelled += 1,
                Err(e) => failed.push(format!("{}: {e:#}", j.id)),
            }
        }
    }
    eprintln!("{cancelled} of {n} jobs cancelled (or being stopped by their nodes)");
    if !failed.is_empty() {
        bail!("{} not cancelled:\n  {}", failed.len(), failed.join("\n  "));
    }
    Ok(cancelled)
}
