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
