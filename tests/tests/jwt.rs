//! Bearer JWTs from an OpenID Connect provider: a test provider on loopback publishes its
//! discovery document and JWKS (and rotates its key); the control plane verifies tokens
//! against them. The attack suite: every forged, stale or misdirected token is refused
//! with 401 and a body that leaks nothing; failures from one address are rate limited.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::{App, HttpResponse, HttpServer, web};
use allot_api::jwt::OidcConfig;
use allot_store::testing::Backend;
use allot_system_tests::{TestCluster, spawn_cluster_with};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const AUDIENCE: &str = "allot-api";

fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/jwt")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn key(name: &str) -> EncodingKey {
    EncodingKey::from_rsa_pem(&fixture(name)).expect("an RSA key")
}

fn jwk(name: &str, kid: &str) -> Value {
    let mut jwk = Jwk::from_encoding_key(&key(name), Algorithm::RS256).expect("jwk");
    jwk.common.key_id = Some(kid.to_owned());
    serde_json::to_value(jwk).expect("json")
}

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs(),
    )
    .expect("fits")
}

/// A provider on loopback: discovery and a JWKS the test can change.
struct Provider {
    issuer: String,
    jwks: Arc<Mutex<Value>>,
    server: actix_web::dev::ServerHandle,
}

impl Provider {
    async fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let issuer = format!("http://{}", listener.local_addr().expect("addr"));
        let jwks = Arc::new(Mutex::new(json!({ "keys": [jwk("idp.pem", "k1")] })));
        let (iss, keys) = (issuer.clone(), jwks.clone());
        let server = HttpServer::new(move || {
            let (iss, keys) = (iss.clone(), keys.clone());
            App::new()
                .route(
                    "/.well-known/openid-configuration",
                    web::get().to(move || {
                        let iss = iss.clone();
                        async move {
                            HttpResponse::Ok().json(json!({
                                "issuer": iss,
                                "jwks_uri": format!("{iss}/jwks"),
                            }))
                        }
                    }),
                )
                .route(
                    "/jwks",
                    web::get().to(move || {
                        let body = keys.lock().expect("jwks").clone();
                        async move { HttpResponse::Ok().json(body) }
                    }),
                )
        })
        .workers(1)
        .listen(listener)
        .expect("listen")
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Provider {
            issuer,
            jwks,
            server: handle,
        }
    }

    fn claims(&self, sub: &str, extra: Value) -> Value {
        let mut c = json!({
            "iss": self.issuer, "aud": AUDIENCE, "sub": sub,
            "iat": now(), "exp": now() + 300,
        });
        if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(extra.clone());
        }
        c
    }

    fn sign(&self, key_file: &str, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &key(key_file)).expect("signed")
    }

    fn token(&self, sub: &str, extra: Value) -> String {
        self.sign("idp.pem", "k1", &self.claims(sub, extra))
    }

    /// A token whose header names no key id, as a provider with one key may send.
    fn token_without_kid(&self, key_file: &str, sub: &str) -> String {
        let claims = self.claims(sub, json!({ "email": "root@example.com" }));
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &key(key_file))
            .expect("signed")
    }

    /// Publishes `keys` (each a key file), none with a key id.
    fn publish_without_kid(&self, keys: &[&str]) {
        let keys: Vec<Value> = keys
            .iter()
            .map(|k| {
                let mut jwk = jwk(k, "x");
                jwk.as_object_mut().expect("object").remove("kid");
                jwk
            })
            .collect();
        *self.jwks.lock().expect("jwks") = json!({ "keys": keys });
    }
}

