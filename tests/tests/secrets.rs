//! Secrets: a tenant's secrets reach its jobs (as variables and read-only files) and
//! nothing else — no API answer, audit entry or export, no file of the control plane or
//! the node after the job, no other tenant. Plain `env` values, where people put passwords
//! anyway, are redacted in the audit log (which commits to them) and from readers who could
//! not have set them.

use allot_system_tests::oci::{
    Registry, confined_cluster, push_busybox, require_container_support,
};
use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster, unique};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn sha256(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

async fn set_secret(c: &TestCluster, tenant: &str, name: &str, value: &str) {
    let (s, body) = c
        .put(
            &format!("/api/v1/tenants/{tenant}/secrets/{name}"),
            json!({ "value": value }),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["name"], name);
    assert!(!body.to_string().contains(value), "{body}");
}

/// What the job prints of its secrets: their hashes, and how the file is kept.
const SHOW: &str = "printf %s \"$DB_PASSWORD\" | sha256sum; sha256sum < \"$ALLOT_SECRETS_DIR/tls.key\"; \
    stat -c 'mode=%a' \"$ALLOT_SECRETS_DIR/tls.key\"; \
    echo x > \"$ALLOT_SECRETS_DIR/new\" && echo WRITABLE || echo READ-ONLY";

/// Checks a finished job's log against the secrets it was given. A process job runs as
/// the agent's own user (unconfined, root here), whom no file mode stops: only a
/// container's secrets are checked to be unwritable.
fn assert_delivered(log: &str, password: &str, key: &str, confined: bool) {
    assert!(
        log.contains(&sha256(password)),
        "the variable arrived: {log}"
    );
    assert!(log.contains(&sha256(key)), "the file arrived: {log}");
    assert!(log.contains("mode=400"), "{log}");
    if confined {
        assert!(
            log.contains("READ-ONLY") && !log.contains("WRITABLE"),
            "{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_reach_their_jobs_and_nothing_else() {
    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("team-a", None).await;
    c.create_tenant("team-b", None).await;
    let (password, key, plain) = (unique("db-pass"), unique("tls-key"), unique("plain-env"));
    set_secret(&c, "team-a", "db-password", &password).await;
    set_secret(&c, "team-a", "tls", &key).await;
    let uses = json!([
        { "secret": "db-password", "env": "DB_PASSWORD" },
        { "secret": "tls", "file": "/run/secrets/tls.key" },
    ]);
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "secrets": uses, "env": { "API_KEY": plain } }),
            &["sh", "-c", SHOW],
        )
        .await;
    let job = c.wait_for_end(&id).await;
    let log = c.log_of(&id).await;
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    assert_delivered(&log, &password, &key, false);
    // The node kept the file only while the job ran.
    let dir = c
        .data_dir
        .path()
        .join("node-1/jobs")
        .join(&id)
        .join("secrets");
    assert!(!dir.exists(), "{} is left", dir.display());

    // Another tenant's job cannot name them; its admins cannot list or replace them.
    let (s, body) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "team-b", "gpus": 0, "command": ["true"],
                    "secrets": [{ "secret": "db-password", "env": "X" }] }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["errors"][0]["field"], "secrets[0].secret", "{body}");
    let b_admin = c.token_for("team-b", "tenant-admin").await;
    for (method, path, body) in [
        (Method::GET, "/api/v1/tenants/team-a/secrets", None),
        (
            Method::PUT,
            "/api/v1/tenants/team-a/secrets/db-password",
            Some(json!({ "value": "overwritten" })),
        ),
        (
            Method::DELETE,
            "/api/v1/tenants/team-a/secrets/db-password",
            None,
        ),
    ] {
        let (s, answer) = c.request(method.clone(), path, Some(&b_admin), body).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
    }
    // Members may use them but not read or set them.
    let member = c.token_for("team-a", "member").await;
    let (s, _) = c
        .request(
            Method::GET,
            "/api/v1/tenants/team-a/secrets",
            Some(&member),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Bad uses are refused naming the field.
    for (uses, field) in [
        (json!([{ "secret": "db-password" }]), "secrets[0]"),
        (
            json!([{ "secret": "db-password", "env": "API_KEY" }]),
            "secrets[0].env",
        ),
        (
            json!([{ "secret": "tls", "file": "/etc/passwd" }]),
            "secrets[0].file",
        ),
        (
            json!([{ "secret": "nope", "env": "X" }]),
            "secrets[0].secret",
        ),
    ] {
        let (s, body) = c
            .post(
                "/api/v1/jobs",
                json!({ "tenant": "team-a", "gpus": 0, "command": ["true"],
                        "env": { "API_KEY": "x" }, "secrets": uses }),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["errors"][0]["field"], field, "{body}");
    }

    // A secret an unfinished job uses cannot be removed; once it ends, it can.
    let waiting = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "secrets": [{ "secret": "tls", "env": "TLS" }] }),
            &["sleep", "60"],
        )
        .await;
    let (s, body) = c.delete("/api/v1/tenants/team-a/secrets/tls").await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    let (s, _) = c
        .post(&format!("/api/v1/jobs/{waiting}/cancel"), json!({}))
        .await;
    assert!(s.is_success());
    c.wait_for_state(&waiting, "cancelled").await;
    let (s, body) = c.delete("/api/v1/tenants/team-a/secrets/tls").await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{body}");

    // The plain variable: its value is shown to those who could have set it, redacted to
    // a viewer, and the audit log keeps a commitment to it instead.
    let viewer = c.token_for("team-a", "viewer").await;
    let path = format!("/api/v1/jobs/{id}");
    let (_, as_member) = c.request(Method::GET, &path, Some(&member), None).await;
    assert_eq!(as_member["env"]["API_KEY"], plain.as_str());
    let (_, as_viewer) = c.request(Method::GET, &path, Some(&viewer), None).await;
    assert_eq!(as_viewer["env"]["API_KEY"], "<redacted>", "{as_viewer}");
    let (_, listed) = c
        .request(Method::GET, "/api/v1/jobs", Some(&viewer), None)
        .await;
    assert!(!listed.to_string().contains(&plain), "{listed}");
    let (_, tenant) = c.get("/api/v1/tenants/team-a").await;
    let log_id = tenant["id"].as_str().expect("id").to_owned();
    let submit = c
        .audit_log(&log_id)
        .await
        .into_iter()
        .find(|e| e.action == "job.submit" && e.target == format!("job/{id}"))
        .expect("the submit is audited");
    let after = submit.after.expect("the spec");
    assert_eq!(after["env"]["API_KEY"], "<redacted>");
    assert_eq!(
        after["env_sha256"]["API_KEY"],
        allot_domain::secret::env_commitment(&id, "API_KEY", &plain).as_str(),
        "an auditor shown the value can check it"
    );
    assert_eq!(after["secrets"][0]["secret"], "db-password");

    // Nothing shows a secret: every API answer and audit read, and every file of the
    // control plane and the node (the job's own output holds only hashes); nor does the
    // audit log show the plain variable.
    let mut answers: Vec<(bool, Value)> = Vec::new();
    for (audit, p) in [
        (false, path.clone()),
        (false, "/api/v1/jobs".into()),
        (false, "/api/v1/tenants/team-a/secrets".into()),
        (
            true,
            format!("/api/v1/audit/logs/{log_id}/entries?limit=1000"),
        ),
        (true, "/api/v1/audit/logs/system/entries?limit=1000".into()),
    ] {
        answers.push((audit, c.get(&p).await.1));
    }
    let export = c
        .http
        .get(c.url(&format!("/api/v1/audit/logs/{log_id}/export")))
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("export")
        .bytes()
        .await
        .expect("bytes");
    for (secret, anywhere) in [(&password, true), (&key, true), (&plain, false)] {
        for (audit, a) in &answers {
            if anywhere || *audit {
                assert!(!a.to_string().contains(secret.as_str()), "{a}");
            }
        }
        assert!(!export.windows(secret.len()).any(|w| w == secret.as_bytes()));
    }
    for secret in [&password, &key] {
        let found = c.files_containing(secret.as_bytes());
        assert!(found.is_empty(), "`{secret}` is written in {found:?}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_container_gets_its_secrets_read_only_and_the_node_keeps_none() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    push_busybox(&registry, "team-a/busybox:1").await;
    let c = confined_cluster(&registry, 1, "1xH200", 64).await;
    c.create_tenant("team-a", None).await;
    let (password, key) = (unique("db-pass"), unique("tls-key"));
    set_secret(&c, "team-a", "db-password", &password).await;
    set_secret(&c, "team-a", "tls", &key).await;
    let id = c
        .submit_with(
            "team-a",
            json!({
                "gpus": 0,
                "image": format!("{}/team-a/busybox:1", registry.addr),
                "secrets": [
                    { "secret": "db-password", "env": "DB_PASSWORD" },
                    { "secret": "tls", "file": "/run/secrets/tls.key" },
                ],
            }),
            &["sh", "-c", &format!("{SHOW}; echo dir=$ALLOT_SECRETS_DIR")],
        )
        .await;
    let job = c.wait_for_end(&id).await;
    let log = c.log_of(&id).await;
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    assert_delivered(&log, &password, &key, true);
    assert!(log.contains("dir=/run/secrets"), "{log}");
    for secret in [&password, &key] {
        let found = c.files_containing(secret.as_bytes());
        assert!(found.is_empty(), "`{secret}` is left in {found:?}");
    }
    c.shutdown().await;
}
