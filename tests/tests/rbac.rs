//! The authorization matrix: every route the API serves × every role × a resource of the
//! caller's own tenant, of a child tenant, and of an unrelated tenant, against the decision
//! the policies are meant to make. The routes come from the API's own route table, so a new
//! route without an entry here fails the test.

use std::collections::BTreeMap;

use allot_store::testing::Backend;
use allot_store::{
    Admission, IdentityRepo, NewNodeCertificate, NodeRegistration, NodeRepo, SignIn,
};
use std::time::Duration;

use allot_system_tests::{TestCluster, spawn_cluster_with};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rel {
    Own,
    Child,
    Other,
}

const RELS: [Rel; 3] = [Rel::Own, Rel::Child, Rel::Other];
const ROLES: [&str; 5] = [
    "platform-admin",
    "auditor",
    "tenant-admin",
    "member",
    "viewer",
];

impl Rel {
    fn tenant(self) -> &'static str {
        match self {
            Rel::Own => "own",
            Rel::Child => "own-ml",
            Rel::Other => "other",
        }
    }

    fn letter(self) -> char {
        match self {
            Rel::Own => 'O',
            Rel::Child => 'C',
            Rel::Other => 'X',
        }
    }
}

/// Who may call each route, per role: the relations (O)wn, (C)hild and other (X) tenant
/// whose resources the role reaches, `-` for none. Tenant roles are bound at `own`. Routes
/// that name no tenant are the same for every relation. `public` routes need no token;
/// `open` ones (the sign-in flow) need none either and are refused on their own terms.
const EXPECTED: &[(&str, &str)] = &[
    ("GET /healthz", "public"),
    ("GET /readyz", "public"),
    ("GET /api/v1/openapi.json", "public"),
    ("GET /auth/login", "open"),
    ("GET /auth/callback", "open"),
    ("GET /auth/session", "OCX OCX OCX OCX OCX"),
    ("POST /auth/logout", "OCX OCX OCX OCX OCX"),
    ("GET /auth/dev", "open"),
    ("POST /auth/dev", "open"),
    ("GET /api/v1/audit/key", "OCX OCX OCX OCX OCX"),
    ("GET /api/v1/audit/logs", "OCX OCX OCX - -"),
    ("GET /api/v1/audit/entries", "OCX OCX OC - -"),
    ("GET /api/v1/audit/holds", "OCX OCX - - -"),
    ("GET /api/v1/audit/evidence", "OCX OCX - - -"),
    ("PUT /api/v1/audit/logs/{log}/hold", "OCX - - - -"),
    ("DELETE /api/v1/audit/logs/{log}/hold", "OCX - - - -"),
    ("POST /api/v1/audit/logs/{log}/prune", "OCX - - - -"),
    ("GET /api/v1/audit/logs/{log}/entries", "OCX OCX OC - -"),
    ("GET /api/v1/audit/logs/{log}/checkpoint", "OCX OCX OC - -"),
    ("GET /api/v1/audit/logs/{log}/export", "OCX OCX OC - -"),
    (
        "GET /api/v1/audit/logs/{log}/proof/inclusion",
        "OCX OCX OC - -",
    ),
    (
        "GET /api/v1/audit/logs/{log}/proof/consistency",
        "OCX OCX OC - -",
    ),
    ("GET /api/v1/tenants", "OCX - OCX OCX OCX"),
    ("POST /api/v1/tenants", "OCX - - - -"),
    ("GET /api/v1/tenants/{name}", "OCX - OC OC OC"),
    ("DELETE /api/v1/tenants/{name}", "OCX - - - -"),
    ("GET /api/v1/tenants/{name}/quota", "OCX - OC OC OC"),
    ("PUT /api/v1/tenants/{name}/quota", "OCX - - - -"),
    ("PATCH /api/v1/tenants/{name}/quota", "OCX - - - -"),
    ("GET /api/v1/tenants/{name}/policy", "OCX - OC OC OC"),
    ("PUT /api/v1/tenants/{name}/policy", "OCX - - - -"),
    ("GET /api/v1/tenants/{name}/job-limits", "OCX - OC OC OC"),
    ("PUT /api/v1/tenants/{name}/job-limits", "OCX - - - -"),
    ("PATCH /api/v1/tenants/{name}/job-limits", "OCX - - - -"),
    (
        "GET /api/v1/tenants/{name}/registry-credentials",
        "OCX - OC - -",
    ),
    (
        "PUT /api/v1/tenants/{name}/registry-credentials/{registry}",
        "OCX - OC - -",
    ),
    (
        "DELETE /api/v1/tenants/{name}/registry-credentials/{registry}",
        "OCX - OC - -",
    ),
    ("GET /api/v1/tenants/{name}/secrets", "OCX - OC - -"),
    (
        "PUT /api/v1/tenants/{name}/secrets/{secret}",
        "OCX - OC - -",
    ),
    (
        "DELETE /api/v1/tenants/{name}/secrets/{secret}",
        "OCX - OC - -",
    ),
    // Everyone signed in lists the volumes their tenants may mount (none, for auditors).
    ("GET /api/v1/volumes", "OCX OCX OCX OCX OCX"),
    ("PUT /api/v1/volumes/{name}", "OCX - - - -"),
    ("DELETE /api/v1/volumes/{name}", "OCX - - - -"),
    ("GET /api/v1/jobs", "OCX - OC OC OC"),
    ("POST /api/v1/jobs", "OCX - OC OC -"),
    ("GET /api/v1/jobs/{id}", "OCX - OC OC OC"),
    ("POST /api/v1/jobs/{id}/cancel", "OCX - OC OC -"),
    ("POST /api/v1/jobs/{id}/resize", "OCX - OC OC -"),
    ("GET /api/v1/jobs/{id}/log", "OCX - OC OC OC"),
    ("GET /api/v1/jobs/{id}/samples", "OCX - OC OC OC"),
    ("GET /api/v1/usage", "OCX - OC OC OC"),
    ("GET /api/v1/nodes", "OCX - OCX OCX OCX"),
    ("GET /api/v1/nodes/{id}", "OCX - OCX OCX OCX"),
    ("GET /api/v1/nodes/{id}/gpus/{uuid}/samples", "OCX - - - -"),
    ("PATCH /api/v1/nodes/{id}/labels", "OCX - - - -"),
    ("POST /api/v1/nodes/{id}/cordon", "OCX - - - -"),
    ("POST /api/v1/nodes/{id}/uncordon", "OCX - - - -"),
    ("POST /api/v1/nodes/{id}/drain", "OCX - - - -"),
    ("POST /api/v1/nodes/{id}/gpus/{uuid}/drain", "OCX - - - -"),
    ("POST /api/v1/nodes/{id}/gpus/{uuid}/return", "OCX - - - -"),
    ("POST /api/v1/nodes/{id}/revoke", "OCX - - - -"),
    ("GET /api/v1/bootstrap-tokens", "OCX - - - -"),
    ("POST /api/v1/bootstrap-tokens", "OCX - - - -"),
    ("DELETE /api/v1/bootstrap-tokens/{id}", "OCX - - - -"),
    ("GET /api/v1/tokens", "OCX - OCX - -"),
    ("POST /api/v1/tokens", "OCX - OC - -"),
    ("GET /api/v1/tokens/{id}", "OCX - OC - -"),
    ("DELETE /api/v1/tokens/{id}", "OCX - OC - -"),
    ("GET /api/v1/users", "OCX - - - -"),
    ("GET /api/v1/users/{id}", "OCX - - - -"),
    ("DELETE /api/v1/users/{id}", "OCX - - - -"),
    ("GET /api/v1/role-bindings", "OCX - OCX - -"),
    ("POST /api/v1/role-bindings", "OCX - OC - -"),
    ("GET /api/v1/role-bindings/{id}", "OCX - OC - -"),
    ("DELETE /api/v1/role-bindings/{id}", "OCX - OC - -"),
];

