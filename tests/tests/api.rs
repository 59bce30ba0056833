//! The REST API's contract: every bad input gets a 4xx problem document naming the field,
//! tokens are scoped to their tenant and role, and the OpenAPI document covers every route.

use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster};
use reqwest::Method;
use serde_json::{Value, json};

struct Case {
    name: &'static str,
    method: Method,
    path: &'static str,
    content_type: Option<&'static str>,
    body: Option<String>,
    status: u16,
    field: Option<&'static str>,
}

fn case(
    name: &'static str,
    method: Method,
    path: &'static str,
    body: &str,
    status: u16,
    field: Option<&'static str>,
) -> Case {
    Case {
        name,
        method,
        path,
        content_type: Some("application/json"),
        body: Some(body.to_owned()),
        status,
        field,
    }
}

fn get(name: &'static str, path: &'static str, status: u16, field: Option<&'static str>) -> Case {
    Case {
        name,
        method: Method::GET,
        path,
        content_type: None,
        body: None,
        status,
        field,
    }
}

async fn check(c: &TestCluster, token: Option<&str>, cases: Vec<Case>) {
    let mut failures = Vec::new();
    for case in cases {
        let mut req = c.http.request(case.method.clone(), c.url(case.path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(ct) = case.content_type {
            req = req.header("content-type", ct);
        }
        if let Some(b) = &case.body {
            req = req.body(b.clone());
        }
        let res = req.send().await.expect("request");
        let status = res.status().as_u16();
        let ctype = res
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let text = res.text().await.expect("body");
        let problem: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let fields: Vec<&str> = problem["errors"]
            .as_array()
            .map(|e| e.iter().filter_map(|x| x["field"].as_str()).collect())
            .unwrap_or_default();
        let mut wrong = Vec::new();
        if status != case.status {
            wrong.push(format!("status {status}, wanted {}", case.status));
        }
        if ctype != "application/problem+json" {
            wrong.push(format!("content-type {ctype:?}"));
        }
        if problem["status"].as_u64() != Some(u64::from(status)) {
            wrong.push("problem.status differs from the HTTP status".to_owned());
        }
        if !problem["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("tag:allot.dev"))
            || problem["title"].as_str().is_none_or(str::is_empty)
            || problem["detail"].as_str().is_none_or(str::is_empty)
        {
            wrong.push("type, title or detail missing".to_owned());
        }
        if let Some(f) = case.field
            && !fields.contains(&f)
        {
            wrong.push(format!("fields {fields:?} do not name {f}"));
        }
        if !wrong.is_empty() {
            failures.push(format!("{}: {} — {text}", case.name, wrong.join("; ")));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_problem_naming_the_field() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("acme", None).await;
    let big = format!(
        r#"{{"name":"big","pad":"{}"}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    use Method as M;
    let mut cases = vec![
        // Tenants
        case(
            "unknown field",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"x","colour":1}"#,
            400,
            Some("colour"),
        ),
        case(
            "wrong type",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":5}"#,
            400,
            Some("name"),
        ),
        case(
            "the platform log's name",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"system"}"#,
            422,
            Some("name"),
        ),
        case(
            "a job name that displays as another",
            M::POST,
            "/api/v1/jobs",
            "{\"tenant\":\"acme\",\"name\":\"train\\u202egnp.exe\",\"command\":[\"true\"]}",
            422,
            Some("name"),
        ),
        case(
            "missing name",
            M::POST,
            "/api/v1/tenants",
            "{}",
            400,
            Some("name"),
        ),
        case(
            "bad name",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"Bad_Name"}"#,
            422,
            Some("name"),
        ),
        case(
            "negative quota",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","quota":{"limit":{"gpu_milli":-1}}}"#,
            400,
            Some("quota.limit.gpu_milli"),
        ),
        case(
            "fractional quota",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","quota":{"guaranteed":{"gpu_milli":1.5}}}"#,
            400,
            Some("quota.guaranteed.gpu_milli"),
        ),
        case(
            "absurd gpus",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","quota":{"limit":{"gpu_milli":100000001}}}"#,
            422,
            Some("quota.limit.gpu_milli"),
        ),
        case(
            "guarantee above its limit",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","quota":{"guaranteed":{"gpu_milli":2000},"limit":{"gpu_milli":1000}}}"#,
            422,
            Some("quota.guaranteed.gpu_milli"),
        ),
        case(
            "unknown parent",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","parent":"nope"}"#,
            422,
            Some("parent"),
        ),
        case(
            "team guaranteed more than its parent",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","parent":"acme","quota":{"guaranteed":{"gpu_milli":1000}}}"#,
            422,
            Some("quota"),
        ),
        case(
            "unknown isolation",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","quota":{"min_isolation":"private"}}"#,
            400,
            Some("quota.min_isolation"),
        ),
        case(
            "absurd memory",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","quota":{"limit":{"gpu_memory_bytes":1152921504606846976}}}"#,
            422,
            Some("quota.limit.gpu_memory_bytes"),
        ),
        case(
            "unknown quota field",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q","quota":{"gpu":1}}"#,
            400,
            Some("quota.gpu"),
        ),
        case(
            "duplicate",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"acme"}"#,
            409,
            None,
        ),
        case(
            "truncated json",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"#,
            400,
            Some("name"),
        ),
        case(
            "not json",
            M::POST,
            "/api/v1/tenants",
            "name=x",
            400,
            Some("body"),
        ),
        case(
            "not an object",
            M::POST,
            "/api/v1/tenants",
            "[]",
            400,
            Some("body"),
        ),
        case(
            "trailing data",
            M::POST,
            "/api/v1/tenants",
            r#"{"name":"q"} {}"#,
            400,
            Some("body"),
        ),
        case(
            "empty body",
            M::POST,
            "/api/v1/tenants",
            "",
            400,
            Some("body"),
        ),
        case(
            "oversized body",
            M::POST,
            "/api/v1/tenants",
            &big,
            413,
            None,
        ),
        Case {
            content_type: Some("text/plain"),
            ..case(
                "text body",
                M::POST,
                "/api/v1/tenants",
                r#"{"name":"q"}"#,
                415,
                None,
            )
        },
        Case {
            content_type: None,
            ..case(
                "no content type",
                M::POST,
                "/api/v1/tenants",
                r#"{"name":"q"}"#,
                415,
                None,
            )
        },
        get("unknown tenant", "/api/v1/tenants/nope", 404, None),
        get(
            "quota of unknown tenant",
            "/api/v1/tenants/nope/quota",
            404,
            None,
        ),
        // Quotas
        case(
            "quota of unknown tenant",
            M::PUT,
            "/api/v1/tenants/nope/quota",
            "{}",
            404,
            None,
        ),
        case(
            "quota wrong type",
            M::PUT,
            "/api/v1/tenants/acme/quota",
            r#"{"weight":"many"}"#,
            400,
            Some("weight"),
        ),
        case(
            "quota absurd",
            M::PUT,
            "/api/v1/tenants/acme/quota",
            r#"{"weight":0}"#,
            422,
            Some("weight"),
        ),
        // Jobs
        case(
            "unknown tenant in job",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"nope","command":["true"]}"#,
            422,
            Some("tenant"),
        ),
        case(
            "admin job without tenant",
            M::POST,
            "/api/v1/jobs",
            r#"{"command":["true"]}"#,
            422,
            Some("tenant"),
        ),
        // Without an image, a job must name its program.
        case(
            "missing command",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme"}"#,
            422,
            Some("command"),
        ),
        case(
            "malformed image",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","image":"Not An Image"}"#,
            422,
            Some("image"),
        ),
        case(
            "unknown network",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","command":["true"],"network":"bridge"}"#,
            422,
            Some("network"),
        ),
        case(
            "the node's network without the tenant's policy",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","command":["true"],"network":"host"}"#,
            422,
            Some("network"),
        ),
        case(
            "an egress rule that is no IPv4 network",
            M::PUT,
            "/api/v1/tenants/acme/policy",
            r#"{"egress":[{"cidr":"10.0.0.0/8","ports":"443"},{"cidr":"2001:db8::/32"}]}"#,
            422,
            Some("egress[1].cidr"),
        ),
        case(
            "egress ports out of range",
            M::PUT,
            "/api/v1/tenants/acme/policy",
            r#"{"egress":[{"cidr":"10.0.0.0/8","ports":"0-70000"}]}"#,
            422,
            Some("egress[0].ports"),
        ),
        case(
            "workdir climbing out",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","command":["true"],"workdir":"/tmp/x/../../etc"}"#,
            422,
            Some("workdir"),
        ),
        case(
            "empty command",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","command":[]}"#,
            422,
            Some("command"),
        ),
        case(
            "empty program",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","command":[""]}"#,
            422,
            Some("command[0]"),
        ),
        case(
            "non-string argument",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","command":["echo",1]}"#,
            400,
            Some("command[1]"),
        ),
        case(
            "negative gpus",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","gpus":-1,"command":["true"]}"#,
            400,
            Some("gpus"),
        ),
        case(
            "overflowing gpus",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","gpus":1099511627776,"command":["true"]}"#,
            400,
            Some("gpus"),
        ),
        case(
            "absurd gpus",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","gpus":5000,"command":["true"]}"#,
            422,
            Some("gpus"),
        ),
        case(
            "a fraction of two GPUs",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","gpus":2,"gpu_milli":500,"command":["true"]}"#,
            422,
            Some("gpu_milli"),
        ),
        case(
            "unknown isolation",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","isolation":"private","command":["true"]}"#,
            400,
            Some("isolation"),
        ),
        case(
            "priority out of range",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","priority":5000,"command":["true"]}"#,
            422,
            Some("priority"),
        ),
        case(
            "zero gpu memory",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","gpu_memory_bytes":0,"command":["true"]}"#,
            422,
            Some("gpu_memory_bytes"),
        ),
        case(
            "reserved env",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","env":{"ALLOT_JOB_ID":"x"},"command":["true"]}"#,
            422,
            Some("env.ALLOT_JOB_ID"),
        ),
        case(
            "env wrong type",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","env":{"A":1},"command":["true"]}"#,
            400,
            Some("env.A"),
        ),
        case(
            "relative workdir",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","workdir":"tmp","command":["true"]}"#,
            422,
            Some("workdir"),
        ),
        case(
            "unknown job field",
            M::POST,
            "/api/v1/jobs",
            r#"{"tenant":"acme","urgency":9,"command":["true"]}"#,
            400,
            Some("urgency"),
        ),
        get("limit zero", "/api/v1/jobs?limit=0", 400, Some("limit")),
        get(
            "limit huge",
            "/api/v1/jobs?limit=100000",
            400,
            Some("limit"),
        ),
        get("limit text", "/api/v1/jobs?limit=abc", 400, Some("limit")),
        get(
            "bogus state",
            "/api/v1/jobs?state=running,bogus",
            400,
            Some("state"),
        ),
        get(
            "unknown parameter",
            "/api/v1/jobs?colour=red",
            400,
            Some("colour"),
        ),
        get(
            "bad page token",
            "/api/v1/jobs?page_token=xyz",
            422,
            Some("page_token"),
        ),
        get(
            "unknown tenant filter",
            "/api/v1/jobs?tenant=nope",
            404,
            None,
        ),
        get(
            "unknown job",
            "/api/v1/jobs/00000000-0000-0000-0000-000000000000",
            404,
            None,
        ),
        get("garbage job id", "/api/v1/jobs/..%2F..%2Fetc", 404, None),
        case(
            "cancel unknown job",
            M::POST,
            "/api/v1/jobs/nope/cancel",
            "",
            404,
            None,
        ),
        get("log of unknown job", "/api/v1/jobs/nope/log", 404, None),
        // Tokens
        case(
            "unknown role",
            M::POST,
            "/api/v1/tokens",
            r#"{"name":"t","role":"god"}"#,
            400,
            Some("role"),
        ),
        case(
            "member without tenant",
            M::POST,
            "/api/v1/tokens",
            r#"{"name":"t","role":"member"}"#,
            422,
            Some("tenant"),
        ),
        case(
            "admin with tenant",
            M::POST,
            "/api/v1/tokens",
            r#"{"name":"t","role":"admin","tenant":"acme"}"#,
            422,
            Some("tenant"),
        ),
        case(
            "token for unknown tenant",
            M::POST,
            "/api/v1/tokens",
            r#"{"name":"t","role":"member","tenant":"nope"}"#,
            422,
            Some("tenant"),
        ),
        case(
            "zero lifetime",
            M::POST,
            "/api/v1/tokens",
            r#"{"name":"t","role":"admin","expires_in_seconds":0}"#,
            422,
            Some("expires_in_seconds"),
        ),
        case(
            "negative lifetime",
            M::POST,
            "/api/v1/tokens",
            r#"{"name":"t","role":"admin","expires_in_seconds":-5}"#,
            400,
            Some("expires_in_seconds"),
        ),
        case(
            "empty token name",
            M::POST,
            "/api/v1/tokens",
            r#"{"name":" ","role":"admin"}"#,
            422,
            Some("name"),
        ),
        Case {
            body: None,
            content_type: None,
            ..case(
                "revoke unknown token",
                M::DELETE,
                "/api/v1/tokens/nope",
                "",
                404,
                None,
            )
        },
        // Nodes and routing
        get("unknown node", "/api/v1/nodes/nope", 404, None),
        get("unknown route", "/api/v1/gpus", 404, None),
        Case {
            body: None,
            content_type: None,
            ..case("wrong method", M::DELETE, "/api/v1/jobs", "", 405, None)
        },
    ];
    // The cancel-unknown case has no body; the API must not care.
    for c in &mut cases {
        if c.name == "cancel unknown job" {
            c.body = None;
            c.content_type = None;
        }
    }
    check(&c, Some(&c.admin_token), cases).await;

    // Nothing was created by any of the rejected requests.
    let (_, tenants) = c.get("/api/v1/tenants").await;
    assert_eq!(tenants.as_array().map(Vec::len), Some(1), "{tenants}");
    let (_, jobs) = c.get("/api/v1/jobs").await;
    assert_eq!(jobs["items"].as_array().map(Vec::len), Some(0), "{jobs}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_token_are_refused() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let cases = || {
        vec![
            get("no token", "/api/v1/jobs", 401, None),
            get("no token, tenants", "/api/v1/tenants", 401, None),
            case(
                "no token, submit",
                Method::POST,
                "/api/v1/jobs",
                r#"{"command":["true"]}"#,
                401,
                None,
            ),
        ]
    };
    check(&c, None, cases()).await;
    check(&c, Some("allot_not-a-real-token"), cases()).await;
    let res = c
        .http
        .get(c.url("/api/v1/jobs"))
        .header("authorization", format!("Basic {}", c.admin_token))
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(res.headers().contains_key("www-authenticate"));
    // Health endpoints need no token.
    for path in ["/healthz", "/readyz"] {
        let res = c.http.get(c.url(path)).send().await.expect("health");
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    c.shutdown().await;
}

async fn token(c: &TestCluster, as_token: &str, body: Value) -> (StatusCode, Value) {
    c.request(Method::POST, "/api/v1/tokens", Some(as_token), Some(body))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_scoped_to_their_tenant_and_role() {
    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("red", None).await;
    c.create_tenant("blue", None).await;
    let admin = c.admin_token.clone();
    let mk = |tenant: &'static str, role: &'static str| json!({ "name": format!("{tenant}-{role}"), "tenant": tenant, "role": role });
    let (s, red_admin) = token(&c, &admin, mk("red", "tenant-admin")).await;
    assert_eq!(s, StatusCode::CREATED, "{red_admin}");
    let red_admin = red_admin["secret"].as_str().expect("secret").to_owned();
    assert!(red_admin.starts_with("allot_"));
    let (_, red_viewer) = token(&c, &red_admin, mk("red", "viewer")).await;
    let red_viewer = red_viewer["secret"].as_str().expect("secret").to_owned();
    let (_, red_member) = token(&c, &red_admin, mk("red", "member")).await;
    let red_member_id = red_member["token"]["id"].as_str().expect("id").to_owned();
    let red_member = red_member["secret"].as_str().expect("secret").to_owned();

    // A tenant admin cannot mint tokens for others or above itself.
    let (s, _) = token(&c, &red_admin, mk("blue", "member")).await;
    assert_eq!(
        s,
        StatusCode::UNPROCESSABLE_ENTITY,
        "blue is invisible to red"
    );
    let (s, _) = token(&c, &red_admin, json!({"name": "x", "role": "admin"})).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = token(&c, &red_member, mk("red", "viewer")).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "members do not manage tokens");

    // The member submits without naming the tenant; it runs.
    let (s, job) = c
        .request(
            Method::POST,
            "/api/v1/jobs",
            Some(&red_member),
            Some(json!({"command": ["true"]})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{job}");
    assert_eq!(job["tenant"], "red");
    let red_job = job["id"].as_str().expect("id").to_owned();
    c.wait_for_state(&red_job, "succeeded").await;
    let blue_job = c.submit("blue", 0, &["true"]).await;

    // Viewers read but do not write.
    let (s, _) = c
        .request(
            Method::POST,
            "/api/v1/jobs",
            Some(&red_viewer),
            Some(json!({"command": ["true"]})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = c
        .request(
            Method::GET,
            &format!("/api/v1/jobs/{red_job}"),
            Some(&red_viewer),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    // Another tenant's job, tenant and jobs list do not exist for red.
    for path in [
        format!("/api/v1/jobs/{blue_job}"),
        "/api/v1/tenants/blue".to_owned(),
        "/api/v1/jobs?tenant=blue".to_owned(),
    ] {
        let (s, _) = c.request(Method::GET, &path, Some(&red_member), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, _) = c
        .request(
            Method::POST,
            &format!("/api/v1/jobs/{blue_job}/cancel"),
            Some(&red_member),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, jobs) = c
        .request(Method::GET, "/api/v1/jobs", Some(&red_member), None)
        .await;
    let tenants: Vec<_> = jobs["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|j| j["tenant"].clone())
        .collect();
    assert_eq!(tenants, [json!("red")]);
    let (_, list) = c
        .request(Method::GET, "/api/v1/tenants", Some(&red_member), None)
        .await;
    assert_eq!(list.as_array().map(Vec::len), Some(1));
    // Only admins create tenants or change quotas.
    let (s, _) = c
        .request(
            Method::POST,
            "/api/v1/tenants",
            Some(&red_admin),
            Some(json!({"name": "green"})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = c
        .request(
            Method::PUT,
            "/api/v1/tenants/red/quota",
            Some(&red_admin),
            Some(json!({"limit": {"gpu_milli": 99000}})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Revocation takes effect at once; listings never show secrets but do show last use.
    let (s, _) = c
        .request(
            Method::DELETE,
            &format!("/api/v1/tokens/{red_member_id}"),
            Some(&red_admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, problem) = c
        .request(Method::GET, "/api/v1/jobs", Some(&red_member), None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(problem["detail"], "the token has been revoked");
    let (_, listed) = c
        .request(Method::GET, "/api/v1/tokens", Some(&red_admin), None)
        .await;
    let listed = listed.as_array().expect("tokens");
    assert_eq!(listed.len(), 3, "red sees only red's tokens");
    assert!(
        listed
            .iter()
            .all(|t| t.get("secret").is_none() && t["tenant"] == "red")
    );
    assert!(listed.iter().any(|t| t["last_used_at"].is_string()));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tokens_stop_working() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let (s, t) = token(
        &c,
        &c.admin_token,
        json!({"name": "brief", "role": "admin", "expires_in_seconds": 1}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let secret = t["secret"].as_str().expect("secret").to_owned();
    let (s, _) = c
        .request(Method::GET, "/api/v1/nodes", Some(&secret), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (s, problem) = c
        .request(Method::GET, "/api/v1/nodes", Some(&secret), None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(problem["detail"], "the token has expired");
    // The refusal is audited under the token's own id.
    let (_, page) = c.get("/api/v1/audit/logs/system/entries?limit=1000").await;
    let named = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .any(|e| {
            let body: Value =
                serde_json::from_str(e["body"].as_str().unwrap_or("")).unwrap_or(Value::Null);
            body["action"] == "api.unauthenticated" && body["actor"]["id"] == t["token"]["id"]
        });
    assert!(named, "{page}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_covers_every_route() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let res = c
        .http
        .get(c.url("/api/v1/openapi.json"))
        .send()
        .await
        .expect("openapi");
    assert_eq!(res.status(), StatusCode::OK);
    let doc: Value = res.json().await.expect("json");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    // Every served route but the document itself, from the API's own route table.
    let expected: Vec<(&str, String)> = allot_api::route_table()
        .into_iter()
        .filter(|r| r.path != "/api/v1/openapi.json")
        .map(|r| (r.path, r.method.as_str().to_ascii_lowercase()))
        .collect();
    for (path, method) in &expected {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is served but not documented"
        );
    }
    let documented: usize = doc["paths"]
        .as_object()
        .expect("paths")
        .values()
        .map(|p| p.as_object().map_or(0, |m| m.len()))
        .sum();
    assert_eq!(
        documented,
        expected.len(),
        "every documented route is served"
    );
    for schema in [
        "SubmitJob",
        "JobView",
        "Problem",
        "CreateTenant",
        "QuotaBody",
        "CreateToken",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    c.shutdown().await;
}

/// A quota change changes only what it names (a JSON merge patch): a MIG limit leaves the
/// GPUs, weight, isolation and budget as they were; `null` lifts one thing; an unknown
/// field is named. (A whole-quota PUT used to reset whatever it did not name.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_change_changes_only_what_it_names() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    let (status, body) = c
        .post(
            "/api/v1/tenants",
            json!({ "name": "demo", "quota": {
                "guaranteed": { "gpu_milli": 2000, "memory_bytes": 1u64 << 30 },
                "limit": { "gpu_milli": 4000 },
                "weight": 3, "min_isolation": "dedicated",
                "mig_limits": { "1g.18gb": 2 }, "gpu_hour_budget": 500.0,
            }}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let patch = |body: Value| {
        let c = &c;
        async move {
            c.request(
                Method::PATCH,
                "/api/v1/tenants/demo/quota",
                Some(&c.admin_token),
                Some(body),
            )
            .await
        }
    };
    // The README's `set-quota demo --mig-limit 3g.71gb=1`: only that.
    let (status, t) = patch(json!({ "mig_limits": { "3g.71gb": 1 } })).await;
    assert_eq!(status, StatusCode::OK, "{t}");
    let q = &t["quota"];
    assert_eq!(q["guaranteed"]["gpu_milli"], 2000, "{q}");
    assert_eq!(q["guaranteed"]["memory_bytes"], 1u64 << 30, "{q}");
    assert_eq!(q["limit"]["gpu_milli"], 4000, "{q}");
    assert_eq!(q["weight"], 3, "{q}");
    assert_eq!(q["min_isolation"], "dedicated", "{q}");
    assert_eq!(
        q["mig_limits"],
        json!({ "1g.18gb": 2, "3g.71gb": 1 }),
        "{q}"
    );
    assert_eq!(q["gpu_hour_budget"], 500.0, "{q}");
    // What the portal's form sends: the isolation and MIG limits it does not show stay.
    let (status, t) = patch(json!({
        "guaranteed": { "gpu_milli": 1000 }, "limit": { "gpu_milli": 3000 }, "weight": 3,
        "gpu_hour_budget": 500.0,
    }))
    .await;
    assert_eq!(status, StatusCode::OK, "{t}");
    let q = &t["quota"];
    assert_eq!(q["min_isolation"], "dedicated", "{q}");
    assert_eq!(q["guaranteed"]["memory_bytes"], 1u64 << 30, "{q}");
    assert_eq!(
        q["mig_limits"],
        json!({ "1g.18gb": 2, "3g.71gb": 1 }),
        "{q}"
    );
    // `null` lifts a limit, one profile's limit, the budget.
    let (status, t) = patch(json!({
        "limit": { "gpu_milli": null }, "mig_limits": { "1g.18gb": null }, "gpu_hour_budget": null,
    }))
    .await;
    assert_eq!(status, StatusCode::OK, "{t}");
    let q = &t["quota"];
    assert!(q["limit"]["gpu_milli"].is_null(), "{q}");
    assert_eq!(q["mig_limits"], json!({ "3g.71gb": 1 }), "{q}");
    assert!(q["gpu_hour_budget"].is_null(), "{q}");
    assert_eq!(q["guaranteed"]["gpu_milli"], 1000, "{q}");
    // Refused, naming the field; nothing changed.
    let (status, p) = patch(json!({ "limit": { "gpus": 1 } })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{p}");
    assert!(p.to_string().contains("limit.gpus"), "{p}");
    let (status, p) = patch(json!({ "weight": 0 })).await;
    assert!(
        status.is_client_error() && p.to_string().contains("weight"),
        "{status} {p}"
    );
    let (status, p) = patch(json!([1])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{p}");
    let (_, t) = c.get("/api/v1/tenants/demo").await;
    assert_eq!(t["quota"]["mig_limits"], json!({ "3g.71gb": 1 }), "{t}");
}

/// Jobs are found by what people type: the id, a unique prefix of it, or the name when only
/// one job the caller sees has it; a name that several share is refused listing them, and
/// another tenant's job is not found by its name either. (`job get train-resnet` was 404.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_found_by_name_or_id_prefix() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("ml", None).await;
    c.create_tenant("web", None).await;
    let id = c
        .submit_with("ml", json!({ "name": "train-resnet" }), &["true"])
        .await;
    let (s, j) = c.get("/api/v1/jobs/train-resnet").await;
    assert_eq!(s, StatusCode::OK, "{j}");
    assert_eq!(j["id"], id.as_str());
    let (s, j) = c.get(&format!("/api/v1/jobs/{}", &id[..13])).await;
    assert_eq!(s, StatusCode::OK, "{j}");
    assert_eq!(j["id"], id.as_str());
    let (s, _) = c.get(&format!("/api/v1/jobs/{}", &id[..3])).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "too short a prefix");
    // Another tenant's member does not find it by name (nor learns it exists).
    let web = c.token_for("web", "member").await;
    let (s, p) = c
        .request(Method::GET, "/api/v1/jobs/train-resnet", Some(&web), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{p}");
    // A second of that name: the name is ambiguous, and says which jobs it names.
    let second = c
        .submit_with("ml", json!({ "name": "train-resnet" }), &["true"])
        .await;
    let (s, p) = c.get("/api/v1/jobs/train-resnet").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["errors"][0]["field"], "id", "{p}");
    let reason = p["errors"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("names 2 jobs") && reason.contains(&id) && reason.contains(&second),
        "{reason}"
    );
    // The list filters by name.
    let (s, list) = c.get("/api/v1/jobs?name=train-resnet").await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{list}");
    let (s, _) = c.get("/api/v1/jobs?name=").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Verbs take the name too: cancelling by a unique prefix.
    let (s, j) = c
        .post(
            &format!("/api/v1/jobs/{}/cancel", &second[..28]),
            Value::Null,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{j}");
    assert_eq!(j["id"], second.as_str());
}

/// Jobs submitted together share the leading digits of their time-ordered ids (an
/// 8-digit prefix named several), so lists show, and every lookup accepts, a short id: the
/// last 12 hex digits, random. Found on both databases (through the expression index),
/// in any case, only within what the caller may see, and 404 when nothing has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_submitted_together_have_short_ids_people_type() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let c = spawn_cluster(backend, 0, "").await;
        c.create_tenant("ml", None).await;
        c.create_tenant("web", None).await;
        let mut ids = Vec::new();
        for _ in 0..12 {
            ids.push(c.submit("ml", 1, &["true"]).await);
        }
        // What was wrong with a prefix: 8 digits name more than one of them.
        let (s, p) = c.get(&format!("/api/v1/jobs/{}", &ids[0][..8])).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
        let mut shorts = std::collections::BTreeSet::new();
        for id in &ids {
            let short = &id[id.len() - 12..];
            assert!(shorts.insert(short.to_owned()), "{short} twice");
            for key in [short.to_owned(), short.to_ascii_uppercase()] {
                let (s, j) = c.get(&format!("/api/v1/jobs/{key}")).await;
                assert_eq!(s, StatusCode::OK, "{key}: {j}");
                assert_eq!(j["id"], id.as_str());
                assert_eq!(j["short_id"], short);
            }
        }
        // Verbs take it: cancelling by the short id.
        let short = &ids[3][ids[3].len() - 12..];
        let (s, j) = c
            .post(&format!("/api/v1/jobs/{short}/cancel"), Value::Null)
            .await;
        assert_eq!(s, StatusCode::OK, "{j}");
        assert_eq!(j["id"], ids[3].as_str());
        // Another tenant's member does not find it; a short id nothing has is 404.
        let web = c.token_for("web", "member").await;
        let (s, p) = c
            .request(
                Method::GET,
                &format!("/api/v1/jobs/{short}"),
                Some(&web),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{p}");
        let (s, p) = c.get("/api/v1/jobs/000000000000").await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{p}");
        // The CLI lists short ids and takes them.
        let cli = |args: &[&str]| c.cli(args);
        let list = cli(&["job", "list", "--tenant", "ml"]);
        for id in &ids {
            let short = &id[id.len() - 12..];
            assert!(
                list.lines().any(|l| l.starts_with(&format!("{short} "))),
                "{short} in\n{list}"
            );
            assert!(!list.contains(id.as_str()), "the full id in\n{list}");
        }
        let got = cli(&["job", "get", &ids[5][ids[5].len() - 12..]]);
        assert!(got.contains(&ids[5]), "{got}");
        c.shutdown().await;
    }
}

/// A tenant is deleted only when nothing depends on it: not with teams, unfinished jobs or
/// a volume naming it. Deleting it revokes its tokens and bindings and removes its secrets
/// at once; it is gone from every list and lookup, its name is not given to a new tenant,
/// and its audit log and jobs' history stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_deleted_only_when_nothing_depends_on_it() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let c = spawn_cluster(backend, 1, "2xH200").await;
        c.create_tenant("gone", None).await;
        let (s, body) = c
            .post(
                "/api/v1/tenants",
                json!({ "name": "gone-team", "parent": "gone" }),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        let (s, body) = c.delete("/api/v1/tenants/gone").await;
        assert_eq!(s, StatusCode::CONFLICT, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("has teams (gone-team)")),
            "{body}"
        );
        let (s, body) = c.delete("/api/v1/tenants/gone-team").await;
        assert_eq!(s, StatusCode::OK, "{body}");

        // An unfinished job keeps it.
        let job = c.submit("gone", 1, &["sleep", "300"]).await;
        c.wait_for_state(&job, "running").await;
        let (s, body) = c.delete("/api/v1/tenants/gone").await;
        assert_eq!(s, StatusCode::CONFLICT, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("1 unfinished job")),
            "{body}"
        );
        let (s, body) = c
            .post(&format!("/api/v1/jobs/{job}/cancel"), json!({}))
            .await;
        assert!(s.is_success(), "{body}");
        c.wait_for_state(&job, "cancelled").await;

        // So does a volume naming it.
        let (s, body) = c
            .put(
                "/api/v1/volumes/shared",
                json!({ "host_path": "/mnt/shared", "tenants": ["gone"] }),
            )
            .await;
        assert!(s.is_success(), "{body}");
        let (s, body) = c.delete("/api/v1/tenants/gone").await;
        assert_eq!(s, StatusCode::CONFLICT, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("volume shared")),
            "{body}"
        );
        let (s, body) = c.delete("/api/v1/volumes/shared").await;
        assert!(s.is_success(), "{body}");

        // Its token, a secret and a tenant admin of it.
        let viewer = c.token_for("gone", "viewer").await;
        let (s, body) = c
            .put(
                "/api/v1/tenants/gone/secrets/db",
                json!({ "value": "s3cret" }),
            )
            .await;
        assert!(s.is_success(), "{body}");
        let (s, _) = c
            .request(Method::GET, "/api/v1/tenants/gone", Some(&viewer), None)
            .await;
        assert_eq!(s, StatusCode::OK);
        let log = c.get("/api/v1/tenants/gone").await.1["id"]
            .as_str()
            .expect("id")
            .to_owned();

        // Only platform admins delete a tenant.
        let (s, body) = c
            .request(Method::DELETE, "/api/v1/tenants/gone", Some(&viewer), None)
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}");

        let (s, done) = c.delete("/api/v1/tenants/gone").await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["name"], "gone");
        assert_eq!(done["tokens_revoked"], 1, "{done}");
        assert_eq!(done["secrets_removed"], 1, "{done}");

        // Gone from lookups and lists; its token works no more.
        assert_eq!(c.get("/api/v1/tenants/gone").await.0, StatusCode::NOT_FOUND);
        let (_, tenants) = c.get("/api/v1/tenants").await;
        assert!(!tenants.to_string().contains("\"gone\""), "{tenants}");
        let (s, _) = c
            .request(Method::GET, "/api/v1/jobs", Some(&viewer), None)
            .await;
        assert_eq!(
            s,
            StatusCode::UNAUTHORIZED,
            "a deleted tenant's token is revoked"
        );
        let (s, body) = c
            .post(
                "/api/v1/jobs",
                json!({ "tenant": "gone", "command": ["true"] }),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        // Its name is not given to another: its log and history keep it.
        let (s, body) = c.post("/api/v1/tenants", json!({ "name": "gone" })).await;
        assert_eq!(s, StatusCode::CONFLICT, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("was deleted")),
            "{body}"
        );
        // Its job's history and its audit log stay readable, and the deletion is audited.
        let (s, j) = c.get(&format!("/api/v1/jobs/{job}")).await;
        assert_eq!(s, StatusCode::OK, "{j}");
        assert_eq!(j["tenant"], "gone");
        let (s, entries) = c.get(&format!("/api/v1/audit/logs/{log}/entries")).await;
        assert_eq!(s, StatusCode::OK, "{entries}");
        assert!(!entries["entries"].as_array().expect("entries").is_empty());
        let (_, found) = c.get("/api/v1/audit/entries?action=tenant.delete").await;
        assert_eq!(
            found["entries"].as_array().map(Vec::len),
            Some(2),
            "the team and the tenant: {found}"
        );
        // The rest of the fleet goes on.
        c.create_tenant("stays", None).await;
        let other = c.submit("stays", 1, &["true"]).await;
        c.wait_for_state(&other, "succeeded").await;
        c.shutdown().await;
    }
}

/// An auto-sized job (`gpu_sizing`) is a share of one GPU that Allot sizes: it starts at its
/// tenant's default share (a tenth of a GPU unless set; its ceiling when lower), runs
/// elastic unless asked otherwise, is resizable, and sizes its memory too unless it gives a
/// size. What cannot be sized is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_sized_jobs_are_shares_of_one_gpu_and_bad_ones_name_their_field() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("ml", None).await;
    let submit = |extra: serde_json::Value| {
        let mut body = json!({ "tenant": "ml", "command": ["true"] });
        if let (Some(b), serde_json::Value::Object(e)) = (body.as_object_mut(), extra) {
            b.extend(e);
        }
        let c = &c;
        async move { c.post("/api/v1/jobs", body).await }
    };
    let (s, j) = submit(json!({ "gpu_sizing": { "compute": true } })).await;
    assert_eq!(s, StatusCode::CREATED, "{j}");
    assert_eq!(j["gpus"], 1);
    assert_eq!(j["gpu_milli"], 100, "the platform's default share: {j}");
    assert_eq!(j["gpu_resizable"], true);
    assert_eq!(
        j["gpu_compute"], "elastic",
        "a sized share is what it is guaranteed when the GPU is full: {j}"
    );
    // The tenant's default share, as its job limits set it (a team inherits it).
    let (s, l) = c
        .put(
            "/api/v1/tenants/ml/job-limits",
            json!({ "default_gpu_milli": 200 }),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{l}");
    assert_eq!(l["effective"]["default_gpu_milli"], 200, "{l}");
    c.create_tenant_in("ml-team", Some("ml"), json!({})).await;
    let (s, j) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "ml-team", "command": ["true"], "gpu_sizing": { "compute": true } }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{j}");
    assert_eq!(j["gpu_milli"], 200, "{j}");
    let (s, p) = c
        .put(
            "/api/v1/tenants/ml/job-limits",
            json!({ "default_gpu_milli": 1001 }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(p.to_string().contains("default_gpu_milli"), "{p}");
    assert_eq!(
        j["gpu_sizing"],
        json!({ "compute": true, "max_milli": 1000, "memory": true })
    );
    let (s, j) = submit(json!({
        "gpu_sizing": { "compute": true, "max_milli": 100 }, "gpu_memory_bytes": 1u64 << 30,
        "gpu_compute": "strict",
    }))
    .await;
    assert_eq!(s, StatusCode::CREATED, "{j}");
    assert_eq!(
        j["gpu_milli"], 100,
        "a ceiling under its default is where it starts"
    );
    assert_eq!(
        j["gpu_sizing"]["memory"], false,
        "its memory was given: {j}"
    );
    assert_eq!(j["gpu_compute"], "strict", "as asked: {j}");
    for (body, field) in [
        (
            json!({ "gpus": 2, "gpu_sizing": { "compute": true } }),
            "gpu_sizing",
        ),
        (
            json!({ "gpus": 1, "gpu_sizing": { "memory": true } }),
            "gpu_sizing",
        ),
        (
            json!({ "mig_profile": "1g.18gb", "gpu_sizing": { "compute": true } }),
            "gpu_sizing",
        ),
        (
            json!({ "gpu_sizing": { "compute": true, "max_milli": 0 } }),
            "gpu_sizing.max_milli",
        ),
        (
            json!({ "gpu_sizing": { "max_milli": 500 } }),
            "gpu_sizing.max_milli",
        ),
        (
            json!({ "gpu_sizing": { "compute": true }, "isolation": "dedicated" }),
            "isolation",
        ),
        (
            json!({ "gpu_milli": 900, "gpu_sizing": { "compute": true, "max_milli": 300 } }),
            "gpu_milli",
        ),
    ] {
        let (s, p) = submit(body.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {p}");
        assert!(p.to_string().contains(field), "{body}: {p}");
    }
    let (s, p) = submit(json!({ "gpu_sizing": { "compute": true, "sure": 1 } })).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{p}");
    assert!(p.to_string().contains("gpu_sizing.sure"), "{p}");
    // A training job sized by Allot is a share, whatever its class's default isolation.
    let (s, j) = submit(json!({ "gpu_sizing": { "compute": true }, "class": "training" })).await;
    assert_eq!(s, StatusCode::CREATED, "{j}");
    assert_eq!(j["isolation"], "shared", "{j}");
    // Nor can a person resize it above its ceiling (the sizer would bring it down, and
    // resizing again each time would hold the extra).
    let (s, j) = submit(json!({ "gpu_sizing": { "compute": true, "max_milli": 500 } })).await;
    assert_eq!(s, StatusCode::CREATED, "{j}");
    let id = j["id"].as_str().expect("id");
    let (s, p) = c
        .post(
            &format!("/api/v1/jobs/{id}/resize"),
            json!({ "gpu_milli": 700 }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(
        p.to_string().contains("gpu_milli") && p.to_string().contains("sized by Allot up to 0.5"),
        "{p}"
    );
    c.shutdown().await;
}
