//! The openb benchmark: Alibaba's GPU-sharing trace (ATC'23, "Beware of Fragmentation")
//! replayed under the published evaluation protocol, with ports of the published baseline
//! policies. Pure: trace text in, placements and allocation figures out.

pub mod allot;
pub mod cluster;
pub mod policies;
pub mod run;
pub mod synthetic;
pub mod trace;

pub use cluster::{Cluster, Request};
pub use policies::{BASELINES, Choice, OpenbPolicy};

/// Every policy by its command-line name: Allot's own, then the published baselines.
pub const POLICIES: [&str; 7] = [
    "allot",
    BASELINES[0],
    BASELINES[1],
    BASELINES[2],
    BASELINES[3],
    BASELINES[4],
    BASELINES[5],
];
/// The generator policies draw from (re-exported so callers need no `rand` of their own).
pub use rand::rngs::StdRng;
pub use run::{RunOutcome, arrival_stream, run_seed, simulate};
pub use trace::{Node, Pod, parse_nodes, parse_pods};

#[derive(Debug, thiserror::Error)]
pub enum OpenbError {
    #[error("{0}")]
    Parse(String),
    #[error("unknown policy `{0}` (one of {list})", list = POLICIES.join(", "))]
    UnknownPolicy(String),
}

/// The policy named `name`, set up for the original (uninflated) `pods`.
pub fn policy(
    name: &str,
    cluster: &Cluster,
    pods: &[Pod],
) -> Result<Box<dyn OpenbPolicy>, OpenbError> {
    Ok(match name {
        "random" => Box::new(policies::Random),
        "dotprod" => Box::new(policies::DotProd),
        "bestfit" => Box::new(policies::BestFit),
        "gpu-packing" => Box::new(policies::GpuPacking),
        "gpu-clustering" => Box::new(policies::GpuClustering),
        "fgd" => Box::new(policies::Fgd::new(cluster, pods)),
        "allot" => Box::new(allot::Allot::new(cluster)),
        other => return Err(OpenbError::UnknownPolicy(other.to_owned())),
    })
}
