//! Elastic shares in the live scheduler (`--elastic`): a class under its window's share
//! takes capacity back from another class's preemptible jobs, which get the policy's grace
//! period to checkpoint, are requeued, and wait while the class entitled to the room wants
//! it.

use allot_system_tests::{Backend, spawn_cluster_with};
use serde_json::json;

const POLICY: &str = r#"
time_zone = "UTC"

[[window]]
name = "all week: inference first"
days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
from = "00:00"
to = "00:00"
shares = { inference = 0.75, training = 0.25 }

[preemption]
grace_seconds = 15
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_takes_its_share_back_from_borrowers_after_their_grace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let policy = dir.path().join("elastic.toml");
    std::fs::write(&policy, POLICY).expect("policy");
    let c = spawn_cluster_with(Backend::Sqlite, 1, "4xH200", |config| {
        config.elastic_policy = Some(policy.clone());
        config.metrics_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    c.create_tenant("ml", None).await;
    let storage = dir.path().join("storage");
    std::fs::create_dir(&storage).expect("volume");
    c.put_volume("ckpt", &storage, &["ml"]).await;
    // The tenant's directory of the volume, where its jobs' checkpoints land.
    let checkpoints = storage.join("ml");
    // Training borrows the whole node while nobody else wants it. Each job saves a
    // checkpoint when told to stop, which takes it 3 s: longer than the agent's own 2 s
    // grace, well within the policy's 15 s.
    let save = r#"trap 'sleep 3; echo saved > "$ALLOT_CHECKPOINT_DIR/attempt-$ALLOT_ATTEMPT"; exit 0' TERM; sleep 600 & wait"#;
    let mut training = Vec::new();
    for i in 0..4 {
        training.push(
            c.submit_with(
                "ml",
                json!({ "gpus": 1, "class": "training", "preemptible": true,
                        "checkpoint_dir": format!("/ckpt/train-{i}"), "name": format!("train-{i}"),
                        "volumes": [{ "volume": "ckpt", "path": "/ckpt" }] }),
                &["sh", "-c", save],
            )
            .await,
        );
        // Distinct start times: the youngest is stopped first.
        c.wait_for_state(&training[i], "running").await;
    }
    // Inference arrives: entitled to 3 of the 4 GPUs, it gets them from the three youngest
    // training jobs.
    let mut inference = Vec::new();
    for _ in 0..3 {
        inference.push(
            c.submit_with(
                "ml",
                json!({ "gpus": 1, "class": "inference" }),
                &["sleep", "600"],
            )
            .await,
        );
    }
    for id in &inference {
        c.wait_for_state(id, "running").await;
    }
    // The oldest training job kept its GPU: training's quarter.
    let (_, oldest) = c.get(&format!("/api/v1/jobs/{}", training[0])).await;
    assert_eq!(
        (oldest["state"].as_str(), oldest["attempt"].as_u64()),
        (Some("running"), Some(1))
    );
    for (i, id) in training.iter().enumerate().skip(1) {
        let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
        // Requeued as its next attempt, waiting: no room, and training holds its share.
        assert_eq!(job["state"], "pending", "{job}");
        assert_eq!(job["attempt"], 2, "{job}");
        assert!(
            job.to_string()
                .contains("elastic window `all week: inference first`"),
            "{job}"
        );
        // It was given the policy's grace: its checkpoint is there.
        let saved = checkpoints.join(format!("train-{i}")).join("attempt-1");
        assert!(
            saved.exists(),
            "train-{i} was killed before it saved its checkpoint"
        );
    }
    // The control plane's metrics show the entitlements.
    let text = c.scrape_metrics().await;
    for line in [
        r#"allot_elastic_entitlement_gpus{class="inference"} 3.0"#,
        r#"allot_elastic_entitlement_gpus{class="training"} 1.0"#,
        "allot_elastic_burst_active 0",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line}:\n{text}");
    }
    c.shutdown().await;
}
