//! The openb benchmark: Alibaba's GPU-sharing trace (ATC'23, "Beware of Fragmentation")
//! replayed under the published evaluation protocol through the scheduler's own model and
//! placement policies (`crate::placement`, where the ports of the published baselines
//! live). Pure: trace text in, placements and allocation figures out.

pub mod run;
pub mod synthetic;
pub mod trace;
pub mod variants;

pub use crate::placement::{BASELINES, Choice, Cluster, PlacementPolicy, Request};

pub use crate::placement::POLICIES;
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
) -> Result<Box<dyn PlacementPolicy>, OpenbError> {
    let requests: Vec<Request> = pods.iter().map(|p| p.request(cluster)).collect();
    crate::placement::policy(name, cluster, &requests)
        .ok_or_else(|| OpenbError::UnknownPolicy(name.to_owned()))
}
