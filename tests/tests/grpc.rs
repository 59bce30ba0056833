//! The agent protocol's trust rules, exercised with a raw gRPC client: only the bootstrap
//! token registers, the node is whoever holds the node secret, and a node cannot report on
//! another node's jobs.

use allot_proto::NodeServiceClient;
use allot_proto::v1::{
    Gpu, HeartbeatRequest, JobPhase, JobStatusReport, RegisterRequest, WatchAssignmentsRequest,
    assignment::Kind,
};
use allot_system_tests::{Backend, spawn_cluster};
use tonic::transport::Channel;
use tonic::{Code, Request};

fn register_req(token: &str, name: &str) -> RegisterRequest {
    RegisterRequest {
        bootstrap_token: token.to_owned(),
        node_name: name.to_owned(),
        agent_version: "test".into(),
        gpu_backend: "simulated".into(),
        gpus: vec![Gpu {
            uuid: format!("GPU-{name}-0"),
            index: 0,
            model: "H200".into(),
            memory_bytes: 141 << 30,
            healthy: true,
            degraded: false,
        }],
        running_job_ids: vec![],
        cpu_milli: 8000,
        memory_bytes: 64 << 30,
    }
}

fn with_secret<T>(msg: T, secret: &str) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {secret}").parse().expect("metadata"),
    );
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_identity_comes_from_credentials() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let channel = Channel::from_shared(c.server.grpc_url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut client = NodeServiceClient::new(channel);

    let err = client
        .register(register_req("wrong-token", "n1"))
        .await
        .expect_err("bad bootstrap token");
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = client
        .register(register_req("test-join-token", "bad name!"))
        .await
        .expect_err("bad name");
    assert_eq!(err.code(), Code::InvalidArgument);

    let a = client
        .register(register_req("test-join-token", "node-a"))
        .await
        .expect("register a")
        .into_inner();
    let b = client
        .register(register_req("test-join-token", "node-b"))
        .await
        .expect("register b")
        .into_inner();
    assert_ne!(a.node_id, b.node_id);

    // No secret, or a forged one, gets nothing.
    let err = client
        .heartbeat(HeartbeatRequest::default())
        .await
        .expect_err("no secret");
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = client
        .heartbeat(with_secret(
            HeartbeatRequest::default(),
            "allot_node_forged",
        ))
        .await
        .expect_err("forged secret");
    assert_eq!(err.code(), Code::Unauthenticated);
    client
        .heartbeat(with_secret(
            HeartbeatRequest {
                gpus: register_req("", "node-a").gpus,
                running_job_ids: vec![],
            },
            &a.node_secret,
        ))
        .await
        .expect("heartbeat with the real secret");

    // Only nodes listening for assignments get work: both open their streams.
    let mut streams = Vec::new();
    for n in [&a, &b] {
        streams.push(
            client
                .watch_assignments(with_secret(WatchAssignmentsRequest {}, &n.node_secret))
                .await
                .expect("watch")
                .into_inner(),
        );
    }
    // A job placed on one of them ...
    c.create_tenant("t", None).await;
    let id = c.submit("t", 1, &["true"]).await;
    let job = c
        .eventually("the job to be scheduled", || async {
            let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
            (job["state"] == "scheduled").then_some(job)
        })
        .await;
    let (owner, other, mut stream) = if job["node_id"] == a.node_id.as_str() {
        (&a, &b, streams.swap_remove(0))
    } else {
        (&b, &a, streams.swap_remove(1))
    };

    // ... is announced on its node's stream ...
    let first = stream
        .message()
        .await
        .expect("stream")
        .expect("an assignment");
    match first.kind {
        Some(Kind::Launch(l)) => assert_eq!(l.job_id, id),
        other => panic!("expected a launch, got {other:?}"),
    }

    // ... and only that node may report on it.
    let report = |secret: &str, phase: JobPhase| {
        with_secret(
            JobStatusReport {
                job_id: id.clone(),
                phase: phase.into(),
                pid: Some(1),
                attempt: 1,
                ..Default::default()
            },
            secret,
        )
    };
    // The attempt is a fencing token: a report about another attempt changes nothing.
    for stale in [0, 2] {
        let mut r = report(&owner.node_secret, JobPhase::Succeeded);
        r.get_mut().attempt = stale;
        let err = client
            .report_job_status(r)
            .await
            .expect_err("a stale fencing token");
        assert_eq!(err.code(), Code::FailedPrecondition, "attempt {stale}");
    }
    let err = client
        .report_job_status(report(&other.node_secret, JobPhase::Running))
        .await
        .expect_err("another node's job");
    assert_eq!(err.code(), Code::PermissionDenied);
    client
        .report_job_status(report(&owner.node_secret, JobPhase::Running))
        .await
        .expect("owner reports running");
    // A retried report is harmless.
    client
        .report_job_status(report(&owner.node_secret, JobPhase::Running))
        .await
        .expect("repeat is a no-op");
    let err = client
        .report_job_status(report(&owner.node_secret, JobPhase::Unspecified))
        .await
        .expect_err("no phase");
    assert_eq!(err.code(), Code::InvalidArgument);
    client
        .report_job_status(report(&owner.node_secret, JobPhase::Succeeded))
        .await
        .expect("owner reports success");
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(job["state"], "succeeded");

    // Re-registering rotates the secret: the old one stops working.
    client
        .register(register_req("test-join-token", "node-a"))
        .await
        .expect("re-register");
    let err = client
        .heartbeat(with_secret(HeartbeatRequest::default(), &a.node_secret))
        .await
        .expect_err("old secret");
    assert_eq!(err.code(), Code::Unauthenticated);
    c.shutdown().await;
}
