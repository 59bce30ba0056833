//! Workflows people bring from Slurm: job arrays (one submit, many tasks told their index,
//! at most so many running at once) and dependencies between jobs (`afterok`, `afterany`,
//! `afternotok`). Pure: what an array spec says, which tasks of an array may be weighed for
//! placement now, and what a dependency's job's state means for the job waiting on it.

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::job::JobState;

/// The most tasks one array may have (Slurm's default `MaxArraySize` allows 1,001): a
/// submit of one array is one transaction, and 10,000 tasks held SQLite's one writer long
/// enough to cost the leader its lease.
pub const MAX_ARRAY_TASKS: usize = 1_000;

/// The largest task index.
pub const MAX_ARRAY_INDEX: u32 = 1_000_000;

/// An array as submitted: its task indices (in order, each once) and how many of its tasks
/// may hold capacity at once. Written as Slurm's `--array` is: `0-199`, `1,3,5-9`, `0-99:10`
/// (every tenth), with `%16` at the end for the cap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    /// What was written, without the cap (`0-199`).
    pub indices: String,
    /// At most this many tasks scheduled or running at once; `None`: no cap.
    pub max_running: Option<u32>,
}

impl ArraySpec {
    /// Parses `0-199%16` and its kin, naming `field` in what it refuses.
    pub fn parse(field: &str, s: &str) -> Result<Self, ValidationError> {
        let bad = |why: String| ValidationError::single(field, why);
        let s = s.trim();
        let (indices, cap) = match s.split_once('%') {
            Some((i, c)) => (i, Some(c)),
            None => (s, None),
        };
        let max_running = cap
            .map(|c| {
                c.parse::<u32>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad(format!("`%{c}`: the cap must be a whole number from 1")))
            })
            .transpose()?;
        if indices.len() > MAX_ARRAY_SPEC_LEN {
            return Err(bad(format!(
                "at most {MAX_ARRAY_SPEC_LEN} characters of indices (write ranges: 0-99)"
            )));
        }
        let spec = Self {
            indices: indices.to_owned(),
            max_running,
        };
        spec.tasks().map_err(bad)?;
        Ok(spec)
    }

    /// The task indices, in order, each once.
    pub fn tasks(&self) -> Result<Vec<u32>, String> {
        let mut out = std::collections::BTreeSet::new();
        if self.indices.trim().is_empty() {
            return Err("names no task: write e.g. 0-99, 1,3,5 or 0-99%10".into());
        }
        for part in self.indices.split(',') {
            let part = part.trim();
            let (range, step) = match part.split_once(':') {
                Some((r, s)) => (
                    r,
                    s.parse::<u32>().ok().filter(|&n| n >= 1).ok_or_else(|| {
                        format!("`{part}`: the step must be a whole number from 1")
                    })?,
                ),
                None => (part, 1),
            };
            let index = |t: &str| {
                t.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&n| n <= MAX_ARRAY_INDEX)
                    .ok_or_else(|| {
                        format!("`{part}`: an index is a whole number from 0 to {MAX_ARRAY_INDEX}")
                    })
            };
            let (first, last) = match range.split_once('-') {
                Some((a, b)) => (index(a)?, index(b)?),
                None => {
                    let i = index(range)?;
                    (i, i)
                }
            };
            if last < first {
                return Err(format!("`{part}`: the range runs backwards"));
            }
            let mut i = first;
            while i <= last {
                out.insert(i);
                if out.len() > MAX_ARRAY_TASKS {
                    return Err(format!("more than {MAX_ARRAY_TASKS} tasks"));
                }
                match i.checked_add(step) {
                    Some(next) => i = next,
                    None => break,
                }
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// The longest an array spec may be written (its indices, without the cap).
pub const MAX_ARRAY_SPEC_LEN: usize = 200;

/// Sorted, distinct indices as the shortest spec of ranges: `0-4,7,9-12`.
pub fn ranges(indices: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let start = indices[i];
        let mut end = start;
        while i + 1 < indices.len() && indices[i + 1] == end + 1 {
            i += 1;
            end = indices[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

impl std::fmt::Display for ArraySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.indices)?;
        if let Some(cap) = self.max_running {
            write!(f, "%{cap}")?;
        }
        Ok(())
    }
}

/// A job that is one task of an array: the array's id (its first task's job id) and the
/// task's index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArrayTask {
    pub array_id: String,
    pub index: u32,
}

/// What a job waits for of another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DependencyKind {
    /// The other job succeeded (Slurm's `afterok`).
    AfterOk,
    /// The other job ended, however (`afterany`).
    AfterAny,
    /// The other job ended without succeeding: failed, cancelled or timed out
    /// (`afternotok`).
    AfterNotOk,
}