/// A control plane trusting `provider`, that refetches its keys for an unknown key id at
/// most every `refetch`.
async fn cluster(provider: &Provider, max_failures: u32, refetch: Duration) -> TestCluster {
    let issuer = provider.issuer.clone();
    spawn_cluster_with(Backend::Sqlite, 0, "", move |c| {
        c.oidc = Some(OidcConfig {
            issuer,
            audiences: vec![AUDIENCE.to_owned()],
            algorithms: vec![Algorithm::RS256, Algorithm::ES256],
            leeway: Duration::from_secs(60),
            claim_roles: [
                "groups=ml-team:member@ml",
                "email=root@example.com:platform-admin",
            ]
            .iter()
            .map(|r| r.parse().expect("rule"))
            .collect(),
            jwks_refetch: refetch,
            introspection: None,
        });
        c.auth_max_failures = max_failures;
    })
    .await
}

async fn as_bearer(
    c: &TestCluster,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    c.request(method, path, Some(token), body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_tokens_map_claims_to_roles() {
    let idp = Provider::start().await;
    let c = cluster(&idp, 1000, Duration::ZERO).await;
    c.create_tenant("ml", None).await;
    c.create_tenant("web", None).await;

    let member = idp.token("alice", json!({ "groups": ["ml-team", "other"] }));
    let (s, body) = as_bearer(
        &c,
        &member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({ "tenant": "ml", "gpus": 64, "command": ["true"] })),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let (s, _) = as_bearer(
        &c,
        &member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({ "tenant": "web", "gpus": 1, "command": ["true"] })),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::UNPROCESSABLE_ENTITY,
        "web is invisible to ml members"
    );

    // The submission is on record under the user, signed in through the provider.
    let (_, tenant) = c.get("/api/v1/tenants/ml").await;
    let ml = tenant["id"].as_str().expect("id");
    let (_, page) = c
        .get(&format!("/api/v1/audit/entries?log={ml}&action=job.submit"))
        .await;
    let entry: Value =
        serde_json::from_str(page["entries"][0]["body"].as_str().expect("an entry")).expect("json");
    assert_eq!(entry["actor"]["kind"], "user");
    assert_eq!(entry["actor"]["auth_method"], "oidc-jwt");
    // Under the user the provider's `sub` became at first sign-in.
    let alice = c.user_id("alice").await;
    assert_eq!(entry["actor"]["id"], alice.as_str());
    let (_, user) = c.get(&format!("/api/v1/users/{alice}")).await;
    assert_eq!(user["issuer"], idp.issuer.as_str());

    // Authenticated, but no claim grants anything: every action is refused.
    let nobody = idp.token("bob", json!({ "groups": ["sales"] }));
    let (s, _) = as_bearer(&c, &nobody, Method::GET, "/api/v1/jobs", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // The first platform admin comes from configuration.
    let root = idp.token("root", json!({ "email": "root@example.com" }));
    let (s, body) = as_bearer(
        &c,
        &root,
        Method::POST,
        "/api/v1/tenants",
        Some(json!({ "name": "research" })),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");

    // Roles granted through the API: to a claim, and to one user; revoking one takes
    // effect on the next request.
    let (s, body) = c
        .post(
            "/api/v1/role-bindings",
            json!({ "claim": "groups", "value": "sales", "role": "viewer", "tenant": "web" }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let by_claim = body["id"].as_str().expect("id").to_owned();
    let (s, body) = as_bearer(&c, &nobody, Method::GET, "/api/v1/tenants/web", None).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "the claim binding grants viewer in web: {body}"
    );
    let bob = c.user_id("bob").await;
    let (s, body) = c
        .post(
            "/api/v1/role-bindings",
            json!({ "user": bob, "role": "member", "tenant": "ml" }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let (s, _) = as_bearer(&c, &nobody, Method::GET, "/api/v1/jobs?tenant=ml", None).await;
    assert_eq!(s, StatusCode::OK, "the user binding grants member in ml");
    let (s, _) = c.delete(&format!("/api/v1/role-bindings/{by_claim}")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = as_bearer(&c, &nobody, Method::GET, "/api/v1/tenants/web", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "a revoked binding grants nothing");

    // A deleted user's tokens are refused, however valid; their bindings are revoked.
    let (s, _) = c.delete(&format!("/api/v1/users/{bob}")).await;
    assert_eq!(s, StatusCode::OK);
    let fresh = idp.token("bob", json!({ "groups": ["sales"] }));
    let (s, body) = as_bearer(&c, &fresh, Method::GET, "/api/v1/jobs?tenant=ml", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
    let (_, bindings) = c.get("/api/v1/role-bindings").await;
    assert!(
        bindings
            .as_array()
            .expect("bindings")
            .iter()
            .filter(|b| b["user"] == bob.as_str())
            .all(|b| !b["revoked_at"].is_null()),
        "{bindings}"
    );

    // The provider rotates its key: a token naming the new key id is verified after the
    // control plane fetches the JWKS again.
    *idp.jwks.lock().expect("jwks") = json!({ "keys": [jwk("rotated.pem", "k2")] });
    let rotated = idp.sign(
        "rotated.pem",
        "k2",
        &idp.claims("alice", json!({ "groups": ["ml-team"] })),
    );
    let (s, body) = as_bearer(&c, &rotated, Method::GET, "/api/v1/jobs", None).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    idp.server.stop(true).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stale_and_misdirected_tokens_are_refused() {
    let idp = Provider::start().await;
    let c = cluster(&idp, 1000, allot_api::jwt::DEFAULT_JWKS_REFETCH).await;
    c.create_tenant("ml", None).await;
    let groups = json!({ "groups": ["ml-team"] });
    // A valid token first, so the verifier has the keys and an unknown kid means a refetch.
    let (s, _) = as_bearer(
        &c,
        &idp.token("alice", groups.clone()),
        Method::GET,
        "/api/v1/jobs",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);

    let unsigned = {
        let header = B64URL.encode(r#"{"alg":"none","typ":"JWT","kid":"k1"}"#);
        let claims = B64URL.encode(idp.claims("alice", groups.clone()).to_string());
        format!("{header}.{claims}.")
    };
    let hmac_with_public_key = {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        jsonwebtoken::encode(
            &header,
            &idp.claims("alice", groups.clone()),
            &EncodingKey::from_secret(&fixture("idp.pub.pem")),
        )
        .expect("hmac")
    };
    let mut tampered = idp.token("alice", groups.clone());
    let payload_start = tampered.find('.').expect("dot") + 1;
    tampered.replace_range(
        payload_start..payload_start + 4,
        &B64URL.encode("{\"x")[..4],
    );
    let mut missing_exp = idp.claims("alice", groups.clone());
    missing_exp.as_object_mut().expect("object").remove("exp");
    let claims_with = |k: &str, v: Value| {
        let mut c = idp.claims("alice", groups.clone());
        c[k] = v;
        c
    };
    let cases: Vec<(&str, String)> = vec![
        ("alg none", unsigned),
        ("RS256 -> HS256 with the public key", hmac_with_public_key),
        (
            "signed by a key the provider never published, under its kid",
            idp.sign("attacker.pem", "k1", &idp.claims("alice", groups.clone())),
        ),
        (
            "unknown kid",
            idp.sign("attacker.pem", "evil", &idp.claims("alice", groups.clone())),
        ),
        ("tampered payload", tampered),
        (
            "wrong issuer",
            idp.sign(
                "idp.pem",
                "k1",
                &claims_with("iss", json!("https://evil.example")),
            ),
        ),
        (
            "wrong audience",
            idp.sign(
                "idp.pem",
                "k1",
                &claims_with("aud", json!("another-service")),
            ),
        ),
        (
            "expired",
            idp.sign("idp.pem", "k1", &claims_with("exp", json!(now() - 3600))),
        ),
        (
            "not yet valid",
            idp.sign("idp.pem", "k1", &claims_with("nbf", json!(now() + 3600))),
        ),
        ("no expiry", idp.sign("idp.pem", "k1", &missing_exp)),
        (
            "oversized",
            format!("{}.{}.x", "a".repeat(5000), "b".repeat(5000)),
        ),
        ("malformed", "not.a.jwt".to_owned()),
        ("garbage", "%%%".to_owned()),
    ];
    for (what, token) in cases {
        let (s, body) = as_bearer(&c, &token, Method::GET, "/api/v1/jobs", None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{what}: {body}");
        let text = body.to_string();
        for secret in ["alice", "ml-team", "BEGIN", &idp.issuer] {
            assert!(
                !text.contains(secret),
                "{what}: the refusal leaks `{secret}`: {text}"
            );
        }
        assert_eq!(body["status"], 401, "{what}: a problem body");
    }
    idp.server.stop(true).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_from_one_address_are_rate_limited_and_recorded() {
    let idp = Provider::start().await;
    let c = cluster(&idp, 3, allot_api::jwt::DEFAULT_JWKS_REFETCH).await;
    for _ in 0..3 {
        let (s, _) = as_bearer(&c, "allot_guess", Method::GET, "/api/v1/jobs", None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let res = c
        .http
        .get(c.url("/api/v1/jobs"))
        .bearer_auth("allot_guess")
        .send()
        .await
        .expect("sent");
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "past the limit, a failure is refused outright"
    );
    let retry: u64 = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=60).contains(&retry), "{retry}");
    let (s, _) = as_bearer(&c, &c.admin_token, Method::GET, "/api/v1/jobs", None).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "a valid token is never refused for others' failures"
    );
    idp.server.stop(true).await;

    // What happened is in the system log.
    let actions = c
        .eventually("the refusals are recorded", || async {
            let entries = allot_store::AuditRepo::audit_entries(&c.server.store, "system", 0, 1000)
                .await
                .expect("entries");
            let actions: Vec<String> = entries.into_iter().map(|e| e.action).collect();
            actions
                .iter()
                .any(|a| a == "api.rate_limited")
                .then_some(actions)
        })
        .await;
    assert_eq!(
        actions
            .iter()
            .filter(|a| *a == "api.unauthenticated")
            .count(),
        3,
        "{actions:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_a_key_id_is_accepted_only_from_a_one_key_set() {
    let idp = Provider::start().await;
    idp.publish_without_kid(&["idp.pem"]);
    let c = cluster(&idp, 1000, Duration::ZERO).await;
    let token = idp.token_without_kid("idp.pem", "root");
    let (s, body) = as_bearer(&c, &token, Method::GET, "/api/v1/tenants", None).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "OpenID Connect Core 10.1 allows it: {body}"
    );

    // Signed by a key the provider never published: refused, kid or not.
    let forged = idp.token_without_kid("attacker.pem", "root");
    let (s, _) = as_bearer(&c, &forged, Method::GET, "/api/v1/tenants", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // The provider rotates its only key: tokens of the new key are accepted (the set is
    // fetched again), and the old key's are not.
    let rotated = idp.token_without_kid("rotated.pem", "root");
    idp.publish_without_kid(&["rotated.pem"]);
    let (s, body) = as_bearer(&c, &rotated, Method::GET, "/api/v1/tenants", None).await;
    assert_eq!(s, StatusCode::OK, "after the rotation: {body}");
    let (s, _) = as_bearer(&c, &token, Method::GET, "/api/v1/tenants", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the retired key");

    // With two keys in the set, a token must say which: no guessing.
    idp.publish_without_kid(&["idp.pem", "rotated.pem"]);
    let c2 = cluster(&idp, 1000, Duration::ZERO).await;
    for t in [&token, &rotated] {
        let (s, body) = as_bearer(&c2, t, Method::GET, "/api/v1/tenants", None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("key id"),
            "{body}"
        );
    }
    idp.server.stop(true).await;
    c.shutdown().await;
    c2.shutdown().await;
}
