//! One module per page; `lib.rs` routes to them and holds what they share.

pub(crate) mod admin;
pub(crate) mod audit;
pub(crate) mod cluster;
pub(crate) mod dashboard;
pub(crate) mod job;
pub(crate) mod jobs;
pub(crate) mod submit;
