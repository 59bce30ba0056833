//! The control plane <-> node agent protocol (`proto/allot/v1/agent.proto`), generated with
//! tonic and prost.

#![allow(clippy::all, clippy::pedantic)]

pub mod v1 {
    tonic::include_proto!("allot.v1");
}

impl std::fmt::Debug for v1::Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("job_id", &self.job_id)
            .field("tenant", &self.tenant)
            .field("attempt", &self.attempt)
            .field("image", &self.image)
            .field("gpu_uuids", &self.gpu_uuids)
            .field("volumes", &self.volumes)
            .field("registry_credentials", &"<redacted>")
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for v1::JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSecret")
            .field("env", &self.env)
            .field("file", &self.file)
            .field("value", &"<redacted>")
            .finish()
    }
}

pub use v1::node_service_client::NodeServiceClient;
pub use v1::node_service_server::{NodeService, NodeServiceServer};

/// Which replica of the control plane leads, as gRPC metadata: a follower refusing an agent
/// (`UNAVAILABLE`) names the leader's endpoint and its epoch; a leader's heartbeat answers
/// carry its own epoch, so an agent knows a hint naming a term that failed on it for stale.
pub mod leader {
    use tonic::metadata::MetadataMap;

    /// The leader's gRPC endpoint (`https://host:port`).
    pub const ENDPOINT: &str = "allot-leader";
    /// The epoch under which that leader holds its lease.
    pub const EPOCH: &str = "allot-leader-epoch";

    /// The leader's endpoint named in `meta`, without a trailing `/`.
    pub fn endpoint(meta: &MetadataMap) -> Option<&str> {
        meta.get(ENDPOINT)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim_end_matches('/'))
    }

    /// The leader's epoch named in `meta`.
    pub fn epoch(meta: &MetadataMap) -> Option<i64> {
        meta.get(EPOCH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    }

    /// Names the leader's epoch in `meta`.
    pub fn set_epoch(meta: &mut MetadataMap, epoch: i64) {
        if let Ok(value) = epoch.to_string().parse() {
            meta.insert(EPOCH, value);
        }
    }

    /// Names the leader (endpoint and epoch) in `meta`; an endpoint that is not valid
    /// metadata is left out, and its epoch with it.
    pub fn set(meta: &mut MetadataMap, endpoint: &str, epoch: i64) {
        if let Ok(value) = endpoint.parse() {
            meta.insert(ENDPOINT, value);
            set_epoch(meta, epoch);
        }
    }
}