struct Fixture {
    c: TestCluster,
    tokens: BTreeMap<&'static str, String>,
    tenant_ids: BTreeMap<Rel, String>,
    node_id: String,
    gpu_uuid: String,
    made: u32,
}

impl Fixture {
    async fn new() -> Self {
        let c = spawn_cluster_with(Backend::Sqlite, 1, "1xH100", |config| {
            config.checkpoint_interval = Duration::from_millis(100);
        })
        .await;
        // A GPU-hour budget of 0 keeps the fixture's jobs pending (see `job`).
        for (name, parent) in [("own", None), ("own-ml", Some("own")), ("other", None)] {
            let quota = parent.map_or(json!({ "gpu_hour_budget": 0 }), |_| json!({}));
            let (s, body) = c
                .post(
                    "/api/v1/tenants",
                    json!({ "name": name, "parent": parent, "quota": quota }),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{body}");
        }
        let mut tenant_ids = BTreeMap::new();
        for rel in RELS {
            let (_, t) = c.get(&format!("/api/v1/tenants/{}", rel.tenant())).await;
            tenant_ids.insert(rel, t["id"].as_str().expect("tenant id").to_owned());
        }
        let mut tokens = BTreeMap::new();
        for role in ROLES {
            let tenant = (!matches!(role, "platform-admin" | "auditor")).then_some("own");
            let (s, body) = c
                .post(
                    "/api/v1/tokens",
                    json!({ "name": role, "role": role, "tenant": tenant }),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{body}");
            tokens.insert(role, body["secret"].as_str().expect("secret").to_owned());
        }
        // Every tenant's log has an entry (a token made there) and a signed checkpoint.
        for rel in RELS {
            let (s, body) = c
                .post(
                    "/api/v1/tokens",
                    json!({ "name": "seed", "role": "viewer", "tenant": rel.tenant() }),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{body}");
        }
        for id in tenant_ids.values() {
            c.eventually("a checkpoint of every tenant log", || async {
                let (s, _) = c.get(&format!("/api/v1/audit/logs/{id}/checkpoint")).await;
                s.is_success().then_some(())
            })
            .await;
        }
        let (_, nodes) = c.get("/api/v1/nodes").await;
        let node = &nodes[0];
        Fixture {
            node_id: node["id"].as_str().expect("node id").to_owned(),
            gpu_uuid: node["gpus"][0]["uuid"].as_str().expect("uuid").to_owned(),
            c,
            tokens,
            tenant_ids,
            made: 0,
        }
    }

    /// A fresh job of `rel`'s tenant that stays pending: its tenant (or the one above it)
    /// has a GPU-hour budget of 0 this month.
    async fn job(&self, rel: Rel) -> String {
        self.c.submit(rel.tenant(), 1, &["true"]).await
    }

    /// A fresh viewer token of `rel`'s tenant.
    async fn token(&mut self, rel: Rel) -> String {
        self.made += 1;
        let (s, body) = self
            .c
            .post(
                "/api/v1/tokens",
                json!({ "name": format!("t{}", self.made), "role": "viewer", "tenant": rel.tenant() }),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        body["token"]["id"].as_str().expect("id").to_owned()
    }

    /// A fresh user, as if they had signed in through the identity provider.
    async fn user(&mut self) -> String {
        self.made += 1;
        let user = self
            .c
            .server
            .store
            .sign_in(SignIn {
                issuer: "https://idp.example".into(),
                subject: format!("person-{}", self.made),
                email: None,
                name: None,
            })
            .await
            .expect("user");
        user.id
    }

    /// A fresh claim binding in `rel`'s tenant.
    async fn binding(&mut self, rel: Rel) -> String {
        self.made += 1;
        let (s, body) = self
            .c
            .post(
                "/api/v1/role-bindings",
                json!({ "claim": "groups", "value": format!("g{}", self.made),
                        "role": "viewer", "tenant": rel.tenant() }),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        body["id"].as_str().expect("id").to_owned()
    }

    /// A fresh bootstrap token.
    async fn bootstrap_token(&self) -> String {
        allot_api::issue_bootstrap_token(
            &self.c.server.store,
            &allot_domain::AuditContext::system("matrix"),
            "matrix",
            allot_api::TokenFor {
                node_name: "*",
                replace: false,
            },
            Duration::from_secs(600),
        )
        .await
        .expect("bootstrap token")
        .1
        .id
    }

    /// A fresh node without an agent (revoking the cluster's own would stop its agent).
    async fn spare_node(&mut self) -> String {
        self.made += 1;
        let (secret, _) = allot_api::issue_bootstrap_token(
            &self.c.server.store,
            &allot_domain::AuditContext::system("matrix"),
            "matrix",
            allot_api::TokenFor {
                node_name: "spare-*",
                replace: false,
            },
            Duration::from_secs(600),
        )
        .await
        .expect("bootstrap token");
        let now = chrono::Utc::now();
        let node = self
            .c
            .server
            .store
            .register_node(
                &allot_domain::AuditContext::system("matrix"),
                NodeRegistration {
                    name: format!("spare-{}", self.made),
                    admission: Admission::BootstrapToken {
                        secret_hash: allot_api::secret::hash(&secret),
                        key: format!("spare-key-{}", self.made),
                    },
                    certificate: NewNodeCertificate {
                        serial: format!("{:032x}", self.made),
                        issued_at: now,
                        expires_at: now + chrono::Duration::hours(1),
                    },
                    agent_version: "none".into(),
                    gpu_backend: "simulated".into(),
                    runtime: "process".into(),
                    cpu_milli: 0,
                    memory_bytes: 0,
                    gpus: vec![],
                    lease_expires_at: now,
                    address: String::new(),
                },
            )
            .await
            .expect("spare node");
        node.id
    }

    /// The request for `route` against `rel`'s resources: path, and body when it takes one.
    async fn request(&mut self, route: &str, rel: Rel) -> (String, Option<Value>) {
        let (_, path) = route.split_once(' ').expect("METHOD PATH");
        let tenant = rel.tenant();
        let log = self.tenant_ids[&rel].clone();
        let mut p = path
            .replace("{name}", tenant)
            .replace("{log}", &log)
            .replace("{uuid}", &self.gpu_uuid)
            .replace("{registry}", "registry.example.com")
            .replace("{secret}", "matrix");
        if p.contains("{id}") {
            let id = if p.starts_with("/api/v1/jobs/") {
                self.job(rel).await
            } else if p.starts_with("/api/v1/tokens/") {
                self.token(rel).await
            } else if p.starts_with("/api/v1/users/") {
                self.user().await
            } else if p.starts_with("/api/v1/role-bindings/") {
                self.binding(rel).await
            } else if p.starts_with("/api/v1/bootstrap-tokens/") {
                self.bootstrap_token().await
            } else if p.ends_with("/revoke") {
                self.spare_node().await
            } else {
                self.node_id.clone()
            };
            p = p.replace("{id}", &id);
        }
        if route == "DELETE /api/v1/audit/logs/{log}/hold" {
            // Something to release: a hold placed by the platform admin (409 if present).
            let (s, body) = self
                .c
                .request(
                    Method::PUT,
                    &format!("/api/v1/audit/logs/{log}/hold"),
                    Some(&self.c.admin_token),
                    Some(json!({ "reason": "matrix" })),
                )
                .await;
            assert!(s.is_success() || s == StatusCode::CONFLICT, "{s}: {body}");
        }
        if route == "DELETE /api/v1/tenants/{name}" {
            // A job that has not ended keeps the tenant: one allowed to delete it is told
            // so (409), and the fixture keeps its tenants.
            self.job(rel).await;
        }
        // Something to delete, put there by the platform admin.
        let precondition = match route {
            "DELETE /api/v1/tenants/{name}/registry-credentials/{registry}" => Some((
                p.clone(),
                json!({ "username": "matrix", "password": "matrix-secret" }),
            )),
            "DELETE /api/v1/tenants/{name}/secrets/{secret}" => {
                Some((p.clone(), json!({ "value": "matrix-secret" })))
            }
            "DELETE /api/v1/volumes/{name}" => Some((
                p.clone(),
                json!({ "host_path": "/mnt/matrix", "tenants": [] }),
            )),
            _ => None,
        };
        if let Some((path, body)) = precondition {
            let (s, answer) = self
                .c
                .request(Method::PUT, &path, Some(&self.c.admin_token), Some(body))
                .await;
            assert!(s.is_success(), "{s}: {answer}");
        }
        self.made += 1;
        let n = self.made;
        let (query, body) = match route {
            "GET /api/v1/audit/entries" => (format!("?log={log}"), None),
            "GET /api/v1/jobs" => (format!("?tenant={tenant}"), None),
            "GET /api/v1/usage" => (format!("?tenant={tenant}"), None),
            "GET /api/v1/audit/logs/{log}/proof/inclusion" => ("?seq=0".to_owned(), None),
            "GET /api/v1/audit/logs/{log}/proof/consistency" => ("?from=1".to_owned(), None),
            "PUT /api/v1/audit/logs/{log}/hold" => {
                (String::new(), Some(json!({ "reason": "matrix" })))
            }
            "POST /api/v1/audit/logs/{log}/prune" => (
                String::new(),
                Some(json!({ "before": "2020-01-01T00:00:00Z" })),
            ),
            "POST /api/v1/tenants" => (String::new(), Some(json!({ "name": format!("new-{n}") }))),
            "POST /api/v1/bootstrap-tokens" => {
                (String::new(), Some(json!({ "node_name": format!("n{n}") })))
            }
            "POST /api/v1/jobs/{id}/resize" => (String::new(), Some(json!({ "gpu_milli": 500 }))),
            // Keeps the budget of 0 that holds the fixture's jobs pending.
            "PUT /api/v1/tenants/{name}/quota" => {
                (String::new(), Some(json!({ "gpu_hour_budget": 0 })))
            }
            "PATCH /api/v1/tenants/{name}/quota" => (String::new(), Some(json!({ "weight": 2 }))),
            "PATCH /api/v1/nodes/{id}/labels" => (
                String::new(),
                Some(json!({ "labels": { "rack": "matrix" } })),
            ),
            "PUT /api/v1/tenants/{name}/policy" => (String::new(), Some(json!({}))),
            "PUT /api/v1/tenants/{name}/job-limits" => (String::new(), Some(json!({}))),
            "PATCH /api/v1/tenants/{name}/job-limits" => {
                (String::new(), Some(json!({ "default_cpu_milli": 500 })))
            }
            "PUT /api/v1/tenants/{name}/registry-credentials/{registry}" => (
                String::new(),
                Some(json!({ "username": "matrix", "password": "matrix-secret" })),
            ),
            "PUT /api/v1/tenants/{name}/secrets/{secret}" => {
                (String::new(), Some(json!({ "value": "matrix-secret" })))
            }
            "PUT /api/v1/volumes/{name}" => (
                String::new(),
                Some(json!({ "host_path": "/mnt/matrix", "tenants": [tenant] })),
            ),
            "POST /api/v1/jobs" => (
                String::new(),
                Some(json!({ "tenant": tenant, "gpus": 1, "command": ["true"] })),
            ),
            "POST /api/v1/role-bindings" => (
                String::new(),
                Some(
                    json!({ "claim": "groups", "value": format!("m{n}"), "role": "member",
                             "tenant": tenant }),
                ),
            ),
            "POST /api/v1/tokens" => (
                String::new(),
                Some(json!({ "name": format!("m{n}"), "role": "viewer", "tenant": tenant })),
            ),
            _ => (String::new(), None),
        };
        (format!("{p}{query}"), body)
    }
}

fn method_of(route: &str) -> Method {
    let (m, _) = route.split_once(' ').expect("METHOD PATH");
    Method::from_bytes(m.as_bytes()).expect("method")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_every_role_every_tenant_relation() {
    let expected: BTreeMap<&str, &str> = EXPECTED.iter().copied().collect();
    let routes: Vec<String> = allot_api::route_table()
        .into_iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let missing: Vec<&String> = routes
        .iter()
        .filter(|r| !expected.contains_key(r.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "routes without an entry in the authorization matrix: {missing:?}"
    );
    let stale: Vec<&&str> = expected
        .keys()
        .filter(|k| !routes.iter().any(|r| r == *k))
        .collect();
    assert!(stale.is_empty(), "matrix entries for no route: {stale:?}");

    let mut f = Fixture::new().await;
    let mut failures = Vec::new();
    let mut cells = 0;
    for route in &routes {
        let rule = expected[route.as_str()];
        let method = method_of(route);
        if rule == "public" {
            let (path, _) = f.request(route, Rel::Own).await;
            let (s, _) = f.c.request(method, &path, None, None).await;
            assert!(s.is_success(), "{route} is public, got {s}");
            continue;
        }
        if rule == "open" {
            let (path, _) = f.request(route, Rel::Own).await;
            let (s, _) = f.c.request(method, &path, None, None).await;
            assert!(
                s != StatusCode::FORBIDDEN && !s.is_server_error(),
                "{route} needs no credentials, got {s}"
            );
            continue;
        }
        // Without a token: 401, always.
        let (path, body) = f.request(route, Rel::Own).await;
        let (s, _) = f.c.request(method.clone(), &path, None, body).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{route} without a token");

        let per_role: Vec<&str> = rule.split(' ').collect();
        assert_eq!(per_role.len(), ROLES.len(), "{route}: one entry per role");
        for (role, reach) in ROLES.iter().zip(per_role) {
            for rel in RELS {
                cells += 1;
                let allowed = reach.contains(rel.letter());
                let (path, body) = f.request(route, rel).await;
                let token = f.tokens[role].clone();
                let (s, problem) = f.c.request(method.clone(), &path, Some(&token), body).await;
                // Naming a tenant the caller cannot see in a body is the same field error
                // as naming one that does not exist.
                let unknown_tenant = s == StatusCode::UNPROCESSABLE_ENTITY
                    && problem["errors"][0]["field"] == "tenant"
                    && problem["errors"][0]["reason"]
                        .as_str()
                        .is_some_and(|r| r.starts_with("no tenant named"));
                let refused = unknown_tenant
                    || matches!(
                        s,
                        StatusCode::FORBIDDEN | StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED
                    );
                if allowed == refused {
                    failures.push(format!(
                        "{route} as {role} on {:?}: expected {}, got {s} {problem}",
                        rel,
                        if allowed { "allowed" } else { "refused" },
                    ));
                }
                if refused {
                    // A refusal says why without echoing other tenants' data.
                    assert_eq!(problem["status"], s.as_u16(), "{route}: a problem body");
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cells} cells wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    f.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_show_own_and_child_tenants_never_others() {
    let f = Fixture::new().await;
    for rel in RELS {
        f.job(rel).await;
    }
    let names = |v: &Value, key: &str| -> Vec<String> {
        let items = v.get("items").unwrap_or(v);
        let mut out: Vec<String> = items
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|i| i[key].as_str().map(str::to_owned))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    };
    for role in ["tenant-admin", "member", "viewer"] {
        let token = f.tokens[role].clone();
        let (s, tenants) =
            f.c.request(Method::GET, "/api/v1/tenants", Some(&token), None)
                .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(names(&tenants, "name"), ["own", "own-ml"], "{role}");
        let (s, jobs) =
            f.c.request(Method::GET, "/api/v1/jobs", Some(&token), None)
                .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(names(&jobs, "tenant"), ["own", "own-ml"], "{role}");
    }
    let admin = f.tokens["tenant-admin"].clone();
    let (_, tokens) =
        f.c.request(Method::GET, "/api/v1/tokens", Some(&admin), None)
            .await;
    assert_eq!(names(&tokens, "tenant"), ["own", "own-ml"]);
    let (_, logs) =
        f.c.request(Method::GET, "/api/v1/audit/logs", Some(&admin), None)
            .await;
    assert_eq!(names(&logs, "tenant"), ["own", "own-ml"]);
    f.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_platform_admin_lists_an_empty_platform() {
    let c = allot_system_tests::spawn_cluster(Backend::Sqlite, 0, "").await;
    for path in [
        "/api/v1/tenants",
        "/api/v1/jobs",
        "/api/v1/tokens",
        "/api/v1/role-bindings",
    ] {
        let (s, body) = c.get(path).await;
        assert_eq!(s, StatusCode::OK, "{path}: {body}");
    }
    c.shutdown().await;
}
