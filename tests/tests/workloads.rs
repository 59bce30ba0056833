//! The workload programs `allot bench efficiency` runs, as jobs on a real agent with a
//! simulated GPU: an inference service answering requests with kernel launches on its GPU
//! (which the fake driver counts as the GPU's busy time, through the state the agent points
//! every job at), and a training loop that checkpoints when it is stopped and resumes from
//! its checkpoint.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_agent::sharing::SharingConfig;
use allot_system_tests::shim::kit;
use allot_system_tests::{Backend, TestCluster, spawn_cluster_with};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A cluster with one agent of one simulated H200 whose jobs share it through the fake
/// driver's state in `<agent dir>/sim-gpus`.
async fn cluster() -> (TestCluster, tempfile::TempDir, CancellationToken) {
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |_| {}).await;
    c.create_tenant("ml", None).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("sim-gpus");
    std::fs::create_dir_all(&state).expect("state dir");
    let backend = allot_agent::gpu::SimBackend::from_spec("1xH200", "worker")
        .expect("gpus")
        .with_state_dir(state);
    let stop = CancellationToken::new();
    let cfg = allot_agent::AgentConfig {
        sharing: SharingConfig {
            shim_library: Some(kit().shim.clone()),
            context_reserve_bytes: 512 << 20,
            require_shim: true,
        },
        ..allot_system_tests::agent_config(&c.server, "worker", dir.path().join("agent")).await
    };
    tokio::spawn(allot_agent::run(cfg, Arc::new(backend), stop.clone()));
    (c, dir, stop)
}

fn driver_env() -> serde_json::Value {
    json!({ "LD_LIBRARY_PATH": kit().driver_dir.display().to_string() })
}

/// Waits up to 30 s for a file to hold text.
async fn read_when_there(path: &std::path::Path) -> String {
    let started = Instant::now();
    loop {
        if let Ok(t) = std::fs::read_to_string(path)
            && !t.trim().is_empty()
        {
            return t;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The GPU's busy time by the fake driver's count (nanoseconds), from its state file (made
/// by the first kernel a job launches on it).
fn gpu_busy_ns(dir: &std::path::Path) -> u64 {
    let entries: Vec<_> = std::fs::read_dir(dir.join("sim-gpus"))
        .expect("state dir")
        .flatten()
        .collect();
    if entries.is_empty() {
        return 0;
    }
    assert_eq!(entries.len(), 1, "one GPU's state: {entries:?}");
    let name = entries[0].file_name().to_string_lossy().into_owned();
    let uuid = name.strip_suffix(".gpu").expect("a GPU's state file");
    allot_agent::gpu::fake_gpu_busy_ns(&dir.join("sim-gpus"), uuid).expect("a busy count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_service_answers_requests_with_work_on_its_gpu() {
    let (c, dir, stop) = cluster().await;
    let port_file = dir.path().join("port");
    let id = c
        .submit_with(
            "ml",
            json!({
                "gpus": 1, "gpu_milli": 500, "gpu_memory_bytes": 4u64 << 30,
                "gpu_compute": "elastic", "class": "inference", "env": driver_env(),
            }),
            &[
                kit().workload.to_str().expect("path"),
                "serve",
                "--port-file",
                port_file.to_str().expect("path"),
                "--kernels",
                "3",
                "--kernel-us",
                "2000",
            ],
        )
        .await;
    c.wait_for_state(&id, "running").await;
    let port: u16 = read_when_there(&port_file)
        .await
        .trim()
        .parse()
        .expect("a port");
    let busy_before = gpu_busy_ns(dir.path());
    let answers = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut answers = Vec::new();
        for id in 100..120u64 {
            s.write_all(&id.to_le_bytes()).expect("send");
            let mut buf = [0u8; 8];
            s.read_exact(&mut buf).expect("answer");
            answers.push(u64::from_le_bytes(buf));
        }
        answers
    })
    .await
    .expect("client");
    assert_eq!(
        answers,
        (100..120).collect::<Vec<u64>>(),
        "each request answered, in order"
    );
    // Twenty requests of three 2 ms kernels ran on the job's GPU, by the driver's count.
    let busy = gpu_busy_ns(dir.path()) - busy_before;
    assert!(
        (120_000_000..1_000_000_000).contains(&busy),
        "the GPU was busy {busy} ns for 120 ms of kernels"
    );
    stop.cancel();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_training_loop_checkpoints_when_stopped_and_resumes_from_it() {
    let (c, dir, stop) = cluster().await;
    let progress = dir.path().join("progress");
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir_all(&progress).expect("progress dir");
    let args = [
        kit().workload.to_str().expect("path"),
        "train",
        "--progress-dir",
        progress.to_str().expect("path"),
        "--checkpoint-dir",
        checkpoints.to_str().expect("path"),
        "--kernel-us",
        "1000",
        // Only when stopped, within this test.
        "--checkpoint-secs",
        "3600",
    ];
    let spec =
        json!({ "gpus": 1, "class": "training", "isolation": "shared", "env": driver_env() });
    let first = c.submit_with("ml", spec.clone(), &args).await;
    c.wait_for_state(&first, "running").await;
    let progress_of = |id: &str| progress.join(format!("{id}-1"));
    read_when_there(&progress_of(&first)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{first}/cancel"), json!({}))
        .await;
    assert!(status.is_success(), "{status}");
    c.wait_for_state(&first, "cancelled").await;
    let saved: f64 = std::fs::read_to_string(checkpoints.join("checkpoint"))
        .expect("a checkpoint written on SIGTERM")
        .trim()
        .parse()
        .expect("kernel-seconds");
    let ran: f64 = std::fs::read_to_string(progress_of(&first))
        .expect("progress")
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .expect("kernel-seconds");
    assert!(saved > 0.3, "about a second of 1 ms kernels ran: {saved}");
    assert!(
        (saved - ran).abs() < 1e-6,
        "nothing ran after the checkpoint: {saved} {ran}"
    );

    // The next run resumes from it.
    let second = c.submit_with("ml", spec, &args).await;
    c.wait_for_state(&second, "running").await;
    let line = read_when_there(&progress_of(&second)).await;
    let restored: f64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|w| w.parse().ok())
        .expect("restored kernel-seconds");
    assert!(
        (restored - saved).abs() < 1e-6,
        "resumed from {restored}, saved {saved}"
    );
    stop.cancel();
    c.shutdown().await;
}
