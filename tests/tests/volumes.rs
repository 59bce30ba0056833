//! Named volumes with real `runc`: a job mounts shared storage by name and sees only its
//! tenant's directory there, owned by the tenant's host uids; its checkpoints survive into
//! the next attempt; host paths and volumes a tenant may not use are refused at submit.

use allot_system_tests::StatusCode;
use allot_system_tests::oci::{
    Registry, confined_cluster, push_busybox, require_container_support, searchable,
};
use serde_json::json;
use std::os::unix::fs::MetadataExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_mount_named_volumes_and_see_only_their_tenants_directory() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    push_busybox(&registry, "busybox:1").await;
    let c = confined_cluster(&registry, 1, "1xH200", 4096).await;
    for t in ["team-a", "team-b", "team-c"] {
        c.create_tenant(t, None).await;
    }
    let storage = tempfile::tempdir().expect("shared storage");
    searchable(storage.path());
    c.put_volume("ckpt", storage.path(), &["team-a", "team-b"])
        .await;
    let image = format!("{}/busybox:1", registry.addr);
    let mount = json!([{ "volume": "ckpt", "path": "/ckpt" }]);

    // Refused at submit, naming the field: a host path, a volume the tenant may not use,
    // one that does not exist, a mount over the kernel's files, a checkpoint directory on
    // a read-only mount.
    for (tenant, fields, field) in [
        (
            "team-a",
            json!({ "checkpoint_dir": "/var/lib/allot" }),
            "checkpoint_dir",
        ),
        ("team-c", json!({ "volumes": mount }), "volumes[0].volume"),
        (
            "team-a",
            json!({ "volumes": [{ "volume": "nope", "path": "/x" }] }),
            "volumes[0].volume",
        ),
        (
            "team-a",
            json!({ "volumes": [{ "volume": "ckpt", "path": "/proc" }] }),
            "volumes[0].path",
        ),
        (
            "team-a",
            json!({ "volumes": [{ "volume": "ckpt", "path": "/ckpt", "read_only": true }],
                    "checkpoint_dir": "/ckpt/run" }),
            "checkpoint_dir",
        ),
    ] {
        let mut body = json!({ "tenant": tenant, "gpus": 0, "image": image, "command": ["true"] });
        if let (Some(b), Some(f)) = (body.as_object_mut(), fields.as_object()) {
            b.extend(f.clone());
        }
        let (status, answer) = c.post("/api/v1/jobs", body).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{fields}: {answer}"
        );
        assert!(
            answer.to_string().contains(&format!("\"{field}\"")),
            "{fields}: names `{field}`: {answer}"
        );
    }

    // A checkpoint written by the first attempt is restored by the second.
    let script = r#"if [ -z "$ALLOT_RESTORE_FROM" ]; then
  mkdir -p "$ALLOT_CHECKPOINT_DIR" && echo state-1 > "$ALLOT_CHECKPOINT_DIR/step-1"; exit 3
fi
echo "restoring from $ALLOT_RESTORE_FROM: $(cat "$ALLOT_RESTORE_FROM")""#;
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image, "max_retries": 1, "volumes": mount,
                    "checkpoint_dir": "/ckpt/run" }),
            &["sh", "-c", script],
        )
        .await;
    let job = c.wait_for_end(&id).await;
    assert_eq!(
        job["state"],
        "succeeded",
        "{job:#}\n{}",
        c.log_of(&id).await
    );
    assert_eq!(job["attempt"], 2);
    assert_eq!(
        c.log_of(&id).await,
        "restoring from /ckpt/run/step-1: state-1\n"
    );
    // On the storage: the tenant's own directory, owned by its host uids, not root's.
    let file = storage.path().join("team-a/run/step-1");
    assert_eq!(
        std::fs::read_to_string(&file).expect("checkpoint"),
        "state-1\n"
    );
    let owner = std::fs::metadata(&file).expect("meta").uid();
    assert!(
        owner >= allot_domain::Tenant::UID_FIRST,
        "owned by uid {owner}"
    );

    // Tenant B mounts the same volume: it sees its own (empty) directory, and no way up.
    let probe = r#"ls -A /ckpt; cat /ckpt/../team-a/run/step-1 2>/dev/null && echo BREACH
cat /ckpt/run/step-1 2>/dev/null && echo BREACH; echo mine > /ckpt/b && echo wrote"#;
    let id = c
        .submit_with(
            "team-b",
            json!({ "gpus": 0, "image": image, "volumes": mount }),
            &["sh", "-c", probe],
        )
        .await;
    let job = c.wait_for_end(&id).await;
    let log = c.log_of(&id).await;
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    assert_eq!(log, "wrote\n", "team-b saw nothing of team-a's");
    assert_eq!(
        std::fs::read_to_string(storage.path().join("team-b/b")).expect("b"),
        "mine\n"
    );
    let a = std::fs::metadata(storage.path().join("team-a"))
        .expect("a")
        .uid();
    let b = std::fs::metadata(storage.path().join("team-b"))
        .expect("b")
        .uid();
    assert_ne!(a, b, "each tenant's directory is its own host uid's");

    // A read-only mount is read-only.
    let id = c
        .submit_with(
            "team-b",
            json!({ "gpus": 0, "image": image,
                    "volumes": [{ "volume": "ckpt", "path": "/data", "read_only": true }] }),
            &[
                "sh",
                "-c",
                "cat /data/b; echo x > /data/c 2>/dev/null && echo BREACH; true",
            ],
        )
        .await;
    let job = c.wait_for_end(&id).await;
    assert_eq!(job["state"], "succeeded", "{job:#}");
    // Its output and the shell's complaint come through two pipes, interleaved write by
    // write (busybox writes its complaint's newline apart: "…file systemmine\n\n" was
    // seen), so each is looked for whole, not line by line.
    let log = c.log_of(&id).await;
    assert_eq!(log.matches("mine").count(), 1, "{log}");
    let complaint = log.replacen("mine", "", 1);
    assert!(
        complaint.contains("sh: can't create /data/c: Read-only file system"),
        "{log}"
    );
    assert!(!log.contains("BREACH"), "{log}");

    // The declaration cannot drop a tenant whose unfinished jobs mount it.
    let id = c
        .submit_with(
            "team-b",
            json!({ "gpus": 0, "image": image, "volumes": mount }),
            &["sleep", "60"],
        )
        .await;
    c.wait_for_state(&id, "running").await;
    let (status, body) = c
        .put(
            "/api/v1/volumes/ckpt",
            json!({ "host_path": storage.path(), "tenants": ["team-a"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _) = c.delete("/api/v1/volumes/ckpt").await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert!(status.is_success());
    c.wait_for_end(&id).await;
    let (status, _) = c.delete("/api/v1/volumes/ckpt").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    c.shutdown().await;
}
