//! Jobs run OCI images pulled from a real registry (Debian's `docker-registry`, the CNCF
//! distribution registry) on loopback, by real agents running `runc`: a tag is pinned to
//! its digest, a node's second pull is served from its own cache, a layer that does not
//! match its digest fails the job naming it, crafted layers write nothing outside the
//! image's root, and the tenant's policy decides which registries it may use.

use std::time::Duration;

use allot_system_tests::oci::{
    Registry, add_file, add_link, busybox_layer, confined_cluster, layer, push_busybox,
    require_container_support,
};
use allot_system_tests::{StatusCode, TestCluster};
use serde_json::{Value, json};

/// Node ids by name.
async fn node_id(c: &TestCluster, name: &str) -> String {
    let (_, nodes) = c.get("/api/v1/nodes").await;
    nodes
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == name)
        .and_then(|n| n["id"].as_str())
        .expect("node")
        .to_owned()
}

async fn cordon(c: &TestCluster, node: &str, on: bool) {
    let id = node_id(c, node).await;
    let verb = if on { "cordon" } else { "uncordon" };
    let (status, body) = c
        .post(&format!("/api/v1/nodes/{id}/{verb}"), json!({}))
        .await;
    assert!(status.is_success(), "{verb}: {body}");
}

/// Runs `image` to the end on `node` (the other is cordoned meanwhile).
async fn run_on(c: &TestCluster, node: &str, other: &str, image: &str, cmd: &[&str]) -> Value {
    cordon(c, other, true).await;
    cordon(c, node, false).await;
    // A scheduling pass that read the nodes before the cordon may still be under way.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let id = c
        .submit_with("team-a", json!({ "gpus": 0, "image": image }), cmd)
        .await;
    let job = c.wait_for_end(&id).await;
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert_eq!(
        job["node_id"].as_str(),
        Some(node_id(c, node).await.as_str()),
        "placed on {node}: {job:#}\n{nodes:#}"
    );
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn images_are_pinned_cached_and_checked() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    let digest = push_busybox(&registry, "team-a/busybox:v1").await;
    let c = confined_cluster(&registry, 2, "1xH200", 4096).await;
    c.create_tenant("team-a", None).await;
    let image = format!("{}/team-a/busybox:v1", registry.addr);

    // By tag: the job's record shows the digest it ran, and the audit trail has it.
    let first = run_on(
        &c,
        "node-1",
        "node-2",
        &image,
        &["echo", "hello from the image"],
    )
    .await;
    assert_eq!(first["state"], "succeeded", "{first:#}");
    assert_eq!(first["image"], image.as_str());
    assert_eq!(first["image_digest"], digest.as_str(), "{first:#}");
    assert_eq!(
        c.log_of(first["id"].as_str().expect("id")).await,
        "hello from the image\n"
    );

    // A second node pulls it once; its second job is served from its own cache.
    let before = registry.blob_fetches();
    let second = run_on(&c, "node-2", "node-1", &image, &["true"]).await;
    assert_eq!(second["state"], "succeeded", "{second:#}");
    let after_first_pull = registry.blob_fetches();
    assert!(
        after_first_pull > before,
        "node-2 fetched the image's blobs ({before} → {after_first_pull})"
    );
    let third = run_on(&c, "node-2", "node-1", &image, &["true"]).await;
    assert_eq!(third["state"], "succeeded", "{third:#}");
    assert_eq!(
        registry.blob_fetches(),
        after_first_pull,
        "node-2's second job was served from its cache, without a blob fetch"
    );

    // A tag moved to another image after a job was pinned changes nothing for it: its
    // next attempt, on another node, runs the digest it was pinned to.
    cordon(&c, "node-2", true).await;
    cordon(&c, "node-1", false).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let pinned = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image }),
            &[
                "sh",
                "-c",
                "test -e /moved && echo NEW || echo OLD; sleep 60",
            ],
        )
        .await;
    let running = c.wait_for_state(&pinned, "running").await;
    assert_eq!(running["image_digest"], digest.as_str());
    let moved = registry
        .push(
            "team-a/busybox:v1",
            &[
                busybox_layer(),
                layer(|b| add_file(b, "moved", b"1", 0o644)),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    assert_ne!(moved, digest);
    cordon(&c, "node-2", false).await;
    let node1 = node_id(&c, "node-1").await;
    let (status, body) = c
        .post(&format!("/api/v1/nodes/{node1}/drain"), json!({}))
        .await;
    assert!(status.is_success(), "drain: {body}");
    let again = c
        .eventually("attempt 2 runs on node-2", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{pinned}")).await;
            (j["attempt"] == 2 && j["state"] == "running").then_some(j)
        })
        .await;
    assert_eq!(again["image_digest"], digest.as_str(), "{again:#}");
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{pinned}/cancel"), json!({}))
        .await;
    assert!(status.is_success());
    c.wait_for_end(&pinned).await;
    assert_eq!(
        c.log_of(&pinned).await,
        "OLD\n",
        "attempt 2 ran the pinned image"
    );
    cordon(&c, "node-1", false).await;

    // A missing tag fails the job, saying so.
    let missing = run_on(
        &c,
        "node-1",
        "node-2",
        &format!("{}/team-a/busybox:nope", registry.addr),
        &["true"],
    )
    .await;
    assert_eq!(missing["state"], "failed");
    let message = missing["message"].as_str().unwrap_or_default();
    assert!(message.contains("not found"), "{message}");

    // A layer whose content does not match its digest fails the job, naming the layer.
    let tampered_layer = layer(|b| add_file(b, "data.txt", b"original", 0o644));
    registry
        .push(
            "team-a/tampered:1",
            &[busybox_layer(), tampered_layer.clone()],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    let manifest: Value = c
        .http
        .get(format!(
            "http://{}/v2/team-a/tampered/manifests/1",
            registry.addr
        ))
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .expect("manifest")
        .json()
        .await
        .expect("json");
    let layer_digest = manifest["layers"][1]["digest"]
        .as_str()
        .expect("digest")
        .to_owned();
    let blob = registry.blob_file(&layer_digest);
    let mut bytes = std::fs::read(&blob).expect("blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).expect("tamper");
    let bad = run_on(
        &c,
        "node-1",
        "node-2",
        &format!("{}/team-a/tampered:1", registry.addr),
        &["true"],
    )
    .await;
    assert_eq!(bad["state"], "failed");
    let message = bad["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&layer_digest) && message.contains("does not match"),
        "{message}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crafted_layers_write_nothing_outside_the_root() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    let outside = tempfile::tempdir().expect("temp dir");
    let target = outside.path().display().to_string();
    std::fs::write(outside.path().join("keep"), "original").expect("write");
    // Links pointing out, and files written through them.
    registry
        .push(
            "team-a/links:1",
            &[
                busybox_layer(),
                layer(|b| {
                    add_link(b, tar::EntryType::Symlink, "abs", &target);
                    add_link(b, tar::EntryType::Symlink, "rel", "../../../../../../../..");
                    add_file(b, "abs/keep", b"pwned", 0o644);
                    add_file(b, &format!("rel{target}/new"), b"pwned", 0o644);
                }),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    registry
        .push(
            "team-a/dotdot:1",
            &[
                busybox_layer(),
                layer(|b| {
                    add_file(
                        b,
                        "../../../../../../../../tmp/allot-dotdot",
                        b"pwned",
                        0o644,
                    )
                }),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    let hard_target = format!("{target}/keep");
    registry
        .push(
            "team-a/hardlink:1",
            &[
                busybox_layer(),
                layer(|b| add_link(b, tar::EntryType::Link, "stolen", &hard_target)),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    let c = confined_cluster(&registry, 1, "1xH200", 4096).await;
    c.create_tenant("team-a", None).await;
    let submit = |repo: &str| {
        let image = format!("{}/team-a/{repo}:1", registry.addr);
        let c = &c;
        async move {
            let id = c
                .submit_with(
                    "team-a",
                    json!({ "gpus": 0, "image": image }),
                    &["sh", "-c", "cat /abs/keep; echo; ls /rel"],
                )
                .await;
            c.wait_for_end(&id).await
        }
    };
    // Contained: the links resolve inside the image's root.
    let links = submit("links").await;
    assert_eq!(links["state"], "succeeded", "{links:#}");
    // Refused: a `..` entry, a hard link to a file outside.
    let dotdot = submit("dotdot").await;
    assert_eq!(dotdot["state"], "failed");
    assert!(
        dotdot["message"]
            .as_str()
            .unwrap_or_default()
            .contains("leaves the image's root"),
        "{dotdot:#}"
    );
    let hard = submit("hardlink").await;
    assert_eq!(hard["state"], "failed");
    assert!(
        hard["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not in the image"),
        "{hard:#}"
    );
    // Nothing outside was written.
    let entries: Vec<_> = std::fs::read_dir(outside.path())
        .expect("read")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(entries, ["keep"]);
    assert_eq!(
        std::fs::read_to_string(outside.path().join("keep")).expect("keep"),
        "original"
    );
    assert!(!std::path::Path::new("/tmp/allot-dotdot").exists());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tenant_policy_decides_which_registries_it_may_use() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    let c = confined_cluster(&registry, 1, "1xH200", 4096).await;
    c.create_tenant("team-a", None).await;
    let allowed = format!("{}/team-a", registry.addr);
    let (status, body) = c
        .request(
            reqwest::Method::PUT,
            "/api/v1/tenants/team-a/policy",
            Some(&c.admin_token),
            Some(json!({ "image_registries": [allowed] })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for refused in [
        format!("{}/team-b/busybox:1", registry.addr),
        "evil.example.com/team-a/busybox:1".to_owned(),
        format!("{}/team-ab/busybox:1", registry.addr),
    ] {
        let (status, body) = c
            .post(
                "/api/v1/jobs",
                json!({ "tenant": "team-a", "gpus": 0, "image": refused, "command": ["true"] }),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{refused}: {body}"
        );
        assert!(
            body.to_string().contains("\"image\""),
            "names the field: {body}"
        );
    }
    let (status, body) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "team-a", "gpus": 0,
                    "image": format!("{}/team-a/busybox:1", registry.addr), "command": ["true"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Each refusal is in the tenant's log, naming the image; the allowed submit is not.
    let (_, tenant) = c.get("/api/v1/tenants/team-a").await;
    let refusals: Vec<String> = c
        .audit_log(tenant["id"].as_str().expect("id"))
        .await
        .into_iter()
        .filter(|e| e.action == "job.image_refused")
        .map(|e| e.after.map(|a| a["image"].to_string()).unwrap_or_default())
        .collect();
    assert_eq!(refusals.len(), 3, "{refusals:?}");
    assert!(
        refusals.iter().any(|i| i.contains("evil.example.com")),
        "{refusals:?}"
    );
    // A malformed reference is refused whatever the policy.
    let (status, _) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "team-a", "gpus": 0, "image": "Not An Image", "command": ["true"] }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn private_registries_take_the_tenants_credentials_which_nothing_shows() {
    if !require_container_support() {
        return;
    }
    // Values no test data contains by chance.
    let user = format!("puller-{}", std::process::id());
    let password = allot_system_tests::unique("pw");
    let registry = Registry::start_private(&user, &password);
    let digest = push_busybox(&registry, "private/busybox:v1").await;
    let c = confined_cluster(&registry, 1, "1xH200", 4096).await;
    c.create_tenant("team-a", None).await;
    c.create_tenant("team-b", None).await;
    let image = format!("{}/private/busybox:v1", registry.addr);
    let mut responses = Vec::new();

    // Without credentials the registry refuses the pull, and the job says so.
    let id = c
        .submit_with("team-a", json!({ "gpus": 0, "image": image }), &["true"])
        .await;
    let refused = c.wait_for_end(&id).await;
    assert_eq!(refused["state"], "failed", "{refused:#}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("refused the credentials")),
        "{refused:#}"
    );

    // Its admin sets them: the answer, and the list, show which registry, never them.
    let path = format!(
        "/api/v1/tenants/team-a/registry-credentials/{}",
        registry.addr
    );
    let (status, body) = c
        .put(&path, json!({ "username": user, "password": password }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["registry"], registry.addr.as_str());
    responses.push(body);
    let (status, body) = c.get("/api/v1/tenants/team-a/registry-credentials").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.as_array().map(Vec::len), Some(1), "{body}");
    responses.push(body);
    // Bad input names its field.
    let (status, body) = c
        .put(&path, json!({ "username": "a:b", "password": password }))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body.to_string().contains("username"), "{body}");
    let (status, body) = c
        .put(
            "/api/v1/tenants/team-a/registry-credentials/not a host",
            json!({ "username": user, "password": password }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body.to_string().contains("registry"), "{body}");

    // Now its job pulls and runs.
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image }),
            &["echo", "pulled privately"],
        )
        .await;
    let ran = c.wait_for_end(&id).await;
    assert_eq!(ran["state"], "succeeded", "{ran:#}");
    assert_eq!(ran["image_digest"], digest.as_str());
    assert_eq!(c.log_of(&id).await, "pulled privately\n");

    // Another tenant on the same node, without credentials, does not get the image from
    // the node's cache: by tag or by digest, the registry is asked and refuses.
    for reference in [
        image.clone(),
        format!("{}/private/busybox@{digest}", registry.addr),
    ] {
        let id = c
            .submit_with(
                "team-b",
                json!({ "gpus": 0, "image": reference }),
                &["true"],
            )
            .await;
        let other = c.wait_for_end(&id).await;
        assert_eq!(other["state"], "failed", "{reference}: {other:#}");
        assert!(
            other["message"]
                .as_str()
                .is_some_and(|m| m.contains("refused the credentials")),
            "{other:#}"
        );
    }

    // Nowhere do they show: not in any API answer, audit entry or export, job record or
    // log, nor in any file of the control plane or the node (its database included: they
    // are sealed there).
    for path in [
        "/api/v1/jobs?limit=100".to_owned(),
        format!("/api/v1/jobs/{id}"),
        format!("/api/v1/jobs/{id}/log"),
        "/api/v1/tenants/team-a".to_owned(),
        "/api/v1/tenants/team-a/policy".to_owned(),
        "/api/v1/audit/logs".to_owned(),
        "/api/v1/audit/entries?limit=1000".to_owned(),
    ] {
        let (status, body) = c.get(&path).await;
        assert!(status.is_success(), "{path}: {status} {body}");
        responses.push(body);
    }
    let (_, logs) = c.get("/api/v1/audit/logs").await;
    let mut saw_set = false;
    for log in logs.as_array().expect("logs") {
        let name = log["log"]
            .as_str()
            .or(log["name"].as_str())
            .expect("log name");
        for what in ["entries?limit=1000", "export"] {
            let res = c
                .http
                .get(c.url(&format!("/api/v1/audit/logs/{name}/{what}")))
                .bearer_auth(&c.admin_token)
                .send()
                .await
                .expect("audit read");
            assert!(res.status().is_success(), "{name}/{what}: {}", res.status());
            let text = res.text().await.expect("body");
            saw_set |= text.contains("tenant.registry_credential.set");
            responses.push(Value::String(text));
        }
    }
    assert!(saw_set, "the change of credentials is audited");
    for (i, r) in responses.iter().enumerate() {
        let text = r.to_string();
        for secret in [&user, &password] {
            assert!(
                !text.contains(secret.as_str()),
                "answer {i} shows `{secret}`: {text}"
            );
        }
    }
    for secret in [&user, &password] {
        let found = c.files_containing(secret.as_bytes());
        assert!(found.is_empty(), "`{secret}` is written in {found:?}");
    }
    // Removing them is audited too, and the next pull is refused again.
    let (status, _) = c.delete(&path).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = c.delete(&path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    c.shutdown().await;
}
