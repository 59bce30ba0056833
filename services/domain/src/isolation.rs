//! How much a job shares its GPUs, and the workload classes that set a job's default.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How much a job shares its GPUs; later levels share less.
///
/// - `shared`: a fraction of a GPU that other tenants' shared jobs may also use.
/// - `mig`: a hardware partition (MIG).
/// - `dedicated`: whole GPUs on a node that runs no other tenant's work meanwhile.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    #[default]
    Shared,
    Mig,
    Dedicated,
}

impl Isolation {
    pub const ALL: [Isolation; 3] = [Isolation::Shared, Isolation::Mig, Isolation::Dedicated];

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Shared => "shared",
            Isolation::Mig => "mig",
            Isolation::Dedicated => "dedicated",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Isolation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Isolation::ALL
            .into_iter()
            .find(|i| i.as_str() == s)
            .ok_or_else(|| format!("unknown isolation `{s}` (one of shared, mig, dedicated)"))
    }
}

/// What a job is for, which sets its default isolation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadClass {
    Training,
    Inference,
    Batch,
}

impl WorkloadClass {
    pub const ALL: [WorkloadClass; 3] = [
        WorkloadClass::Training,
        WorkloadClass::Inference,
        WorkloadClass::Batch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadClass::Training => "training",
            WorkloadClass::Inference => "inference",
            WorkloadClass::Batch => "batch",
        }
    }

    /// Training gets whole GPUs of its own; inference and batch share.
    pub fn default_isolation(self) -> Isolation {
        match self {
            WorkloadClass::Training => Isolation::Dedicated,
            WorkloadClass::Inference | WorkloadClass::Batch => Isolation::Shared,
        }
    }
}

impl fmt::Display for WorkloadClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkloadClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkloadClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                format!("unknown workload class `{s}` (one of training, inference, batch)")
            })
    }
}

/// How a job's compute share of a shared GPU is held (see the GPU-sharing shim).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuCompute {
    /// Never more than the share, even on an idle GPU.
    #[default]
    Strict,
    /// The share while other jobs want the GPU; whatever is idle otherwise.
    Elastic,
    /// No share of its own: only what the GPU's other jobs leave idle. It holds the least
    /// share there is ([`BEST_EFFORT_MILLI`]) so that placement's and quotas' rules apply
    /// unchanged, runs beside jobs that hold shares (and on idle GPUs), is paced to what
    /// they leave while they launch, and gives its place up (preempted, with its
    /// checkpoint grace) to any job that is not best-effort and needs the room.
    BestEffort,
}

/// The share a best-effort job holds of its GPU: one thousandth, the least there is.
pub const BEST_EFFORT_MILLI: u32 = 1;

impl GpuCompute {
    pub const ALL: [GpuCompute; 3] = [
        GpuCompute::Strict,
        GpuCompute::Elastic,
        GpuCompute::BestEffort,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GpuCompute::Strict => "strict",
            GpuCompute::Elastic => "elastic",
            GpuCompute::BestEffort => "best_effort",
        }
    }
}

impl fmt::Display for GpuCompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GpuCompute {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // `best-effort`, as people type it on a command line, names `best_effort` too.
        let s = if s == "best-effort" { "best_effort" } else { s };
        GpuCompute::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                format!("unknown GPU compute mode `{s}` (one of strict, elastic, best-effort)")
            })
    }
}

/// Named priority classes; a job may also give any number in [`PRIORITY_RANGE`].
pub const PRIORITY_CLASSES: [(&str, i32); 4] = [
    ("low", -100),
    ("normal", 0),
    ("high", 100),
    ("critical", 1000),
];

/// The priorities a job may have: higher runs first and is preempted last.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;

/// A priority class name or a number in range.
pub fn parse_priority(s: &str) -> Result<i32, String> {
    if let Some((_, p)) = PRIORITY_CLASSES.iter().find(|(name, _)| *name == s) {
        return Ok(*p);
    }
    let names: Vec<&str> = PRIORITY_CLASSES.iter().map(|(n, _)| *n).collect();
    match s.parse::<i32>() {
        Ok(p) if PRIORITY_RANGE.contains(&p) => Ok(p),
        _ => Err(format!(
            "`{s}` is neither a priority class ({}) nor a number from {} to {}",
            names.join(", "),
            PRIORITY_RANGE.start(),
            PRIORITY_RANGE.end()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_order_by_how_little_they_share() {
        assert!(Isolation::Shared < Isolation::Mig && Isolation::Mig < Isolation::Dedicated);
        for i in Isolation::ALL {
            assert_eq!(i.as_str().parse::<Isolation>(), Ok(i));
        }
        assert!("private".parse::<Isolation>().is_err());
    }

    #[test]
    fn priorities_by_name_or_number() {
        assert_eq!(parse_priority("high"), Ok(100));
        assert_eq!(parse_priority("-5"), Ok(-5));
        assert!(parse_priority("1001").is_err());
        assert!(parse_priority("urgent").is_err());
    }
}
