//! The agent protocol's trust rules, exercised with a raw gRPC client over mutual TLS: only
//! an unused bootstrap token registers, the node is whoever its current certificate names
//! (never a field in the message), a node cannot report on another node's jobs, and a
//! revoked or expired certificate stops working at once.

use std::time::Duration;

use allot_pki::{Authority, node_request};
use allot_proto::NodeServiceClient;
use allot_proto::v1::{
    Gpu, HeartbeatRequest, JobPhase, JobStatusReport, RegisterRequest, WatchAssignmentsRequest,
    assignment::Kind,
};
use allot_system_tests::{
    Backend, TestCluster, bootstrap_token, spawn_cluster, spawn_cluster_with,
};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn register_req(token: &str, name: &str, csr_pem: &str) -> RegisterRequest {
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
            ..Default::default()
        }],
        running_job_ids: vec![],
        cpu_milli: 8000,
        memory_bytes: 64 << 30,
        csr_pem: csr_pem.to_owned(),
        runtime: "process".into(),
        address: String::new(),
    }
}

/// A client of the control plane's gRPC port that trusts its CA and presents `identity`
/// (certificate and key, PEM), if any.
fn client(c: &TestCluster, identity: Option<(&str, &str)>) -> NodeServiceClient<Channel> {
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&c.server.node_ca_pem));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(c.server.grpc_url())
        .expect("url")
        .tls_config(tls)
        .expect("tls")
        .connect_lazy();
    NodeServiceClient::new(channel)
}

/// A node registered by hand: its id, key, certificate and a client presenting them.
struct RawNode {
    id: String,
    name: String,
    key_pem: String,
    cert_pem: String,
    client: NodeServiceClient<Channel>,
}

impl RawNode {
    fn heartbeat(&self) -> HeartbeatRequest {
        HeartbeatRequest {
            gpus: register_req("", &self.name, "").gpus,
            running_job_ids: vec![],
            job_samples: vec![],
            running_attempts: vec![],
            unavailable: String::new(),
        }
    }
}