impl DependencyKind {
    pub const ALL: [DependencyKind; 3] = [Self::AfterOk, Self::AfterAny, Self::AfterNotOk];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterOk => "after-ok",
            Self::AfterAny => "after-any",
            Self::AfterNotOk => "after-not-ok",
        }
    }

    /// Slurm's word for it.
    pub fn slurm(self) -> &'static str {
        match self {
            Self::AfterOk => "afterok",
            Self::AfterAny => "afterany",
            Self::AfterNotOk => "afternotok",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::AfterOk => "to succeed",
            Self::AfterAny => "to end",
            Self::AfterNotOk => "to end without succeeding",
        }
    }
}

impl std::str::FromStr for DependencyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s || k.slurm() == s)
            .ok_or_else(|| format!("`{s}`: one of after-ok, after-any, after-not-ok"))
    }
}

/// One dependency of a job: it waits until job `job_id` has ended as `kind` says.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dependency {
    pub kind: DependencyKind,
    pub job_id: String,
}

/// The most dependencies one job may have.
pub const MAX_DEPENDENCIES: usize = 1_000;

/// Where a job's dependencies stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DependencyVerdict {
    /// Every one is met: the job may be placed.
    Met,
    /// Some are not met yet: the job waits, saying for what.
    Waiting(String),
    /// One can never be met (its job ended the wrong way, or is gone): the job ends,
    /// saying why.
    Never(String),
}

/// Where `deps` stand, given each dependency's job state (`None`: no such job, or not one
/// the waiting job's tenant sees). Ids are shown in their short form.
pub fn dependency_verdict(
    deps: &[Dependency],
    state_of: impl Fn(&str) -> Option<JobState>,
) -> DependencyVerdict {
    let mut waiting = Vec::new();
    for d in deps {
        let short = crate::job::short_id(&d.job_id);
        let Some(state) = state_of(&d.job_id) else {
            return DependencyVerdict::Never(format!(
                "dependency never satisfied: job {short} ({}) no longer exists",
                d.kind.as_str()
            ));
        };
        let ended = state.is_terminal();
        let ok = state == JobState::Succeeded;
        let met = match d.kind {
            DependencyKind::AfterOk => ok,
            DependencyKind::AfterAny => ended,
            DependencyKind::AfterNotOk => ended && !ok,
        };
        if met {
            continue;
        }
        if ended {
            return DependencyVerdict::Never(format!(
                "dependency never satisfied: job {short} ended {state}, and this job waited \
                 for it {} ({})",
                d.kind.what(),
                d.kind.as_str()
            ));
        }
        waiting.push(format!("job {short} {}", d.kind.what()));
    }
    if waiting.is_empty() {
        DependencyVerdict::Met
    } else {
        let more = waiting.len().saturating_sub(3);
        waiting.truncate(3);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        DependencyVerdict::Waiting(format!("waiting for {}{tail}", waiting.join(", ")))
    }
}

/// Parses Slurm's `--dependency` (`afterok:ID[:ID…][,afterany:ID…]`; `?` between kinds is
/// not supported), naming `field`. Ids are returned as written (short ids, prefixes).
pub fn parse_slurm_dependency(
    field: &str,
    s: &str,
) -> Result<Vec<(DependencyKind, String)>, ValidationError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.contains('?') {
            return Err(ValidationError::single(
                field,
                format!("`{part}`: `?` (any of) is not supported: every dependency must be met"),
            ));
        }
        let mut pieces = part.split(':');
        let kind: DependencyKind = pieces
            .next()
            .unwrap_or_default()
            .parse()
            .map_err(|e: String| ValidationError::single(field, e))?;
        let ids: Vec<String> = pieces
            .filter(|p| !p.is_empty())
            .map(|p| p.split('+').next().unwrap_or(p).to_owned())
            .collect();
        if ids.is_empty() {
            return Err(ValidationError::single(
                field,
                format!("`{part}`: name the job(s), e.g. {}:ID", kind.slurm()),
            ));
        }
        out.extend(ids.into_iter().map(|id| (kind, id)));
    }
    if out.is_empty() {
        return Err(ValidationError::single(field, "names no dependency"));
    }
    Ok(out)
}

