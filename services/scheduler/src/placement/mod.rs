//! The scheduling model and the placement policies: what a node has free (`NodeState`), a
//! cluster of nodes, what a job asks for (`Request`), and the policies that choose a node
//! and GPUs for a request (`PlacementPolicy`: Allot's own in `allot`, the published
//! baselines in `policies`). The engine schedules over this model; the openb benchmark
//! replays its trace through it.

pub mod allot;
pub mod cluster;
pub mod policies;

pub use cluster::{Cluster, GPU_MILLI, Node, NodeState, Request};
pub use policies::{BASELINES, Choice, PlacementPolicy, RequestClass};

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

/// The policy named `name` (one of [`POLICIES`]), set up for a workload like `requests`
/// (what FGD measures fragmentation against; the others learn as they go or need none).
pub fn policy(
    name: &str,
    cluster: &Cluster,
    requests: &[Request],
) -> Option<Box<dyn PlacementPolicy>> {
    Some(match name {
        "random" => Box::new(policies::Random),
        "dotprod" => Box::new(policies::DotProd),
        "bestfit" => Box::new(policies::BestFit),
        "gpu-packing" => Box::new(policies::GpuPacking),
        "gpu-clustering" => Box::new(policies::GpuClustering),
        "fgd" => Box::new(policies::Fgd::new(cluster, requests)),
        "allot" => Box::new(allot::Allot::new(cluster)),
        _ => return None,
    })
}
