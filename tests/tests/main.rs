//! Allot's whole-system tests, one module per area, linked into one test binary: each
//! system test links the control plane, the agent and their dependencies (about 170 MB in a
//! debug build), and thirty-nine binaries of that size filled CI's disk. Filter by module
//! with nextest: `cargo nextest run -p allot-system-tests -E 'test(/^logs::/)'`.

mod api;
mod attacks;
mod audit;
mod audit_tamper;
mod best_effort;
mod chaos;
mod crash;
mod e2e;
mod efficiency;
mod elastic;
mod figures;
mod gangs;
mod grpc;
mod images;
mod isolation;
mod jwt;
mod limits;
mod logs;
mod metrics;
mod mig;
mod model;
mod outage;
mod patroni;
mod policies;
mod portal;
mod quickstart;
mod quotas;
mod rbac;
mod replicas;
mod runtimes;
mod scheduling;
mod secrets;
mod sharing;
mod shim;
mod signin;
mod tls;
mod topology;
mod tracing;
mod usage;
mod volumes;
mod workflows;
mod workloads;
