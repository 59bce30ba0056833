//! The attack suite: what a malicious tenant, a client behind the same proxy as everyone
//! else, or a prober does to the API, tried against a real control plane, each attack in a
//! table row with what must come of it. Container escapes are in `isolation.rs`, node
//! impersonation in `grpc.rs`, the development sign-in in `signin.rs`.

use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster, spawn_cluster_with};
use reqwest::Method;
use serde_json::{Value, json};

async fn system_log(c: &TestCluster) -> Vec<allot_domain::AuditEntry> {
    c.audit_log("system").await
}

/// One probe of another tenant's resource: the request, and the twin request naming a
/// resource that does not exist at all, which must be answered the same way.
struct Probe {
    what: &'static str,
    method: Method,
    path: String,
    body: Option<Value>,
    nothing: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probing_another_tenant_learns_nothing_and_leaves_a_trace() {
    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("red", None).await;
    c.create_tenant("blue", None).await;
    let blue_job = c.submit("blue", 0, &["sleep", "300"]).await;
    let red = c.token_for("red", "tenant-admin").await;
    let (_, blue) = c.get("/api/v1/tenants/blue").await;
    let blue_id = blue["id"].as_str().expect("blue's id").to_owned();

    let job = |suffix: &str, method: Method, body: Option<Value>| Probe {
        what: "job",
        method,
        path: format!("/api/v1/jobs/{blue_job}{suffix}"),
        body,
        nothing: format!("/api/v1/jobs/01JNOSUCHJOB0000000000000{suffix}"),
    };
    let probes = vec![
        Probe {
            what: "read blue's job",
            ..job("", Method::GET, None)
        },
        Probe {
            what: "read blue's job log",
            ..job("/log", Method::GET, None)
        },
        Probe {
            what: "read blue's job samples",
            ..job("/samples", Method::GET, None)
        },
        Probe {
            what: "cancel blue's job",
            ..job("/cancel", Method::POST, Some(json!({})))
        },
        Probe {
            what: "resize blue's job",
            ..job("/resize", Method::POST, Some(json!({ "gpu_milli": 500 })))
        },
        Probe {
            what: "write blue's quota",
            method: Method::PUT,
            path: "/api/v1/tenants/blue/quota".into(),
            body: Some(json!({ "limit": { "gpu_milli": 100000 } })),
            nothing: "/api/v1/tenants/no-such-tenant/quota".into(),
        },
        Probe {
            what: "read blue's audit log by name",
            method: Method::GET,
            path: "/api/v1/audit/entries?log=blue".into(),
            body: None,
            nothing: "/api/v1/audit/entries?log=no-such-tenant".into(),
        },
        Probe {
            what: "export blue's audit log by name",
            method: Method::GET,
            path: "/api/v1/audit/logs/blue/export".into(),
            body: None,
            nothing: "/api/v1/audit/logs/no-such-tenant/export".into(),
        },
    ];
    let before = system_log(&c).await.len();
    for p in &probes {
        let (status, body) = c
            .request(p.method.clone(), &p.path, Some(&red), p.body.clone())
            .await;
        let (none_status, none_body) = c
            .request(p.method.clone(), &p.nothing, Some(&red), p.body.clone())
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{}: {body}", p.what);
        assert_eq!(status, none_status, "{}: {none_body}", p.what);
        let text = body.to_string();
        for secret in [blue_id.as_str(), "sleep"] {
            assert!(
                !text.contains(secret),
                "{}: the answer leaks `{secret}`: {text}",
                p.what
            );
        }
        assert_eq!(
            body["detail"]
                .as_str()
                .map(|d| d.replace(&blue_job, "X").replace("blue", "X")),
            none_body["detail"].as_str().map(|d| d
                .replace("01JNOSUCHJOB0000000000000", "X")
                .replace("no-such-tenant", "X")),
            "{}: the answer differs from one for nothing at all",
            p.what
        );
    }
    // Blue's job ran on, untouched.
    let (_, now) = c.get(&format!("/api/v1/jobs/{blue_job}")).await;
    assert!(
        ["pending", "scheduled", "running"].contains(&now["state"].as_str().unwrap_or("")),
        "{now}"
    );
    let (_, quota) = c.get("/api/v1/tenants/blue/quota").await;
    assert_ne!(quota["limit"]["gpu_milli"], 100_000, "{quota}");

    // Every probe, and its twin, is in the system log as a denial by red's token.
    let entries = c
        .eventually("the probes are recorded", || async {
            let found: Vec<_> = system_log(&c)
                .await
                .into_iter()
                .skip(before)
                .filter(|e| e.action == "api.not_found")
                .collect();
            (found.len() >= 2 * probes.len()).then_some(found)
        })
        .await;
    let red_id = red_tenant_id(&c).await;
    for p in &probes {
        let target = format!(
            "{} {}",
            p.method,
            p.path.split('?').next().unwrap_or_default()
        );
        let e = entries
            .iter()
            .find(|e| e.target == target)
            .unwrap_or_else(|| panic!("{}: no entry for {target}", p.what));
        assert_eq!(e.outcome, allot_domain::Outcome::Denied, "{}", p.what);
        assert_eq!(e.actor.tenant_id.as_deref(), Some(red_id.as_str()));
        assert_eq!(e.actor.source.as_deref(), Some("127.0.0.1"), "{}", p.what);
    }
    c.shutdown().await;
}

async fn red_tenant_id(c: &TestCluster) -> String {
    let (_, red) = c.get("/api/v1/tenants/red").await;
    red["id"].as_str().expect("red's id").to_owned()
}

/// Sends `GET /api/v1/jobs` with `token`, as the client `forwarded_for` behind the proxy.
async fn as_client(c: &TestCluster, token: &str, forwarded_for: Option<&str>) -> reqwest::Response {
    let mut req = c.http.get(c.url("/api/v1/jobs")).bearer_auth(token);
    if let Some(f) = forwarded_for {
        req = req.header("x-forwarded-for", f);
    }
    req.send().await.expect("sent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_failing_locks_out_no_one_and_a_proxy_names_the_client() {
    // No trusted proxy: everyone is 127.0.0.1, and a forwarding header is ignored.
    let c = spawn_cluster_with(Backend::Sqlite, 0, "1xH200", |cfg| {
        cfg.auth_max_failures = 3
    })
    .await;
    c.create_tenant("red", None).await;
    let member = c.token_for("red", "member").await;
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(
            as_client(&c, "allot_guess", Some("198.51.100.1"))
                .await
                .status(),
        );
    }
    assert_eq!(answers[..3], [StatusCode::UNAUTHORIZED; 3], "{answers:?}");
    assert_eq!(
        answers[3..],
        [StatusCode::TOO_MANY_REQUESTS; 2],
        "{answers:?}"
    );
    for t in [&member, &c.admin_token] {
        let res = as_client(&c, t, None).await;
        assert_eq!(
            res.status(),
            StatusCode::OK,
            "a valid token is served beside the guesser"
        );
    }
    let entries = c
        .eventually("the refusals are recorded", || async {
            let e: Vec<_> = system_log(&c)
                .await
                .into_iter()
                .filter(|e| e.action == "api.unauthenticated" || e.action == "api.rate_limited")
                .collect();
            (e.len() == 5).then_some(e)
        })
        .await;
    assert!(
        entries
            .iter()
            .all(|e| e.actor.source.as_deref() == Some("127.0.0.1")),
        "an untrusted X-Forwarded-For is not believed: {entries:?}"
    );
    c.shutdown().await;

    // Behind a trusted proxy: the forwarded client is the source, counted on its own.
    let c = spawn_cluster_with(Backend::Sqlite, 0, "1xH200", |cfg| {
        cfg.auth_max_failures = 3;
        cfg.trusted_proxies =
            allot_api::client::TrustedProxies::parse(&["127.0.0.1"]).expect("proxies");
    })
    .await;
    c.create_tenant("red", None).await;
    let member = c.token_for("red", "member").await;
    for _ in 0..4 {
        // A client that forges its own X-Forwarded-For is still itself: the proxy appends
        // the address it saw, and that is the one believed.
        as_client(&c, "allot_guess", Some("192.0.2.99, 198.51.100.1")).await;
    }
    let guesser = as_client(&c, "allot_guess", Some("198.51.100.1")).await;
    assert_eq!(guesser.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = as_client(&c, "allot_other_guess", Some("198.51.100.2")).await;
    assert_eq!(
        other.status(),
        StatusCode::UNAUTHORIZED,
        "another client has its own count"
    );
    let ok = as_client(&c, &member, Some("198.51.100.1")).await;
    assert_eq!(
        ok.status(),
        StatusCode::OK,
        "even the guesser's address with a valid token"
    );
    // What the client does is recorded with its own address too.
    let res = c
        .http
        .post(c.url("/api/v1/jobs"))
        .bearer_auth(&member)
        .header("x-forwarded-for", "198.51.100.3")
        .json(&json!({ "tenant": "red", "gpus": 0, "command": ["true"] }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CREATED);
    let red_id = red_tenant_id(&c).await;
    let submit = c
        .eventually("the submit is recorded", || async {
            c.audit_log(&red_id)
                .await
                .into_iter()
                .find(|e| e.action == "job.submit")
        })
        .await;
    assert_eq!(submit.actor.source.as_deref(), Some("198.51.100.3"));
    let entries = c
        .eventually("the refusals are recorded", || async {
            let e: Vec<_> = system_log(&c)
                .await
                .into_iter()
                .filter(|e| e.action.starts_with("api."))
                .collect();
            (e.len() >= 6).then_some(e)
        })
        .await;
    let sources: Vec<_> = entries
        .iter()
        .map(|e| e.actor.source.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        sources.iter().filter(|s| *s == "198.51.100.1").count(),
        5,
        "{sources:?}"
    );
    assert!(sources.contains(&"198.51.100.2".to_owned()), "{sources:?}");
    assert!(
        !sources
            .iter()
            .any(|s| s == "192.0.2.99" || s == "127.0.0.1"),
        "{sources:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wide_telemetry_is_a_right_not_everyones() {
    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("red", None).await;
    c.create_tenant("blue", None).await;
    let blue_job = c.submit("blue", 1, &["sleep", "300"]).await;
    let job = c.wait_for_state(&blue_job, "running").await;
    let gpu = job["gpu_uuids"][0].as_str().expect("a GPU").to_owned();
    let node = job["node_id"].as_str().expect("a node").to_owned();
    let red = c.token_for("red", "tenant-admin").await;
    let samples = format!("/api/v1/nodes/{node}/gpus/{gpu}/samples");
    let (s, body) = c.request(Method::GET, &samples, Some(&red), None).await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "blue's GPU activity is not red's to see: {body}"
    );
    let (s, _) = c.get(&samples).await;
    assert_eq!(s, StatusCode::OK, "platform admins read it");
    // Red still sees the inventory it can ask for.
    let (s, nodes) = c
        .request(Method::GET, "/api/v1/nodes", Some(&red), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(nodes[0]["gpus"][0]["uuid"], gpu.as_str());
    // ... but not what other tenants' jobs hold of each GPU, nor the free GPUs that follow
    // from it: that is cluster-wide telemetry too.
    for n in nodes.as_array().expect("nodes") {
        for hidden in ["gpus_free", "gpus_held", "gpus_unavailable", "gpus_idle"] {
            assert!(n.get(hidden).is_none(), "{n}");
        }
        for g in n["gpus"].as_array().expect("gpus") {
            assert!(g.get("held").is_none() && g.get("jobs").is_none(), "{g}");
        }
    }
    let (_, node_view) = c
        .request(
            Method::GET,
            &format!("/api/v1/nodes/{node}"),
            Some(&red),
            None,
        )
        .await;
    assert!(node_view.get("gpus_free").is_none(), "{node_view}");
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert_eq!(
        nodes[0]["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .filter_map(|g| g["held"].as_f64())
            .sum::<f64>(),
        1.0,
        "platform admins see blue's GPU held: {nodes}"
    );

    // The cluster page: red sees its own jobs per GPU (none), not blue's, and no
    // utilization; the platform admin sees blue's job and the utilization.
    let page = |token: String| {
        let c = &c;
        async move {
            c.http
                .get(c.url("/portal/cluster"))
                .bearer_auth(token)
                .send()
                .await
                .expect("page")
                .text()
                .await
                .expect("html")
        }
    };
    let as_red = page(red.clone()).await;
    assert!(
        as_red.contains("Your jobs")
            && !as_red.contains("Busy now")
            && !as_red.contains("How busy each GPU"),
        "{as_red}"
    );
    let row = as_red
        .split(&gpu)
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .expect("the GPU's row");
    assert!(
        row.contains("<td>0</td>"),
        "red counts no job on blue's GPU: {row}"
    );
    let as_admin = page(c.admin_token.clone()).await;
    assert!(
        as_admin.contains("Busy now") && as_admin.contains("data-chart=\"/portal/cluster/nodes/"),
        "{as_admin}"
    );
    // A node's chart, fetched when it is opened: the admin's, not red's.
    let chart_url = as_admin
        .split("data-chart=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a chart's address")
        .to_owned();
    let chart = |token: String| {
        let (c, url) = (&c, chart_url.clone());
        async move {
            let r = c
                .http
                .get(c.url(&url))
                .bearer_auth(token)
                .send()
                .await
                .expect("chart");
            (r.status(), r.text().await.expect("text"))
        }
    };
    let (s, admin_chart) = chart(c.admin_token.clone()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(admin_chart.contains("How busy each GPU"), "{admin_chart}");
    let (s, red_chart) = chart(red.clone()).await;
    assert_ne!(s, StatusCode::OK, "{red_chart}");
    assert!(!red_chart.contains("How busy each GPU"), "{red_chart}");
    let row = as_admin
        .split(&gpu)
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .expect("the GPU's row");
    assert!(row.contains("<td>1</td>"), "{row}");
    c.shutdown().await;
}

/// The names audit views give an entry's ids are told only to those who may know them: a
/// tenant admin reading its own log learns its own tokens' names, not the names of the
/// platform's tokens or of the people who acted there (the user directory is platform
/// admins'), nor another tenant's; an auditor learns them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_names_are_told_only_to_who_may_know_them() {
    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("red", None).await;
    c.create_tenant("blue", None).await;
    let red = c.token_for("red", "tenant-admin").await;
    let (s, body) = c
        .post(
            "/api/v1/tokens",
            serde_json::json!({ "name": "soc2", "role": "auditor" }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let auditor = body["secret"].as_str().expect("secret").to_owned();
    // The platform admin acts in red's tenant, then red's own admin does.
    c.submit("red", 0, &["true"]).await;
    let (s, body) = c
        .request(
            Method::POST,
            "/api/v1/jobs",
            Some(&red),
            Some(serde_json::json!({ "tenant": "red", "gpus": 0, "command": ["true"] })),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let search = "/api/v1/audit/entries?action=job.submit&limit=10";
    let (s, as_red) = c.request(Method::GET, search, Some(&red), None).await;
    assert_eq!(s, StatusCode::OK, "{as_red}");
    let entries = as_red["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 2, "{as_red}");
    let names: Vec<Option<&str>> = entries.iter().map(|e| e["actor_name"].as_str()).collect();
    assert_eq!(
        names,
        [Some("red-tenant-admin"), None],
        "its own token by name, the platform's not: {as_red}"
    );
    assert!(entries.iter().all(|e| e["log_name"] == "red"), "{as_red}");
    let (s, as_auditor) = c.request(Method::GET, search, Some(&auditor), None).await;
    assert_eq!(s, StatusCode::OK, "{as_auditor}");
    let named = as_auditor["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["actor_name"].is_string())
        .count();
    assert_eq!(named, 2, "an auditor is told every name: {as_auditor}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_failures_count_on_every_replica() {
    // Two replicas on one database (as behind a load balancer that sends each request
    // elsewhere): a guesser spreading its attempts over both is limited as on one.
    let mut shared = None;
    let a = spawn_cluster_with(Backend::Postgres, 0, "", |cfg| {
        cfg.auth_max_failures = 3;
        cfg.secrets_key = allot_store::SecretKeys::generate_line("replicas").expect("key");
        shared = Some(cfg.clone());
    })
    .await;
    let mut config = shared.expect("A's configuration");
    config.http_listen = "127.0.0.1:0".parse().expect("address");
    config.grpc_listen = "127.0.0.1:0".parse().expect("address");
    let checkpoints = tempfile::tempdir().expect("temp dir");
    config.checkpoint_dir = Some(checkpoints.path().to_owned());
    let b = allot_server::start(config, std::sync::Arc::new(allot_domain::SystemClock))
        .await
        .expect("replica B starts");
    let guess = |url: String| {
        let http = a.http.clone();
        async move {
            http.get(url)
                .bearer_auth("allot_guess")
                .send()
                .await
                .expect("sent")
                .status()
        }
    };
    let mut answers = Vec::new();
    for i in 0..5 {
        let url = if i % 2 == 0 {
            a.url("/api/v1/jobs")
        } else {
            format!("{}/api/v1/jobs", b.http_url())
        };
        answers.push(guess(url).await);
    }
    assert_eq!(answers[..3], [StatusCode::UNAUTHORIZED; 3], "{answers:?}");
    assert_eq!(
        answers[3..],
        [StatusCode::TOO_MANY_REQUESTS; 2],
        "counted across replicas: {answers:?}"
    );
    b.shutdown().await;
    a.shutdown().await;
}

/// A hostile page framing the portal (or the development sign-in) to lay its own buttons
/// over Allot's (clickjacking) is refused by the browser: every page says no page may
/// frame it, its error pages too, and keeps its own-origin-only policy for what it loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_page_may_frame_the_portal() {
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |config| {
        config.dev_sign_in = true;
    })
    .await;
    let http = allot_system_tests::http_client()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    for (path, token) in [
        ("/portal", Some(c.admin_token.as_str())),
        (
            "/portal/jobs/01JNOSUCHJOB00000000000000",
            Some(c.admin_token.as_str()),
        ),
        ("/auth/dev", None),
    ] {
        let mut req = http.get(c.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.expect("sent");
        let header = |name: &str| {
            res.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (csp, xfo) = (header("content-security-policy"), header("x-frame-options"));
        assert!(
            csp.split(';').any(|d| d.trim() == "frame-ancestors 'none'"),
            "{path} ({}): {csp:?}",
            res.status()
        );
        assert_eq!(xfo, "DENY", "{path}");
        assert!(
            csp.contains("default-src 'self'") || csp.contains("default-src 'none'"),
            "{path}: {csp:?}"
        );
    }
    c.shutdown().await;
}