/// Of an array's pending tasks (their indices, in any order), those that may be weighed for
/// placement now: the lowest indices, as many as its cap leaves beside the `holding` tasks
/// that hold capacity.
pub fn array_admits(max_running: Option<u32>, holding: usize, pending: &mut [u32]) -> usize {
    pending.sort_unstable();
    let room = match max_running {
        Some(cap) => usize::try_from(cap)
            .unwrap_or(usize::MAX)
            .saturating_sub(holding),
        None => pending.len(),
    };
    room.min(pending.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_parse_as_slurm_writes_them() {
        let a = ArraySpec::parse("array", "0-199%16").expect("valid");
        assert_eq!(a.max_running, Some(16));
        assert_eq!(a.tasks().expect("tasks").len(), 200);
        assert_eq!(a.to_string(), "0-199%16");
        let b = ArraySpec::parse("array", "1,3,5-9:2").expect("valid");
        assert_eq!(b.tasks().expect("tasks"), [1, 3, 5, 7, 9]);
        assert_eq!(
            ArraySpec::parse("array", "4")
                .expect("one")
                .tasks()
                .expect("t"),
            [4]
        );
        for bad in [
            "",
            "5-1",
            "a-b",
            "0-9%0",
            "0-9%x",
            "0-20000",
            "1:0",
            "0-2000000",
        ] {
            let e = ArraySpec::parse("array", bad).expect_err(bad);
            assert_eq!(e.0[0].field, "array", "{bad}");
        }
    }

    #[test]
    fn indices_are_written_as_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 3, 4, 7, 9, 10, 11, 12]), "0-4,7,9-12");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[]), "");
        let spec = ArraySpec::parse("array", &ranges(&[1, 2, 3, 8])).expect("valid");
        assert_eq!(spec.tasks().expect("tasks"), [1, 2, 3, 8]);
        assert!(
            ArraySpec::parse("array", &"1,".repeat(150)).is_err(),
            "too long"
        );
    }

    #[test]
    fn dependencies_wait_are_met_or_can_never_be() {
        let dep = |kind, id: &str| Dependency {
            kind,
            job_id: id.into(),
        };
        let states = |s: &str| match s {
            "ok" => Some(JobState::Succeeded),
            "bad" => Some(JobState::Failed),
            "run" => Some(JobState::Running),
            _ => None,
        };
        use DependencyKind::*;
        assert_eq!(
            dependency_verdict(&[dep(AfterOk, "ok")], states),
            DependencyVerdict::Met
        );
        assert_eq!(
            dependency_verdict(&[dep(AfterAny, "bad")], states),
            DependencyVerdict::Met
        );
        assert_eq!(
            dependency_verdict(&[dep(AfterNotOk, "bad")], states),
            DependencyVerdict::Met
        );
        assert!(matches!(
            dependency_verdict(&[dep(AfterOk, "ok"), dep(AfterOk, "run")], states),
            DependencyVerdict::Waiting(w) if w.contains("job run to succeed")
        ));
        assert!(matches!(
            dependency_verdict(&[dep(AfterOk, "run"), dep(AfterOk, "bad")], states),
            DependencyVerdict::Never(w) if w.contains("job bad ended failed")
        ));
        assert!(matches!(
            dependency_verdict(&[dep(AfterNotOk, "ok")], states),
            DependencyVerdict::Never(_)
        ));
        assert!(matches!(
            dependency_verdict(&[dep(AfterAny, "gone")], states),
            DependencyVerdict::Never(w) if w.contains("no longer exists")
        ));
    }

    #[test]
    fn slurm_dependencies_parse() {
        let d = parse_slurm_dependency("dependency", "afterok:12:13,afterany:14").expect("ok");
        assert_eq!(
            d,
            [
                (DependencyKind::AfterOk, "12".to_owned()),
                (DependencyKind::AfterOk, "13".to_owned()),
                (DependencyKind::AfterAny, "14".to_owned())
            ]
        );
        for bad in ["after:1", "afterok", "afterok:1?afterany:2", ""] {
            assert!(parse_slurm_dependency("dependency", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_array_admits_the_lowest_tasks_within_its_cap() {
        let mut pending = vec![9, 3, 5, 1];
        assert_eq!(array_admits(Some(3), 1, &mut pending), 2);
        assert_eq!(&pending[..2], [1, 3]);
        assert_eq!(
            array_admits(Some(2), 5, &mut pending),
            0,
            "over its cap already"
        );
        assert_eq!(array_admits(None, 100, &mut pending), 4);
    }
}
