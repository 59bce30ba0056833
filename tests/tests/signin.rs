//! Web sign-in against a real OpenID Connect provider: npm's `oidc-provider` (installed by
//! `scripts/test`) on loopback, driven over HTTP by a cookie-keeping client that follows
//! redirects by hand and fills in the provider's sign-in and consent forms, as a browser
//! would. The whole code flow: sign-in, the session cookie, API calls with it (changes
//! need the CSRF token), sign-out, idle expiry, and the refusals.

use std::sync::Arc;
use std::time::Duration;

use allot_store::testing::Backend;
use allot_system_tests::oidc::{Provider, start_provider};
use allot_system_tests::{TestCluster, spawn_cluster_with};
use reqwest::{Method, StatusCode, Url};
use serde_json::{Value, json};

/// A control plane signing people in through `idp`, whose sessions end after `max` and
/// after `idle` without a request.
async fn cluster_with(idp: &Provider, max: Duration, idle: Duration) -> TestCluster {
    spawn_cluster_with(Backend::Sqlite, 0, "", |c| {
        idp.configure(
            c,
            &[
                "groups=ml-team:member@ml",
                "email=root@example.com:platform-admin",
            ],
            max,
            idle,
        );
    })
    .await
}

async fn cluster(idp: &Provider, idle: Duration) -> TestCluster {
    cluster_with(idp, Duration::from_secs(3600), idle).await
}

/// A browser: keeps cookies, follows nothing by itself.
fn browser() -> reqwest::Client {
    allot_system_tests::http_client()
        .cookie_provider(Arc::new(reqwest::cookie::Jar::default()))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// The `action` of the page's form and the value of its hidden `prompt` field.
fn form_of(html: &str) -> Option<(String, String)> {
    let attr = |name: &str, from: &str| -> Option<String> {
        let start = from.find(&format!("{name}=\""))? + name.len() + 2;
        let end = from[start..].find('"')? + start;
        Some(from[start..end].replace("&amp;", "&"))
    };
    let form = &html[html.find("<form")?..];
    let action = attr("action", form)?;
    let prompt_at = form.find("name=\"prompt\"")?;
    let prompt = attr("value", &form[prompt_at..])?;
    Some((action, prompt))
}

/// Signs `login` in through the provider's own pages, starting at Allot's `/auth/login`;
/// returns where Allot sent the browser at the end.
async fn sign_in(b: &reqwest::Client, c: &TestCluster, login: &str) -> (StatusCode, String) {
    let start = Url::parse(&c.url("/auth/login?return_to=/api/v1/jobs")).expect("url");
    drive(b, start, &c.url("/auth/callback"), true, login).await
}

/// Follows a sign-in from `start` through the provider's pages as `login`, until the
/// browser is sent to `until`: asked (Allot's callback: its status and where it sends the
/// browser), or not (another client's redirect URI, where nothing listens: its URL).
async fn drive(
    b: &reqwest::Client,
    start: Url,
    until: &str,
    ask: bool,
    login: &str,
) -> (StatusCode, String) {
    let mut url = start;
    let mut post: Option<Vec<(String, String)>> = None;
    for _ in 0..20 {
        let arrived = url.as_str().starts_with(until);
        if arrived && !ask {
            return (StatusCode::FOUND, url.to_string());
        }
        let req = match post.take() {
            Some(form) => b.post(url.clone()).form(&form),
            None => b.get(url.clone()),
        };
        let res = req.send().await.expect("request");
        let status = res.status();
        let location = res
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .map(str::to_owned);
        if arrived {
            return (status, location.unwrap_or_default());
        }
        if status.is_redirection() {
            url = url.join(&location.expect("Location")).expect("url");
            continue;
        }
        let html = res.text().await.expect("page");
        assert_eq!(status, StatusCode::OK, "{url}: {html}");
        let (action, prompt) = form_of(&html).unwrap_or_else(|| panic!("no form at {url}: {html}"));
        url = url.join(&action).expect("form action");
        post = Some(match prompt.as_str() {
            "login" => vec![
                ("prompt".into(), "login".into()),
                ("login".into(), login.into()),
                ("password".into(), "any".into()),
            ],
            _ => vec![("prompt".into(), prompt)],
        });
    }
    panic!("the sign-in did not come back to {until}");
}

/// An access token the provider gives `client` (the CLI, say) for `login`, by the code flow
/// with PKCE: opaque, not a JWT.
async fn access_token(idp: &Provider, client: &str, login: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let b = browser();
    let verifier = "a-long-enough-pkce-code-verifier-for-the-test-0123456789";
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()));
    let redirect = format!("http://127.0.0.1/{client}/callback");
    let mut start = Url::parse(&format!("{}/auth", idp.issuer)).expect("url");
    start
        .query_pairs_mut()
        .append_pair("client_id", client)
        .append_pair("response_type", "code")
        .append_pair("scope", "openid email profile")
        .append_pair("redirect_uri", &redirect)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256")
        .append_pair("state", "state-1")
        .append_pair("nonce", "nonce-1");
    let (_, back) = drive(&b, start, &redirect, false, login).await;
    let back = Url::parse(&back).expect("redirect");
    let code = back
        .query_pairs()
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no code in {back}"));
    let res = b
        .post(format!("{}/token", idp.issuer))
        .basic_auth(client, Some(format!("{client}-secret")))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", &redirect),
            ("code_verifier", verifier),
        ])
        .send()
        .await
        .expect("token request");
    let body: Value = res.json().await.expect("token response");
    body["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no access token: {body}"))
        .to_owned()
}

