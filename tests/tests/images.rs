//! Jobs run OCI images pulled from a real registry (Debian's `docker-registry`, the CNCF
//! distribution registry) on loopback, by real agents running `runc`: a tag is pinned to
//! its digest, a node's second pull is served from its own cache, a layer that does not
//! match its digest fails the job naming it, crafted layers write nothing outside the
//! image's root, and the tenant's policy decides which registries it may use. Hostile
//! images and registries: account files linking out of the image, blobs longer than
//! declared, decompression bombs, manifests naming another tenant's layers; and what one
//! container's mounts make never shows in another's, nor the cache to other users.

use std::time::Duration;

use allot_system_tests::oci::{
    BusyboxCluster, Registry, add_file, add_link, add_symlink, busybox_cluster, busybox_layer,
    confined_cluster, confined_cluster_with, layer, push_busybox, require_container_support,
    run_image,
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

/// The node's data dir.
fn node_dir(c: &TestCluster) -> std::path::PathBuf {
    c.data_dir.path().join("node-1")
}

/// The cached root of image `digest` on the node.
fn cached_root(c: &TestCluster, digest: &str) -> std::path::PathBuf {
    node_dir(c)
        .join("images/rootfs")
        .join(digest.trim_start_matches("sha256:"))
}

/// Bytes of the files under `dir` (links not followed).
fn bytes_under(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        total += if m.is_dir() {
            bytes_under(&e.path())
        } else {
            m.len()
        };
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_images_account_files_are_read_inside_it_as_data() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    // `etc/passwd` a link to a device that never ends.
    registry
        .push(
            "team-a/zero:1",
            &[
                busybox_layer(),
                layer(|b| add_symlink(b, "etc/passwd", "/dev/zero")),
            ],
            json!({ "Env": ["PATH=/bin"], "User": "nobody" }),
        )
        .await;
    // `etc/passwd` a link to a file of the host (another uid for `nobody`), with a file of
    // the image's own at the same path inside it.
    let host = tempfile::tempdir().expect("temp dir");
    let host_passwd = host.path().join("passwd");
    std::fs::write(&host_passwd, "nobody:x:4242:4242::/:/bin/sh\n").expect("write");
    let target = host_passwd.display().to_string();
    registry
        .push(
            "team-a/hostlink:1",
            &[
                busybox_layer(),
                layer(|b| {
                    add_file(
                        b,
                        target.trim_start_matches('/'),
                        b"nobody:x:1234:1234::/:/bin/sh\n",
                        0o644,
                    );
                    add_symlink(b, "etc/passwd", &target);
                }),
            ],
            json!({ "Env": ["PATH=/bin"], "User": "nobody" }),
        )
        .await;
    push_busybox(&registry, "team-a/busybox:1").await;
    let c = confined_cluster(&registry, 1, "1xH200", 4096).await;
    c.create_tenant("team-a", None).await;
    let run = |repo: &str, cmd: &'static [&'static str]| {
        let image = format!("{}/team-a/{repo}:1", registry.addr);
        let c = &c;
        async move { run_image(c, "team-a", &image, cmd).await }
    };
    // Twice, as a requeued job would come back: the agent reads nothing of /dev/zero and
    // keeps running; the job fails, saying why.
    for _ in 0..2 {
        let (job, log) = run("zero", &["id", "-u"]).await;
        assert_eq!(job["state"], "failed", "{job:#}\n{log}");
        let message = job["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("nobody") && message.contains("/etc/passwd"),
            "{message}"
        );
    }
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert_eq!(nodes[0]["status"], "ready", "the agent is alive: {nodes:#}");
    // The image's own file is read, never the host's it links to.
    let (job, log) = run("hostlink", &["id", "-u"]).await;
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    assert_eq!(log, "1234\n", "the uid comes from the image's own file");
    // And the node still runs ordinary jobs.
    let (job, log) = run("busybox", &["echo", "still here"]).await;
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_a_registry_sends_is_held_to_the_manifest_and_the_caps() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    // A layer the registry serves with 32 MiB more than its manifest declares.
    let digest = registry
        .push(
            "team-a/long:1",
            &[
                busybox_layer(),
                layer(|b| add_file(b, "data.txt", b"declared", 0o644)),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    let manifest: Value = serde_json::from_slice(
        &registry
            .inner
            .manifest_bytes("team-a/long:1")
            .await
            .expect("manifest"),
    )
    .expect("json");
    let long_layer = manifest["layers"][1]["digest"]
        .as_str()
        .expect("digest")
        .to_owned();
    let declared = manifest["layers"][1]["size"].as_u64().expect("size");
    let blob = registry.blob_file(&long_layer);
    let mut bytes = std::fs::read(&blob).expect("blob");
    bytes.resize(bytes.len() + (32 << 20), 0);
    std::fs::write(&blob, bytes).expect("lengthen");
    // A decompression bomb: a few hundred KiB of gzip that unpack to 192 MiB.
    let bomb = vec![0u8; 192 << 20];
    registry
        .push(
            "team-a/bomb:1",
            &[
                busybox_layer(),
                layer(|b| add_file(b, "bomb", &bomb, 0o644)),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    drop(bomb);
    let cap = 48u64 << 20;
    let c = confined_cluster_with(&registry, 1, "1xH200", 4096, |oci| {
        oci.image_max_bytes = Some(cap);
    })
    .await;
    c.create_tenant("team-a", None).await;
    let run = |repo: &str| {
        let image = format!("{}/team-a/{repo}:1", registry.addr);
        let c = &c;
        async move { run_image(c, "team-a", &image, &["true"]).await.0 }
    };
    // The long blob stops at its declared size (the digest, checked at its end, is never
    // reached), and nothing of it stays on the node.
    let job = run("long").await;
    assert_eq!(job["state"], "failed", "{job:#}");
    let message = job["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&long_layer)
            && message.contains(&format!("larger than the {declared} bytes")),
        "{message}"
    );
    let blobs = node_dir(&c).join("images/blobs/sha256");
    assert!(
        bytes_under(&blobs) < 8 << 20,
        "{} bytes of blobs kept",
        bytes_under(&blobs)
    );
    assert!(!cached_root(&c, &digest).exists());
    // The bomb stops at the cap on one image, as it unpacks, and is gone.
    let job = run("bomb").await;
    assert_eq!(job["state"], "failed", "{job:#}");
    let message = job["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("larger than the node's cap on one image"),
        "{message}"
    );
    let images = node_dir(&c).join("images");
    assert!(
        bytes_under(&images) < cap,
        "the image cache holds {} bytes",
        bytes_under(&images)
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manifest_naming_another_tenants_layers_gets_nothing_from_the_cache() {
    if !require_container_support() {
        return;
    }
    // Tenant B's private image, with a secret in a layer of its own.
    let user = format!("b-{}", std::process::id());
    let password = allot_system_tests::unique("pw");
    let b_registry = Registry::start_private(&user, &password);
    let b_digest = b_registry
        .push(
            "b/private:1",
            &[
                busybox_layer(),
                layer(|b| add_file(b, "secret.txt", b"B-SECRET\n", 0o644)),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    let b_manifest = b_registry
        .inner
        .manifest_bytes("b/private:1")
        .await
        .expect("manifest");
    let b_layers: Value = serde_json::from_slice(&b_manifest).expect("json");
    // Tenant A's own registry, which serves whatever A puts in it: B's manifest bytes under
    // another name, and a manifest of A's naming B's secret layer (never its content).
    let a_registry = Registry::start();
    push_busybox(&a_registry, "a/base:1").await;
    let copy = a_registry
        .inner
        .plant_manifest("a/copy", "1", &b_manifest)
        .expect("plant");
    assert_eq!(copy, b_digest, "the same bytes, the same digest");
    let mut crafted: Value = serde_json::from_slice(
        &a_registry
            .inner
            .manifest_bytes("a/base:1")
            .await
            .expect("manifest"),
    )
    .expect("json");
    crafted["layers"] = b_layers["layers"].clone();
    a_registry
        .inner
        .plant_manifest("a/base", "crafted", crafted.to_string().as_bytes())
        .expect("plant");
    let a_addr = a_registry.addr.clone();
    let c = confined_cluster_with(&b_registry, 1, "1xH200", 4096, |oci| {
        oci.registries.insecure.push(a_addr.clone());
    })
    .await;
    c.create_tenant("team-a", None).await;
    c.create_tenant("team-b", None).await;
    let (status, body) = c
        .put(
            &format!(
                "/api/v1/tenants/team-b/registry-credentials/{}",
                b_registry.addr
            ),
            json!({ "username": user, "password": password }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // B runs its image: the node caches its layers and root.
    let id = c
        .submit_with(
            "team-b",
            json!({ "gpus": 0, "image": format!("{}/b/private:1", b_registry.addr) }),
            &["cat", "/secret.txt"],
        )
        .await;
    let b_job = c.wait_for_end(&id).await;
    assert_eq!(b_job["state"], "succeeded", "{b_job:#}");
    assert_eq!(c.log_of(&id).await, "B-SECRET\n");
    assert!(cached_root(&c, &b_digest).join("secret.txt").is_file());
    // A's registry has not the blobs: A gets neither B's cached root nor its layers.
    for (image, missing) in [
        (
            format!("{a_addr}/a/copy:1"),
            b_layers["config"]["digest"].clone(),
        ),
        (
            format!("{a_addr}/a/base:crafted"),
            b_layers["layers"][1]["digest"].clone(),
        ),
    ] {
        let id = c
            .submit_with(
                "team-a",
                json!({ "gpus": 0, "image": image }),
                &["cat", "/secret.txt"],
            )
            .await;
        let job = c.wait_for_end(&id).await;
        let log = c.log_of(&id).await;
        assert_eq!(job["state"], "failed", "{image}: {job:#}\n{log}");
        assert!(!log.contains("B-SECRET"), "{image}: A read B's file: {log}");
        let message = job["message"].as_str().unwrap_or_default();
        let missing = missing.as_str().expect("digest");
        assert!(
            message.contains("does not serve blob") && message.contains(missing),
            "{image}: {message}"
        );
    }
    // B's own image is B's still, from the cache.
    let before = b_registry.blob_fetches();
    let id = c
        .submit_with(
            "team-b",
            json!({ "gpus": 0, "image": format!("{}/b/private:1", b_registry.addr) }),
            &["cat", "/secret.txt"],
        )
        .await;
    assert_eq!(c.wait_for_end(&id).await["state"], "succeeded");
    assert_eq!(b_registry.blob_fetches(), before, "served from the cache");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mount_targets_stay_in_their_own_container_and_cached_roots_are_private() {
    if !require_container_support() {
        return;
    }
    // The registry is bound: it serves for as long as the test runs.
    let BusyboxCluster {
        c,
        image,
        digest,
        registry: _registry,
    } = busybox_cluster("shared/busybox:1", 4096, &["team-a", "team-b"]).await;
    let volume = tempfile::tempdir().expect("volume");
    allot_system_tests::oci::searchable(volume.path());
    c.put_volume("shared", volume.path(), &["team-a", "team-b"])
        .await;
    // A mounts a volume over a file its image lacks, and starts in a directory it lacks.
    let a = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image, "workdir": "/made/by/a",
                    "volumes": [{ "volume": "shared", "path": "/etc/ld.so.preload" }] }),
            &[
                "sh",
                "-c",
                "test -d /etc/ld.so.preload && pwd && echo mounted; sleep 300",
            ],
        )
        .await;
    let running = c.wait_for_state(&a, "running").await;
    let cached = cached_root(&c, &digest);
    assert!(cached.join("etc/passwd").is_file(), "root reads the cache");
    // No other user of the host reads the cached root or A's own root, by digest or by
    // container id: not nobody, not a uid of another tenant's range.
    let container_root = node_dir(&c)
        .join("oci/roots")
        .join(format!("allot-{a}-1"))
        .join("rootfs");
    assert!(
        container_root.join("etc/passwd").is_file(),
        "A's root is where it is looked for"
    );
    let other_tenant = allot_domain::Tenant::UID_FIRST + 4000 * allot_domain::Tenant::UID_RANGE;
    for uid in [65534, other_tenant] {
        for path in [
            cached.join("etc/passwd"),
            node_dir(&c).join("images/rootfs"),
            container_root.join("etc/passwd"),
        ] {
            let path = path.display().to_string();
            let (read, err) = allot_system_tests::oci::run_as(
                uid,
                allot_system_tests::oci::BUSYBOX,
                &["cat", &path],
            );
            assert!(!read, "uid {uid} read {path}");
            assert!(
                err.contains("Permission denied"),
                "uid {uid}, {path}: {err}"
            );
            let (listed, _) = allot_system_tests::oci::run_as(
                uid,
                allot_system_tests::oci::BUSYBOX,
                &["ls", &path],
            );
            assert!(!listed, "uid {uid} listed {path}");
        }
    }
    // B's container of the same digest sees nothing A's made.
    let (b_job, b_log) = run_image(
        &c,
        "team-b",
        &image,
        &[
            "sh",
            "-c",
            "for p in /etc/ld.so.preload /made; do test -e $p && echo LEAK $p; done; echo checked",
        ],
    )
    .await;
    assert_eq!(b_job["state"], "succeeded", "{b_job:#}\n{b_log}");
    assert_eq!(
        b_log, "checked\n",
        "A's mount targets leaked into B's container"
    );
    for p in ["etc/ld.so.preload", "made"] {
        assert!(!cached.join(p).exists(), "{p} was made in the cached root");
    }
    // Its output reaches the control plane every half second or so: waited for, not read
    // once (a loaded machine ships it later); a wait that runs out shows what it last read.
    let wanted = "/made/by/a\nmounted\n";
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let a_log = loop {
        let log = c.log_of(&a).await;
        if log == wanted || std::time::Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(a_log, wanted, "{running:#}");
    let (status, _) = c.post(&format!("/api/v1/jobs/{a}/cancel"), json!({})).await;
    assert!(status.is_success());
    c.wait_for_end(&a).await;
    // A's own root goes with its container.
    c.eventually("A's root is removed", || async {
        (!container_root.parent().expect("dir").exists()).then_some(())
    })
    .await;
    c.shutdown().await;
}