/// Registers `name` with `token` (and a new key), as an agent's first start does.
async fn enroll(c: &TestCluster, token: &str, name: &str) -> Result<RawNode, tonic::Status> {
    let request = node_request(name).expect("CSR");
    let res = client(c, None)
        .register(register_req(token, name, &request.csr_pem))
        .await?
        .into_inner();
    Ok(RawNode {
        client: client(c, Some((&res.certificate_pem, &request.key_pem))),
        id: res.node_id,
        name: name.to_owned(),
        key_pem: request.key_pem,
        cert_pem: res.certificate_pem,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_identity_comes_from_its_certificate() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let csr = node_request("n1").expect("CSR").csr_pem;
    let mut anonymous = client(&c, None);

    let err = anonymous
        .register(register_req("allot_boot_wrong", "n1", &csr))
        .await
        .expect_err("bad bootstrap token");
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = anonymous
        .register(register_req("", "n1", &csr))
        .await
        .expect_err("no token, no certificate");
    assert_eq!(err.code(), Code::Unauthenticated);
    let token = bootstrap_token(&c.server).await;
    let err = anonymous
        .register(register_req(&token, "bad name!", &csr))
        .await
        .expect_err("bad name");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = anonymous
        .register(register_req(&token, "n1", "not a CSR"))
        .await
        .expect_err("bad CSR");
    assert_eq!(err.code(), Code::InvalidArgument);
    // The address other nodes' jobs are sent to (a gang's MASTER_ADDR) is an address or a
    // name, never something more.
    for address in [
        "10.0.0.1:80",
        "evil.example/x",
        "a b",
        "-lead.example",
        "$(id)",
    ] {
        let err = anonymous
            .register(RegisterRequest {
                address: address.into(),
                ..register_req(&token, "n1", &csr)
            })
            .await
            .expect_err("bad address");
        assert_eq!(err.code(), Code::InvalidArgument, "{address}");
        assert!(
            err.message().contains("address"),
            "{address}: {}",
            err.message()
        );
    }

    // The token was not spent by the refused attempts; it is by the first registration.
    let a = enroll(&c, &token, "node-a").await.expect("register a");
    let b = enroll(&c, &bootstrap_token(&c.server).await, "node-b")
        .await
        .expect("register b");
    assert_ne!(a.id, b.id);
    // A reused bootstrap token admits no one: not another node, not the same one again.
    for name in ["node-c", "node-a"] {
        let err = enroll(&c, &token, name).await.err().expect("reused token");
        assert_eq!(err.code(), Code::Unauthenticated, "{name}");
    }

    // No certificate gets nothing but registration.
    let err = anonymous
        .heartbeat(a.heartbeat())
        .await
        .expect_err("no certificate");
    assert_eq!(err.code(), Code::Unauthenticated);
    // A certificate naming node-a from another CA does not even connect.
    let rogue = Authority::generate("rogue CA", chrono::Utc::now(), [9; 16]).expect("CA");
    let forged_key = node_request("node-a").expect("CSR");
    let forged = rogue
        .sign_node(
            &forged_key.csr_pem,
            "node-a",
            chrono::Utc::now() - chrono::Duration::minutes(1),
            chrono::Utc::now() + chrono::Duration::hours(1),
            [3; 16],
        )
        .expect("forged certificate");
    client(&c, Some((&forged.cert_pem, &forged_key.key_pem)))
        .heartbeat(a.heartbeat())
        .await
        .expect_err("a certificate from another CA");
    // A node's certificate cannot register (and so speak for) another node name.
    let other = node_request("node-b").expect("CSR");
    let err = a
        .client
        .clone()
        .register(register_req("", "node-b", &other.csr_pem))
        .await
        .expect_err("node-a registering as node-b");
    assert_eq!(err.code(), Code::PermissionDenied);
    a.client
        .clone()
        .heartbeat(a.heartbeat())
        .await
        .expect("heartbeat with the node certificate");

    // Only nodes listening for assignments get work: both open their streams.
    let mut streams = Vec::new();
    for n in [&a, &b] {
        streams.push(
            n.client
                .clone()
                .watch_assignments(WatchAssignmentsRequest {})
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
    let (owner, other, mut stream) = if job["node_id"] == a.id.as_str() {
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
    let report = |phase: JobPhase| JobStatusReport {
        job_id: id.clone(),
        phase: phase.into(),
        pid: Some(1),
        attempt: 1,
        ..Default::default()
    };
    // The attempt is a fencing token: a report about another attempt changes nothing.
    for stale in [0, 2] {
        let mut r = report(JobPhase::Succeeded);
        r.attempt = stale;
        let err = owner
            .client
            .clone()
            .report_job_status(r)
            .await
            .expect_err("a stale fencing token");
        assert_eq!(err.code(), Code::FailedPrecondition, "attempt {stale}");
    }
    let err = other
        .client
        .clone()
        .report_job_status(report(JobPhase::Running))
        .await
        .expect_err("another node's job");
    assert_eq!(err.code(), Code::PermissionDenied);
    // Before it starts an attempt the node asks whether the attempt is still its own: a
    // launch that arrived late (the attempt moved on, or went to another node) is refused,
    // and asking changes nothing.
    let mut late = report(JobPhase::Starting);
    late.attempt = 2;
    let err = owner
        .client
        .clone()
        .report_job_status(late)
        .await
        .expect_err("a later attempt is not this one");
    assert_eq!(err.code(), Code::FailedPrecondition);
    let err = other
        .client
        .clone()
        .report_job_status(report(JobPhase::Starting))
        .await
        .expect_err("another node's attempt");
    assert_eq!(err.code(), Code::PermissionDenied);
    owner
        .client
        .clone()
        .report_job_status(report(JobPhase::Starting))
        .await
        .expect("the owner may start its attempt");
    let (_, still) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(still["state"], "scheduled", "asking changes nothing");
    owner
        .client
        .clone()
        .report_job_status(report(JobPhase::Running))
        .await
        .expect("owner reports running");
    // Only the node running an attempt writes its log: not another node (a stolen key),
    // not about another attempt, nothing oversized or past the largest offset.
    let chunk = |attempt: u32, offset: u64, data: &[u8]| allot_proto::v1::JobLogChunk {
        job_id: id.clone(),
        attempt,
        offset,
        data: data.to_vec(),
    };
    let logs = |chunks| allot_proto::v1::JobLogs { chunks };
    let refused = other
        .client
        .clone()
        .append_job_logs(logs(vec![chunk(1, 0, b"forged by another node\n")]))
        .await
        .expect("answered")
        .into_inner()
        .refused;
    assert_eq!(refused, 1);
    let oversized = vec![b'x'; 256 * 1024 + 1];
    let refused = owner
        .client
        .clone()
        .append_job_logs(logs(vec![
            chunk(2, 0, b"a later attempt\n"),
            chunk(1, 0, &oversized),
            chunk(1, u64::MAX - 2, b"wraps"),
            chunk(1, 0, b""),
            chunk(1, 0, b"hello "),
            chunk(1, 6, b"world\n"),
        ]))
        .await
        .expect("answered")
        .into_inner()
        .refused;
    assert_eq!(refused, 4);
    let log = c.get_text(&format!("/api/v1/jobs/{id}/log")).await;
    assert_eq!(log, "hello world\n");
    // A node's samples of jobs count only for its own jobs.
    for (node, utilization) in [(other, 0.99), (owner, 0.25)] {
        let name = if node.id == a.id { "node-a" } else { "node-b" };
        let mut beat = node.heartbeat();
        beat.gpus = register_req("", name, "").gpus;
        beat.job_samples = vec![allot_proto::v1::JobSample {
            job_id: id.clone(),
            utilization,
            memory_used_bytes: 1 << 30,
            held_back: 0.0,
        }];
        node.client
            .clone()
            .heartbeat(beat)
            .await
            .expect("heartbeat");
    }
    let (_, points) = c.get(&format!("/api/v1/jobs/{id}/samples")).await;
    let points = points.as_array().expect("points");
    assert_eq!(points.len(), 1, "{points:?}");
    assert_eq!(points[0]["utilization"], 0.25);
    // A retried report is harmless.
    owner
        .client
        .clone()
        .report_job_status(report(JobPhase::Running))
        .await
        .expect("repeat is a no-op");
    let err = owner
        .client
        .clone()
        .report_job_status(report(JobPhase::Unspecified))
        .await
        .expect_err("no phase");
    assert_eq!(err.code(), Code::InvalidArgument);
    owner
        .client
        .clone()
        .report_job_status(report(JobPhase::Succeeded))
        .await
        .expect("owner reports success");
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(job["state"], "succeeded");
    let err = owner
        .client
        .clone()
        .report_job_status(report(JobPhase::Starting))
        .await
        .expect_err("an attempt that ended does not start again");
    assert_eq!(err.code(), Code::FailedPrecondition);

    // Registering again with its certificate is for the key it holds: a new key is refused.
    let err = a
        .client
        .clone()
        .register(register_req(
            "",
            "node-a",
            &node_request("node-a").expect("CSR").csr_pem,
        ))
        .await
        .expect_err("a new key with the old certificate");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    // With the key it holds, it keeps the node's identity: an agent registers again when it
    // starts again, its streams closed with its old process (while one is open, the
    // attack test shows, a registration is refused).
    drop((stream, streams));
    let renewed = allot_pki::node_request_for_key("node-a", &a.key_pem).expect("CSR");
    let again = a
        .client
        .clone()
        .register(register_req("", "node-a", &renewed.csr_pem))
        .await
        .expect("re-register with the certificate")
        .into_inner();
    assert_eq!(again.node_id, a.id);

    // Each refusal of a node's call for what it asked is in the system log, naming the node.
    let system = c.audit_log("system").await;
    for call in ["ReportJobStatus", "AppendJobLogs", "Register"] {
        assert!(
            system.iter().any(|e| e.action == "node.denied"
                && e.target == format!("grpc/{call}")
                && e.outcome == allot_domain::Outcome::Denied),
            "{call}'s refusal is audited"
        );
    }

    // Revoking the node stops its calls at once: its open stream ends, and neither its
    // first certificate nor its newest one is accepted any more.
    let mut a_stream = a
        .client
        .clone()
        .watch_assignments(WatchAssignmentsRequest {})
        .await
        .expect("watch")
        .into_inner();
    let (status, body) = c
        .post(
            &format!("/api/v1/nodes/{}/revoke", a.id),
            serde_json::json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["certificates_revoked"], 2, "{body}");
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match a_stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the stream ends promptly");
    assert!(
        matches!(&ended, Err(s) if s.code() == Code::Unauthenticated),
        "{ended:?}"
    );
    let newest = client(&c, Some((&again.certificate_pem, &renewed.key_pem)));
    for (which, mut cl) in [("first", a.client.clone()), ("newest", newest)] {
        let err = cl.heartbeat(a.heartbeat()).await.expect_err(which);
        assert_eq!(err.code(), Code::Unauthenticated, "{which}");
        let err = cl
            .register(register_req("", "node-a", &renewed.csr_pem))
            .await
            .expect_err(which);
        assert_eq!(err.code(), Code::Unauthenticated, "{which}");
    }
    // Only a new bootstrap token made to replace it brings it back, as the same node.
    let back = enroll(
        &c,
        &allot_system_tests::bootstrap_token_for(&c.server, "node-a", true).await,
        "node-a",
    )
    .await
    .expect("re-enrolled");
    assert_eq!(back.id, a.id);
    back.client
        .clone()
        .heartbeat(back.heartbeat())
        .await
        .expect("the new certificate works");
    let err = a
        .client
        .clone()
        .heartbeat(a.heartbeat())
        .await
        .expect_err("the revoked one still does not");
    assert_eq!(err.code(), Code::Unauthenticated);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_node_certificate_is_refused() {
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |config| {
        config.node_cert_ttl = Duration::from_secs(2);
    })
    .await;
    let n = enroll(&c, &bootstrap_token(&c.server).await, "short-lived")
        .await
        .expect("registered");
    n.client
        .clone()
        .heartbeat(n.heartbeat())
        .await
        .expect("valid for now");
    let expires = allot_pki::NodeCert::from_pem(&n.cert_pem)
        .expect("certificate")
        .not_after;
    let wait = (expires - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(1200)).await;
    // On the connection opened while it was valid, the control plane's own check refuses it;
    // a new connection fails the TLS handshake.
    let err = n
        .client
        .clone()
        .heartbeat(n.heartbeat())
        .await
        .expect_err("expired, on an open connection");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    client(&c, Some((&n.cert_pem, &n.key_pem)))
        .heartbeat(n.heartbeat())
        .await
        .expect_err("expired, on a new connection");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_renews_its_certificate_and_stops_its_jobs_once_revoked() {
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |config| {
        config.node_cert_ttl = Duration::from_secs(3);
        config.lease = Duration::from_secs(3);
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let backend = allot_agent::gpu::SimBackend::from_spec("1xH200", "renewing")
        .expect("gpus")
        .with_fault_dir(dir.path().join("sim-faults"));
    let stop = tokio_util::sync::CancellationToken::new();
    let cfg = allot_system_tests::agent_config(&c.server, "renewing", dir.path().to_owned()).await;
    let agent = tokio::spawn(allot_agent::run(
        cfg,
        std::sync::Arc::new(backend),
        stop.clone(),
    ));
    c.create_tenant("t", None).await;
    let id = c.submit("t", 1, &["sleep", "300"]).await;
    let job = c.wait_for_state(&id, "running").await;
    let pid = u32::try_from(job["pid"].as_u64().expect("pid")).expect("pid fits");

    // Certificates three seconds long: the agent renews each at two thirds, for the key it
    // holds, and keeps working throughout.
    let cert_file = dir.path().join("identity").join("node.crt");
    let serial = || {
        let pem = std::fs::read_to_string(&cert_file).expect("the agent keeps its certificate");
        allot_pki::NodeCert::from_pem(&pem)
            .expect("certificate")
            .serial
    };
    let mut serials = std::collections::HashSet::from([serial()]);
    let started = std::time::Instant::now();
    while serials.len() < 3 {
        assert!(
            started.elapsed() < allot_system_tests::PATIENCE,
            "renewals seen: {serials:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        serials.insert(serial());
    }
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(job["state"], "running", "{job}");
    assert_eq!(job["attempt"], 1, "{job}");
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert_eq!(nodes[0]["status"], "ready", "{nodes}");

    // Revoked (its bootstrap token long spent), the agent stops its jobs and exits, saying
    // why; the job goes back to the queue once the node's lease lapses.
    let (status, body) = c
        .post("/api/v1/nodes/renewing/revoke", serde_json::json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let exit = tokio::time::timeout(allot_system_tests::PATIENCE, agent)
        .await
        .expect("the agent exits")
        .expect("agent task");
    assert!(
        matches!(exit, Err(allot_agent::AgentError::Refused(_))),
        "{exit:?}"
    );
    assert!(
        !allot_system_tests::process_group_alive(pid),
        "the revoked node's job was stopped"
    );
    let job = c.wait_for_state(&id, "pending").await;
    assert_eq!(job["attempt"], 2, "{job}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reports_only_its_own_gpus_and_within_bounds() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let a = enroll(&c, &bootstrap_token(&c.server).await, "node-a")
        .await
        .expect("a");
    let b = enroll(&c, &bootstrap_token(&c.server).await, "node-b")
        .await
        .expect("b");
    let sample = |utilization: f32| allot_proto::v1::GpuSample {
        utilization,
        memory_used_bytes: 1 << 30,
        ..Default::default()
    };

    // Node b claims node a's GPU, with a sample for it: refused (it is not one b registered
    // with), recorded, and nothing of a changes.
    let mut forged = b.heartbeat();
    forged.gpus[0].uuid = "GPU-node-a-0".into();
    forged.gpus[0].sample = Some(sample(0.99));
    let err = b
        .client
        .clone()
        .heartbeat(forged)
        .await
        .expect_err("another node's GPU");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(
        err.message().contains("GPU-node-a-0")
            && err
                .message()
                .contains("not among those node node-b registered with"),
        "{err}"
    );
    let denied = c.audit_log("system").await;
    assert!(
        denied.iter().any(|e| e.action == "node.denied"
            && e.target == "grpc/Heartbeat"
            && e.actor.id == b.id
            && e.reason
                .as_deref()
                .is_some_and(|r| r.contains("GPU-node-a-0"))),
        "the refusal is audited"
    );
    // Its own GPU, plus a sample for one it does not have: only its own is recorded.
    let mut mixed = b.heartbeat();
    mixed.gpus[0].sample = Some(sample(0.25));
    b.client.clone().heartbeat(mixed).await.expect("own GPU");
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let gpus_of = |id: &str| {
        nodes
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["id"] == id)
            .map(|n| n["gpus"].clone())
            .expect("node")
    };
    assert_eq!(gpus_of(&a.id)[0]["uuid"], "GPU-node-a-0");
    assert_eq!(gpus_of(&b.id)[0]["uuid"], "GPU-node-b-0");
    let (status, a_samples) = c
        .get(&format!("/api/v1/nodes/{}/gpus/GPU-node-a-0/samples", a.id))
        .await;
    assert!(status.is_success(), "{a_samples}");
    assert!(
        !a_samples.to_string().contains("0.99"),
        "node b wrote node a's metrics: {a_samples}"
    );

    // Bounds, each refused as INVALID_ARGUMENT naming the field, never INTERNAL.
    type Change = Box<dyn Fn(&mut HeartbeatRequest)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "gpus",
            Box::new(|h: &mut HeartbeatRequest| {
                let one = h.gpus[0].clone();
                h.gpus = (0..64)
                    .map(|i| Gpu {
                        uuid: format!("GPU-many-{i}"),
                        index: i,
                        ..one.clone()
                    })
                    .collect();
            }),
        ),
        (
            "gpus[0].model",
            Box::new(|h: &mut HeartbeatRequest| h.gpus[0].model = "x".repeat(20_000)),
        ),
        (
            "gpus[0].memory_bytes",
            Box::new(|h: &mut HeartbeatRequest| h.gpus[0].memory_bytes = 1 << 63),
        ),
        (
            "gpus[1].uuid",
            Box::new(|h: &mut HeartbeatRequest| {
                let mut again = h.gpus[0].clone();
                again.index = 1;
                h.gpus.push(again);
            }),
        ),
    ];
    for (field, change) in cases {
        let mut h = b.heartbeat();
        change(&mut h);
        let err = b.client.clone().heartbeat(h).await.expect_err(field);
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err}");
        assert!(err.message().starts_with(field), "{field}: {err}");
    }
    let request = node_request("node-c").expect("CSR");
    let mut huge = register_req(
        &bootstrap_token(&c.server).await,
        "node-c",
        &request.csr_pem,
    );
    huge.memory_bytes = 1 << 63;
    let err = client(&c, None).register(huge).await.expect_err("memory");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().starts_with("memory_bytes"), "{err}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_token_admits_only_its_node_and_replaces_one_only_when_made_to() {
    use allot_system_tests::bootstrap_token_for;
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let real = enroll(
        &c,
        &bootstrap_token_for(&c.server, "dev-node-2", false).await,
        "dev-node-2",
    )
    .await
    .expect("the real node");

    // A token made for gpu-99 does not register as dev-node-2, nor as anything else.
    let for_99 = bootstrap_token_for(&c.server, "gpu-99", false).await;
    for name in ["dev-node-2", "gpu-990", "other"] {
        let err = enroll(&c, &for_99, name).await.err().expect("refused");
        assert_eq!(err.code(), Code::Unauthenticated, "{name}: {err}");
        assert!(err.message().contains("admits node `gpu-99`"), "{err}");
    }
    // A token for any new node does not take over a registered one.
    let any = bootstrap_token_for(&c.server, "*", false).await;
    let err = enroll(&c, &any, "dev-node-2").await.err().expect("refused");
    assert!(err.message().contains("already registered"), "{err}");
    // Nothing of the real node changed: its certificate still works.
    real.client
        .clone()
        .heartbeat(real.heartbeat())
        .await
        .expect("the real node is still trusted");
    // The refused attempts did not spend the tokens.
    enroll(&c, &for_99, "gpu-99").await.expect("gpu-99 itself");

    // An admin's explicit replace takes the name over: the old certificate stops working,
    // and the audit log says so.
    let replace = bootstrap_token_for(&c.server, "dev-node-2", true).await;
    let new = enroll(&c, &replace, "dev-node-2").await.expect("replaced");
    assert_eq!(new.id, real.id, "the same node record");
    let err = real
        .client
        .clone()
        .heartbeat(real.heartbeat())
        .await
        .expect_err("the old certificate is revoked");
    assert_eq!(err.code(), Code::Unauthenticated);
    let (_, entries) = c.get("/api/v1/audit/logs/system/entries?limit=1000").await;
    let replaced = entries.to_string();
    assert!(replaced.contains("node.replace"), "{entries}");

    // Over the API: a token must name its node, with a name or a pattern.
    let (status, body) = c
        .post("/api/v1/bootstrap-tokens", serde_json::json!({}))
        .await;
    assert!(status.is_client_error(), "{status}: {body}");
    let (status, body) = c
        .post(
            "/api/v1/bootstrap-tokens",
            serde_json::json!({ "node_name": "bad name!" }),
        )
        .await;
    assert_eq!(status.as_u16(), 422, "{body}");
    assert!(body.to_string().contains("node_name"), "{body}");
    let (status, body) = c
        .post(
            "/api/v1/bootstrap-tokens",
            serde_json::json!({ "node_name": "gpu-4*", "replace": false }),
        )
        .await;
    assert_eq!(status.as_u16(), 201, "{body}");
    assert_eq!(body["node_name"], "gpu-4*");
    c.shutdown().await;
}

/// An agent's registration call timed out after the control plane had committed it: the
/// token is spent and the certificate lost. The agent sends the same request again (same
/// key) and is registered; anyone else holding the spent token is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_whose_answer_was_lost_is_taken_again_for_the_same_key_only() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let token = bootstrap_token(&c.server).await;
    let request = node_request("gpu-7").expect("CSR");
    let lost = client(&c, None)
        .register(register_req(&token, "gpu-7", &request.csr_pem))
        .await
        .expect("registered")
        .into_inner();
    let again = client(&c, None)
        .register(register_req(&token, "gpu-7", &request.csr_pem))
        .await
        .expect("the same registration, sent again")
        .into_inner();
    assert_eq!(again.node_id, lost.node_id, "one node");
    let mut node = client(&c, Some((&again.certificate_pem, &request.key_pem)));
    let raw = RawNode {
        id: again.node_id.clone(),
        name: "gpu-7".into(),
        key_pem: request.key_pem.clone(),
        cert_pem: again.certificate_pem.clone(),
        client: node.clone(),
    };
    let beat = || raw.heartbeat();
    node.heartbeat(beat())
        .await
        .expect("the retry's certificate works");
    let err = client(&c, Some((&lost.certificate_pem, &request.key_pem)))
        .heartbeat(beat())
        .await
        .expect_err("the lost answer's certificate was revoked");
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    // The spent token with another key, or for another name, admits nobody.
    for (name, csr) in [
        ("gpu-7", node_request("gpu-7").expect("CSR").csr_pem),
        ("gpu-8", request.csr_pem.clone()),
    ] {
        let err = client(&c, None)
            .register(register_req(&token, name, &csr))
            .await
            .expect_err("a second use");
        assert_eq!(err.code(), Code::Unauthenticated, "{name}: {err}");
        assert!(err.message().contains("already used"), "{err}");
    }
    node.heartbeat(beat())
        .await
        .expect("the node is still trusted");
    c.shutdown().await;
}

/// An agent the control plane refuses for good (here a token nobody issued) exits, saying
/// why, instead of running on silently until a signal that a service manager never sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refused_for_good_exits_saying_why() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let mut agent =
        allot_system_tests::agent_process(&c, "refused-1", "1xH200", Some("allot_boot_nonsense"));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = agent.try_wait().expect("agent status") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = agent.kill();
            panic!("the refused agent is still running after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success(), "{status}");
    let log = std::fs::read_to_string(c.data_dir.path().join("refused-1.log")).expect("log");
    assert!(log.contains("bootstrap token"), "{log}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_is_for_the_key_the_node_holds_and_names_both_certificates() {
    use allot_proto::v1::RenewCertificateRequest;
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let a = enroll(&c, &bootstrap_token(&c.server).await, "node-a")
        .await
        .expect("a");
    let old = allot_pki::NodeCert::from_pem(&a.cert_pem).expect("cert");
    // A stolen certificate and key cannot be renewed onto a key of the thief's.
    let thief = node_request("node-a").expect("CSR");
    let err = a
        .client
        .clone()
        .renew_certificate(RenewCertificateRequest {
            csr_pem: thief.csr_pem,
        })
        .await
        .expect_err("another key");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    // For the key it holds, it is renewed, and the audit entry names both serials.
    let same = allot_pki::node_request_for_key("node-a", &a.key_pem).expect("CSR");
    let renewed = a
        .client
        .clone()
        .renew_certificate(RenewCertificateRequest {
            csr_pem: same.csr_pem,
        })
        .await
        .expect("renewed")
        .into_inner();
    let new = allot_pki::NodeCert::from_pem(&renewed.certificate_pem).expect("cert");
    assert_ne!(new.serial, old.serial);
    let (_, entries) = c.get("/api/v1/audit/logs/system/entries?limit=1000").await;
    let renewal = entries
        .as_array()
        .or(entries["entries"].as_array())
        .expect("entries")
        .iter()
        .find(|e| e["action"] == "node.certificate.renew")
        .cloned()
        .expect("the renewal is audited");
    let text = renewal.to_string();
    assert!(
        text.contains(&old.serial) && text.contains(&new.serial),
        "both serials: {renewal:#}"
    );
    assert!(
        renewal["body"]
            .as_str()
            .is_some_and(|b| b.contains(&format!(
                "\"auth_method\":\"node-certificate {}\"",
                old.serial
            ))),
        "the entry's actor names the certificate the node called with: {renewal:#}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_bootstrap_tokens_is_rate_limited_and_recorded() {
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |cfg| cfg.auth_max_failures = 5).await;
    let mut codes = Vec::new();
    for i in 0..30 {
        let err = enroll(&c, &format!("allot_boot_guess{i}"), "gpu-1")
            .await
            .err()
            .expect("a guessed token is refused");
        codes.push(err.code());
    }
    assert_eq!(codes[..5], [Code::Unauthenticated; 5], "{codes:?}");
    assert!(
        codes[5..].iter().all(|c| *c == Code::ResourceExhausted),
        "past the limit the guesses are refused outright: {codes:?}"
    );
    // A real token from the same address still works: nobody is locked out by guesses.
    enroll(&c, &bootstrap_token(&c.server).await, "gpu-1")
        .await
        .expect("a valid token registers");
    let entries = c
        .eventually("the guesses are recorded", || async {
            let e: Vec<_> = c
                .audit_log("system")
                .await
                .into_iter()
                .filter(|e| e.action == "node.unauthenticated" || e.action == "node.rate_limited")
                .collect();
            (e.len() == 30).then_some(e)
        })
        .await;
    assert_eq!(
        entries
            .iter()
            .filter(|e| e.action == "node.rate_limited")
            .count(),
        25
    );
    for e in &entries {
        assert_eq!(e.target, "grpc/Register");
        assert_eq!(e.actor.id, "gpu-1");
        assert_eq!(e.actor.source.as_deref(), Some("127.0.0.1"));
        assert_eq!(e.outcome, allot_domain::Outcome::Denied);
        assert!(
            !format!("{e:?}").contains("guess"),
            "no token in the log: {e:?}"
        );
    }
    c.shutdown().await;
}

/// A cluster on SQLite with one raw node listening for assignments, and the launch of a
/// job (`sleep 300`, attempt 1) it has just received.
async fn a_node_with_a_launch() -> (
    TestCluster,
    RawNode,
    tonic::Streaming<allot_proto::v1::Assignment>,
    String,
) {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let node = enroll(&c, &bootstrap_token(&c.server).await, "gpu-1")
        .await
        .expect("registered");
    let mut stream = node
        .client
        .clone()
        .watch_assignments(WatchAssignmentsRequest {})
        .await
        .expect("watch")
        .into_inner();
    // A leader gives a node work once it has heard what runs there (as an agent's first
    // heartbeat on opening its stream tells it).
    node.client
        .clone()
        .heartbeat(node.heartbeat())
        .await
        .expect("heartbeat");
    c.create_tenant("t", None).await;
    let id = c.submit("t", 1, &["sleep", "300"]).await;
    let launch = stream.message().await.expect("stream").expect("assignment");
    assert!(matches!(launch.kind, Some(Kind::Launch(ref l)) if l.job_id == id && l.attempt == 1));
    (c, node, stream, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_node_still_runs_is_stopped_there_and_its_gpu_is_not_handed_out() {
    let (c, node, mut stream, first) = a_node_with_a_launch().await;
    let report = |id: &str, phase: JobPhase| JobStatusReport {
        job_id: id.to_owned(),
        phase: phase.into(),
        pid: Some(1),
        attempt: 1,
        ..Default::default()
    };
    let mut n = node.client.clone();
    n.report_job_status(report(&first, JobPhase::Running))
        .await
        .expect("running");
    // It says the job succeeded, but its heartbeats go on showing it running.
    n.report_job_status(report(&first, JobPhase::Succeeded))
        .await
        .expect("ended");
    let second = c.submit("t", 1, &["true"]).await;
    let running = |ids: &[&str]| HeartbeatRequest {
        running_job_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        ..node.heartbeat()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut stopped = false;
    while std::time::Instant::now() < deadline {
        n.heartbeat(running(&[&first])).await.expect("heartbeat");
        let (_, job) = c.get(&format!("/api/v1/jobs/{second}")).await;
        assert_eq!(
            job["state"], "pending",
            "the only GPU is still in use: {job}"
        );
        if let Ok(Ok(Some(a))) =
            tokio::time::timeout(Duration::from_millis(100), stream.message()).await
            && let Some(Kind::Cancel(cancel)) = a.kind
        {
            assert_eq!(cancel.job_id, first);
            stopped = true;
        }
    }
    assert!(
        stopped,
        "the node is told to stop the job it should not be running"
    );
    // A job the control plane never heard of is stopped too.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut stopped = false;
    while !stopped && std::time::Instant::now() < deadline {
        n.heartbeat(running(&[&first, "01JNOTAJOB"]))
            .await
            .expect("heartbeat");
        while let Ok(Ok(Some(a))) =
            tokio::time::timeout(Duration::from_millis(100), stream.message()).await
        {
            stopped |= matches!(a.kind, Some(Kind::Cancel(c)) if c.job_id == "01JNOTAJOB");
        }
    }
    assert!(stopped, "the unknown job is stopped on the node");
    // Recorded once each, naming the node.
    let entries = c
        .eventually("the discrepancies are recorded", || async {
            let e: Vec<_> = c
                .audit_log("system")
                .await
                .into_iter()
                .filter(|e| e.action == "node.job_discrepancy")
                .collect();
            (e.len() >= 2).then_some(e)
        })
        .await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[0].target, format!("job/{first}"));
    assert_eq!(entries[1].target, "job/01JNOTAJOB");
    for e in &entries {
        assert_eq!(e.actor.id, node.id);
        assert!(
            e.actor.auth_method.starts_with("node-certificate "),
            "{e:?}"
        );
    }
    assert!(
        entries[0]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("succeeded")
    );
    assert!(
        entries[1]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("does not know")
    );
    // Once the node's heartbeat shows it gone, the GPU goes to the next job.
    n.heartbeat(running(&[])).await.expect("heartbeat");
    c.eventually("the next job is placed", || async {
        let (_, job) = c.get(&format!("/api/v1/jobs/{second}")).await;
        (job["state"] == "scheduled").then_some(())
    })
    .await;
    c.shutdown().await;
}

/// A node asks before it starts an attempt; a refused start is not taken for a delivered
/// launch: the control plane sends the launch again while the attempt is still the node's,
/// and the node may start it once asked again (a refusal can pass, as a lapsed lease does
/// once renewed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_leaves_the_launch_to_be_sent_again() {
    let (c, node, mut stream, id) = a_node_with_a_launch().await;
    let starting = |attempt: u32| JobStatusReport {
        job_id: id.clone(),
        phase: JobPhase::Starting.into(),
        attempt,
        ..Default::default()
    };
    let mut n = node.client.clone();
    let err = n
        .report_job_status(starting(2))
        .await
        .expect_err("not the current attempt");
    assert_eq!(err.code(), Code::FailedPrecondition);
    // Its heartbeats show nothing running: the launch is sent again.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut again = false;
    while !again && std::time::Instant::now() < deadline {
        n.heartbeat(node.heartbeat()).await.expect("heartbeat");
        if let Ok(Ok(Some(a))) =
            tokio::time::timeout(Duration::from_millis(200), stream.message()).await
        {
            again = matches!(a.kind, Some(Kind::Launch(l)) if l.job_id == id && l.attempt == 1);
        }
    }
    assert!(again, "the launch is sent again after a refused start");
    n.report_job_status(starting(1))
        .await
        .expect("the current attempt may start");
    // Once asked and answered yes, the launch counts as delivered: not sent again.
    for _ in 0..5 {
        n.heartbeat(node.heartbeat()).await.expect("heartbeat");
        if let Ok(Ok(Some(a))) =
            tokio::time::timeout(Duration::from_millis(200), stream.message()).await
        {
            assert!(
                !matches!(a.kind, Some(Kind::Launch(_))),
                "sent again after the start was confirmed: {a:?}"
            );
        }
    }
    c.shutdown().await;
}

/// An agent that shuts down (an operator stopping it, Ctrl-C on `allot dev`) stops its jobs,
/// and they go back to the queue as their next attempt: not failed, not counted against
/// their retries, and not kept off the node, which runs them again when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_shutting_down_requeues_its_jobs_instead_of_failing_them() {
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |_| {}).await;
    c.create_tenant("t", None).await;
    let dir = tempfile::tempdir().expect("temp dir");
    async fn start(
        server: &allot_server::RunningServer,
        dir: &std::path::Path,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<Result<(), allot_agent::AgentError>> {
        let backend = allot_agent::gpu::SimBackend::from_spec("1xH200", "stopping")
            .expect("gpus")
            .with_fault_dir(dir.join("sim-faults"));
        let cfg = allot_system_tests::agent_config(server, "stopping", dir.to_owned()).await;
        tokio::spawn(allot_agent::run(cfg, std::sync::Arc::new(backend), stop))
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let agent = start(&c.server, dir.path(), stop.clone()).await;
    // No retries: a failure would end it.
    let (status, body) = c
        .post(
            "/api/v1/jobs",
            serde_json::json!({ "tenant": "t", "gpus": 1, "max_retries": 0, "command": ["sleep", "300"] }),
        )
        .await;
    assert_eq!(status, allot_system_tests::StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().expect("id").to_owned();
    c.wait_for_state(&id, "running").await;
    stop.cancel();
    agent
        .await
        .expect("joined")
        .expect("the agent stopped cleanly");
    let job = c.wait_for_state(&id, "pending").await;
    assert_eq!(job["attempt"], 2, "{job}");
    assert_eq!(job["failures"], 0, "not the job's failure: {job}");
    // Why it went back (the pending reason is the scheduler's, of the moment: no node now).
    let requeued = job["events"]
        .as_array()
        .and_then(|e| e.last())
        .expect("its events");
    assert_eq!(requeued["from"], "running", "{job}");
    assert!(
        requeued["message"]
            .as_str()
            .is_some_and(|m| m.contains("shut down; requeued")),
        "{job}"
    );
    // The node comes back (with the certificate it kept) and the job runs there again.
    let stop = tokio_util::sync::CancellationToken::new();
    let agent = start(&c.server, dir.path(), stop.clone()).await;
    let job = c.wait_for_state(&id, "running").await;
    assert_eq!(job["attempt"], 2, "{job}");
    stop.cancel();
    agent
        .await
        .expect("joined")
        .expect("the agent stopped cleanly");
}

/// A fleet larger than the leader's heartbeat rate is told to heartbeat less often, under a
/// lease stretched alike: the answers say so, the agents follow (fewer beats, every node
/// ready throughout), and the scheduler still places work on nodes that beat that rarely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_beyond_the_heartbeat_rate_is_paced() {
    // Every 300 ms under a 1.5 s lease as configured; four nodes at most 2 beats a second
    // (five with the one registered by hand) make it every 2.5 s under a 12.5 s lease.
    let c = spawn_cluster_with(Backend::Sqlite, 4, "1xH100", |config| {
        config.lease = Duration::from_millis(1_500);
        config.max_heartbeats_per_sec = 2.0;
    })
    .await;
    let raw = enroll(&c, &bootstrap_token(&c.server).await, "by-hand")
        .await
        .expect("registered");
    let paced = c
        .eventually("heartbeats paced", || async {
            let answer = raw
                .client
                .clone()
                .heartbeat(raw.heartbeat())
                .await
                .expect("a heartbeat")
                .into_inner();
            (answer.heartbeat_interval_ms >= 2_000).then_some(answer)
        })
        .await;
    assert_eq!(paced.heartbeat_interval_ms, 2_500, "{paced:?}");
    assert_eq!(paced.lease_duration_ms, 12_500, "{paced:?}");
    let granted = chrono::DateTime::from_timestamp_millis(paced.lease_expires_at_ms)
        .expect("a time")
        - chrono::Utc::now();
    assert!(
        granted > chrono::Duration::seconds(12),
        "the lease runs 12.5 s from the beat: {granted}"
    );

    // The agents adopt it: their leases as recorded are the stretched one.
    c.eventually("agents on the paced lease", || async {
        let (_, nodes) = c.get("/api/v1/nodes").await;
        let leases: Vec<i64> = nodes
            .as_array()?
            .iter()
            .filter(|n| n["name"] != "by-hand")
            .map(|n| {
                let at = |f: &str| {
                    n[f].as_str()
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                };
                at("lease_expires_at")
                    .zip(at("last_heartbeat_at"))
                    .map_or(0, |(l, h)| (l - h).num_milliseconds())
            })
            .collect();
        (leases.len() == 4 && leases.iter().all(|&ms| ms > 12_000)).then_some(())
    })
    .await;
    // Over 6 s: each agent beat two or three times (not twenty), and stayed ready.
    let mut beats: std::collections::HashMap<String, std::collections::HashSet<String>> =
        Default::default();
    let window = std::time::Instant::now();
    while window.elapsed() < Duration::from_secs(6) {
        let (_, nodes) = c.get("/api/v1/nodes").await;
        for n in nodes.as_array().expect("nodes") {
            if n["name"] == "by-hand" {
                continue;
            }
            assert_eq!(n["status"], "ready", "{n}");
            beats
                .entry(n["name"].as_str().unwrap_or_default().to_owned())
                .or_default()
                .insert(n["last_heartbeat_at"].to_string());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(beats.len(), 4);
    for (node, seen) in &beats {
        assert!(
            (2..=5).contains(&seen.len()),
            "{node}: {} heartbeats seen in 6 s",
            seen.len()
        );
    }
    // Quiet for seconds between beats, yet not taken for gone: work is placed there.
    c.create_tenant("t", None).await;
    let id = c.submit("t", 1, &["sleep", "30"]).await;
    c.wait_for_state(&id, "running").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_word_that_it_takes_no_work_is_its_own_and_kept_plain() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let a = enroll(&c, &bootstrap_token(&c.server).await, "node-a")
        .await
        .expect("a");
    let b = enroll(&c, &bootstrap_token(&c.server).await, "node-b")
        .await
        .expect("b");
    let unavailable = |id: &str| {
        let c = &c;
        let id = id.to_owned();
        async move {
            let (_, n) = c.get(&format!("/api/v1/nodes/{id}")).await;
            n["unavailable"].as_str().expect("unavailable").to_owned()
        }
    };
    // A reason with terminal escapes and no end: kept short, without control characters,
    // and on the node that said it only.
    let said = format!("low on disk\u{1b}[2J{}", "x".repeat(10_000));
    b.client
        .clone()
        .heartbeat(HeartbeatRequest {
            unavailable: said,
            ..b.heartbeat()
        })
        .await
        .expect("heartbeat");
    let kept = unavailable(&b.id).await;
    assert!(kept.starts_with("low on disk[2J"), "{kept}");
    assert!(kept.len() <= allot_domain::node::MAX_UNAVAILABLE_LEN);
    assert!(!kept.chars().any(char::is_control));
    assert_eq!(unavailable(&a.id).await, "");
    // Said no more: it takes work again.
    b.client
        .clone()
        .heartbeat(b.heartbeat())
        .await
        .expect("heartbeat");
    assert_eq!(unavailable(&b.id).await, "");
    c.shutdown().await;
}

/// What a stolen node key can no longer do: claim GPUs the node never registered with (32
/// invented ones drew every tenant's jobs and their secrets), by heartbeat or by
/// registering again with the certificate; push the node's own agent off its assignment
/// stream by subscribing over and over (124 times in 25 s did); or flood the leader with
/// heartbeats (about 1,000 a second went unanswered by any limit). Each refusal is
/// recorded. An admin's bootstrap token made to replace the node approves a new inventory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_node_key_invents_no_gpus_takes_no_stream_and_is_rate_limited() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let n = enroll(&c, &bootstrap_token(&c.server).await, "node-n")
        .await
        .expect("enrolled");
    let thief = client(&c, Some((&n.cert_pem, &n.key_pem)));
    let invented = |count: u32| -> Vec<Gpu> {
        let one = n.heartbeat().gpus[0].clone();
        (0..count)
            .map(|i| Gpu {
                uuid: if i == 0 {
                    one.uuid.clone()
                } else {
                    format!("GPU-invented-{i}")
                },
                index: i,
                ..one.clone()
            })
            .collect()
    };
    let mut beat = n.heartbeat();
    beat.gpus = invented(32);
    let err = thief.clone().heartbeat(beat).await.expect_err("32 GPUs");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(err.message().starts_with("31 GPU(s)"), "{err}");
    let same_key = allot_pki::node_request_for_key("node-n", &n.key_pem).expect("CSR");
    let mut again = register_req("", "node-n", &same_key.csr_pem);
    again.gpus = invented(2);
    let err = thief.clone().register(again).await.expect_err("2 GPUs");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    let (_, node) = c.get(&format!("/api/v1/nodes/{}", n.id)).await;
    assert_eq!(node["gpus"].as_array().map(Vec::len), Some(1), "{node}");

    // The node's own stream stays its own, however often the thief subscribes.
    let mut own = n
        .client
        .clone()
        .watch_assignments(WatchAssignmentsRequest {})
        .await
        .expect("the agent's stream")
        .into_inner();
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..124 {
        let code = match thief
            .clone()
            .watch_assignments(WatchAssignmentsRequest {})
            .await
        {
            Ok(_) => Code::Ok,
            Err(e) => e.code(),
        };
        *codes.entry(format!("{code:?}")).or_insert(0) += 1;
    }
    assert!(!codes.contains_key("Ok"), "{codes:?}");
    assert!(
        codes.contains_key("AlreadyExists") && codes.contains_key("ResourceExhausted"),
        "{codes:?}"
    );
    // The agent beats on (the scheduler places work only on nodes that do) ...
    let (mut agent, beat) = (n.client.clone(), n.heartbeat());
    let beating = tokio::spawn(async move {
        loop {
            let _ = agent.heartbeat(beat.clone()).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    // ... and its stream carries the job placed on it.
    c.create_tenant("t", None).await;
    let id = c.submit("t", 1, &["true"]).await;
    let first = tokio::time::timeout(Duration::from_secs(20), own.message())
        .await
        .expect("a launch in time")
        .expect("stream")
        .expect("an assignment");
    beating.abort();
    assert!(
        matches!(&first.kind, Some(Kind::Launch(l)) if l.job_id == id),
        "{first:?}"
    );

    // Registering again with the node's certificate, its own GPUs and an address of the
    // thief's, while the agent is connected, would requeue the node's job (it runs nothing,
    // the thief says) and send the node's work and traffic elsewhere: refused.
    let mut takeover = register_req("", "node-n", &same_key.csr_pem);
    takeover.address = "203.0.113.9".into();
    let err = thief
        .clone()
        .register(takeover.clone())
        .await
        .expect_err("a registration beside the connected agent");
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    assert!(err.message().contains("is connected"), "{err}");
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(job["attempt"], 1, "{job}");
    assert_eq!(job["node_id"], n.id.as_str(), "{job}");
    let (_, node) = c.get(&format!("/api/v1/nodes/{}", n.id)).await;
    assert_ne!(node["address"], "203.0.113.9", "{node}");

    // Heartbeats as fast as they go: past the node's rate, refused.
    let mut limited = 0;
    for _ in 0..500 {
        if let Err(e) = thief.clone().heartbeat(n.heartbeat()).await {
            assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
            limited += 1;
        }
    }
    assert!(limited >= 100, "{limited} of 500 refused");

    let system = c.audit_log("system").await;
    let count = |action: &str, call: &str| {
        system
            .iter()
            .filter(|e| e.action == action && e.target == format!("grpc/{call}"))
            .count()
    };
    assert_eq!(count("node.denied", "Heartbeat"), 1);
    assert_eq!(count("node.denied", "Register"), 2);
    assert!(count("node.denied", "WatchAssignments") >= 1);
    // Rate-limited calls leave one entry per ten seconds, not one each.
    assert_eq!(count("node.rate_limited", "Heartbeat"), 1);
    assert_eq!(count("node.rate_limited", "WatchAssignments"), 1);

    // The agent's stream breaks; it subscribes again (once the node's rate allows), and
    // the re-subscription is recorded.
    drop(own);
    let _back = c
        .eventually("the agent's stream again", || async {
            n.client
                .clone()
                .watch_assignments(WatchAssignmentsRequest {})
                .await
                .ok()
        })
        .await;
    let system = c.audit_log("system").await;
    assert!(
        system
            .iter()
            .any(|e| e.action == "node.resubscribe" && e.target == format!("node/{}", n.id)),
        "the re-subscription is audited"
    );
    // The negative control: with no stream open (the agent restarted), the certificate
    // registers the node again.
    drop(_back);
    let again = c
        .eventually("a registration once the stream is closed", || async {
            thief.clone().register(takeover.clone()).await.ok()
        })
        .await;
    assert_eq!(again.into_inner().node_id, n.id);

    // An admin approves a bigger inventory: a bootstrap token made to replace the node.
    let request = node_request("node-n").expect("CSR");
    let token = allot_system_tests::bootstrap_token_for(&c.server, "node-n", true).await;
    let mut bigger = register_req(&token, "node-n", &request.csr_pem);
    bigger.gpus = invented(2);
    let res = client(&c, None)
        .register(bigger)
        .await
        .expect("approved by the admin's token")
        .into_inner();
    let approved = client(&c, Some((&res.certificate_pem, &request.key_pem)));
    let mut beat = n.heartbeat();
    beat.gpus = invented(2);
    approved
        .clone()
        .heartbeat(beat)
        .await
        .expect("its two GPUs");
    let (_, node) = c.get(&format!("/api/v1/nodes/{}", n.id)).await;
    assert_eq!(node["gpus"].as_array().map(Vec::len), Some(2), "{node}");
    c.shutdown().await;
}