async fn call(
    b: &reqwest::Client,
    c: &TestCluster,
    method: Method,
    path: &str,
    csrf: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = b.request(method, c.url(path));
    if let Some(t) = csrf {
        req = req.header("x-csrf-token", t);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.expect("request");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_flow_signs_in_and_out_with_a_session_and_csrf_protection() {
    let idp = start_provider();
    let c = cluster(&idp, Duration::from_secs(3600)).await;
    c.create_tenant("ml", None).await;
    let b = browser();

    let (status, back_to) = sign_in(&b, &c, "alice").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(back_to, "/api/v1/jobs", "back where the sign-in started");

    let (s, me) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
    assert_eq!(s, StatusCode::OK, "{me}");
    assert_eq!(me["auth_method"], "session");
    let csrf = me["csrf_token"].as_str().expect("a CSRF token").to_owned();
    assert!(
        me["roles"]
            .as_array()
            .expect("roles")
            .iter()
            .any(|r| r["role"] == "member"),
        "the groups claim made alice a member of ml: {me}"
    );

    let job = json!({ "tenant": "ml", "gpus": 64, "command": ["true"] });
    let (s, _) = call(&b, &c, Method::GET, "/api/v1/jobs?tenant=ml", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, p) = call(
        &b,
        &c,
        Method::POST,
        "/api/v1/jobs",
        None,
        Some(job.clone()),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "a change without the CSRF token: {p}"
    );
    let (s, p) = call(
        &b,
        &c,
        Method::POST,
        "/api/v1/jobs",
        Some("wrong"),
        Some(job.clone()),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "a change with a wrong CSRF token: {p}"
    );
    let (s, p) = call(&b, &c, Method::POST, "/api/v1/jobs", Some(&csrf), Some(job)).await;
    assert_eq!(s, StatusCode::CREATED, "{p}");

    // The sign-in and the job are on record under the user.
    let (_, page) = c
        .get("/api/v1/audit/entries?log=system&action=session.start")
        .await;
    let entry: Value =
        serde_json::from_str(page["entries"][0]["body"].as_str().expect("entry")).expect("json");
    assert_eq!(entry["actor"]["kind"], "user");
    assert_eq!(entry["actor"]["auth_method"], "oidc-code-flow");

    // Sign-out needs the token too, and ends the session for good.
    let (s, _) = call(&b, &c, Method::POST, "/auth/logout", None, None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = call(&b, &c, Method::POST, "/auth/logout", Some(&csrf), None).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let (s, _) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_ins_that_do_not_belong_to_this_browser_or_person_are_refused() {
    let idp = start_provider();
    let c = cluster(&idp, Duration::from_secs(3600)).await;
    let b = browser();

    // A callback this browser never started (login CSRF): refused.
    let (s, p) = call(
        &b,
        &c,
        Method::GET,
        "/auth/callback?code=stolen&state=made-up",
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{p}");

    // A person the provider knows but Allot has removed cannot sign in again.
    let (s, _) = sign_in(&b, &c, "mallory").await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let mallory = c.user_id("mallory").await;
    let (s, _) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = c.delete(&format!("/api/v1/users/{mallory}")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "the live session ends with the user"
    );
    let fresh = browser();
    let (s, _) = sign_in(&fresh, &c, "mallory").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "and a new sign-in is refused");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_at_its_absolute_expiry_however_active() {
    let idp = start_provider();
    let c = cluster_with(&idp, Duration::from_secs(1), Duration::from_secs(3600)).await;
    let b = browser();
    let (s, _) = sign_in(&b, &c, "root").await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    for _ in 0..3 {
        let (s, _) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
        assert_eq!(s, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (s, p) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{p}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_expires() {
    let idp = start_provider();
    let c = cluster(&idp, Duration::from_secs(1)).await;
    let b = browser();
    let (s, _) = sign_in(&b, &c, "root").await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let (s, me) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
    assert_eq!(s, StatusCode::OK, "{me}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (s, p) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{p}");
    assert!(
        p["detail"].as_str().is_some_and(|d| d.contains("expired")),
        "{p}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_development_sign_in_exists_only_in_dev_mode_on_loopback() {
    let c = allot_system_tests::spawn_cluster(Backend::Sqlite, 0, "").await;
    let b = browser();
    for method in [Method::GET, Method::POST] {
        let (s, _) = call(&b, &c, method.clone(), "/auth/dev", None, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{method} /auth/dev on a server");
    }
    c.shutdown().await;

    let db = allot_store::testing::TestDb::new(Backend::Sqlite)
        .await
        .expect("database");
    let mut config = allot_server::ServerConfig::new(db.url.clone());
    config.http_listen = "0.0.0.0:0".parse().expect("address");
    config.dev_sign_in = true;
    let refused = allot_server::start(config, Arc::new(allot_domain::SystemClock)).await;
    assert!(
        matches!(refused, Err(allot_server::ServerError::DevSignInExposed(_))),
        "the development sign-in is refused off loopback"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_development_sign_in_refuses_other_hosts_other_origins_and_forms_without_its_token() {
    use allot_store::{IdentityRepo, NewBinding, SignIn};
    let c = allot_system_tests::spawn_cluster_with(Backend::Sqlite, 0, "", |config| {
        config.dev_sign_in = true;
    })
    .await;
    let user = c
        .server
        .store
        .sign_in(SignIn {
            issuer: allot_api::signin::DEV_ISSUER.to_owned(),
            subject: "dev-admin".into(),
            email: None,
            name: Some("Dev Admin".into()),
        })
        .await
        .expect("dev user");
    c.server
        .store
        .create_binding(
            &allot_domain::AuditContext::system("test"),
            NewBinding {
                subject: allot_domain::BindingSubject::User {
                    user_id: user.id.clone(),
                },
                role: allot_domain::Role::Admin,
                tenant_id: None,
            },
        )
        .await
        .expect("binding");
    let port = c.server.http_addr.port();
    let evil = format!("rebind.evil.example:{port}");

    // A hostile page that got its name to resolve to 127.0.0.1 (DNS rebinding) sends its
    // own name as the host: neither the page nor the sign-in answers it.
    let b = browser();
    for method in [Method::GET, Method::POST] {
        let res = b
            .request(method.clone(), c.url("/auth/dev"))
            .header("host", &evil)
            .form(&[("user", user.id.as_str())])
            .send()
            .await
            .expect("sent");
        assert_eq!(
            res.status(),
            StatusCode::FORBIDDEN,
            "{method} with Host {evil}"
        );
    }
    // A cross-site form post, with the right host but without the page's token: refused.
    let res = b
        .post(c.url("/auth/dev"))
        .form(&[("user", user.id.as_str())])
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::FORBIDDEN, "no token");
    // The page's own form works, once, from its own origin only.
    let page = b
        .get(c.url("/auth/dev"))
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    let token = allot_system_tests::dev_sign_in_token(&page).to_owned();
    let res = b
        .post(c.url("/auth/dev"))
        .header("origin", "http://rebind.evil.example")
        .form(&[("user", user.id.as_str()), ("csrf_token", &token)])
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::FORBIDDEN, "another origin");
    let res = b
        .post(c.url("/auth/dev"))
        .header("origin", format!("http://127.0.0.1:{port}"))
        .form(&[("user", user.id.as_str()), ("csrf_token", &token)])
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "its own page's form");
    // With the session: a change from another origin is refused even with the CSRF token.
    let (_, me) = call(&b, &c, Method::GET, "/auth/session", None, None).await;
    let csrf = me["csrf_token"].as_str().expect("csrf").to_owned();
    let res = b
        .post(c.url("/api/v1/tenants"))
        .header("x-csrf-token", &csrf)
        .header("origin", "http://rebind.evil.example")
        .json(&serde_json::json!({ "name": "from-elsewhere" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(
        res.status(),
        StatusCode::FORBIDDEN,
        "a change from another origin"
    );
    let res = b
        .post(c.url("/api/v1/tenants"))
        .header("x-csrf-token", &csrf)
        .header("origin", format!("http://127.0.0.1:{port}"))
        .json(&serde_json::json!({ "name": "from-here" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CREATED, "the same origin");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_access_tokens_are_checked_with_the_provider() {
    let idp = start_provider();
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |c| {
        idp.configure(
            c,
            &["groups=ml-team:member@ml"],
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        );
        if let Some(oidc) = c.oidc.as_mut() {
            // Tokens of the CLI's client are for Allot; other applications' are not.
            oidc.audiences.push("allot-cli".into());
            oidc.introspection = Some(allot_api::introspection::Introspection {
                client_id: "allot".into(),
                client_secret: Some("allot-test-secret".into()),
                cache_for: Duration::from_secs(1),
            });
        }
    })
    .await;
    c.create_tenant("ml", None).await;
    let token = access_token(&idp, "allot-cli", "alice").await;
    assert_eq!(
        token.matches('.').count(),
        0,
        "an opaque token, not a JWT: {token}"
    );
    let (s, body) = c
        .request(
            Method::POST,
            "/api/v1/jobs",
            Some(&token),
            Some(json!({ "tenant": "ml", "gpus": 64, "command": ["true"] })),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "alice's groups (from userinfo) make her a member: {body}"
    );
    let (s, me) = c
        .request(Method::GET, "/auth/session", Some(&token), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{me}");
    assert_eq!(me["auth_method"], "oidc-opaque", "{me}");

    // Another application's token, a made-up one and one bent by a byte: refused.
    let other = access_token(&idp, "other-app", "alice").await;
    let mut bent = token.clone();
    bent.pop();
    bent.push(if token.ends_with('A') { 'B' } else { 'A' });
    for (what, t) in [
        ("another application's", other.as_str()),
        ("made up", "opaque-token-guess"),
        ("bent", bent.as_str()),
    ] {
        let (s, body) = c
            .request(Method::GET, "/api/v1/jobs?tenant=ml", Some(t), None)
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert!(!body.to_string().contains(&idp.issuer), "{what}: {body}");
    }
    c.shutdown().await;
}

/// Replicas behind a load balancer: a sign-in started on one replica completes on another
/// (the provider sends the browser back to the address both answer for), and the session
/// works on both, since sign-ins in progress and sessions are kept in the database, not in
/// a replica's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_started_on_one_replica_completes_on_another() {
    let idp = start_provider();
    let mut shared = None;
    let a = spawn_cluster_with(Backend::Sqlite, 0, "", |c| {
        idp.configure(
            c,
            &["groups=ml-team:member@ml"],
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        );
        // Replicas share the secrets key, as they share the database.
        c.secrets_key = allot_store::SecretKeys::generate_line("replicas").expect("key");
        shared = Some(c.clone());
    })
    .await;
    a.create_tenant("ml", None).await;
    // Replica B: the same database, keys and provider, its own address; the provider
    // sends browsers back to A's callback.
    let mut config = shared.expect("A's configuration");
    config.http_listen = "127.0.0.1:0".parse().expect("address");
    config.grpc_listen = "127.0.0.1:0".parse().expect("address");
    let checkpoints = tempfile::tempdir().expect("temp dir");
    config.checkpoint_dir = Some(checkpoints.path().to_owned());
    if let Some(w) = config.web_sign_in.as_mut() {
        w.redirect_url = Some(a.url("/auth/callback"));
    }
    let b_server = allot_server::start(config, Arc::new(allot_domain::SystemClock))
        .await
        .expect("replica B starts");
    let b_url = b_server.http_url();

    let browser = browser();
    let start = Url::parse(&format!("{b_url}/auth/login?return_to=/api/v1/jobs")).expect("url");
    let (status, back_to) = drive(&browser, start, &a.url("/auth/callback"), true, "alice").await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "started on B, completed on A: {back_to}"
    );
    assert_eq!(back_to, "/api/v1/jobs");
    // The session answers on both replicas.
    for base in [a.url(""), b_url.clone()] {
        let res = browser
            .get(format!("{base}/auth/session"))
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), StatusCode::OK, "{base}");
        let me: Value = res.json().await.expect("json");
        assert_eq!(me["auth_method"], "session", "{me}");
    }
    b_server.shutdown().await;
    a.shutdown().await;
}
