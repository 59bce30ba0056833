//! The control plane <-> node agent protocol (`proto/allot/v1/agent.proto`), generated with
//! tonic and prost.

#![allow(clippy::all, clippy::pedantic)]

pub mod v1 {
    tonic::include_proto!("allot.v1");
}

pub use v1::node_service_client::NodeServiceClient;
pub use v1::node_service_server::{NodeService, NodeServiceServer};
