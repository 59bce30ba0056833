//! Jobs on shares of GPUs, end to end: the agent creates each one's limits region,
//! preloads the shim into it, and kills a job the driver says holds more than its limit.

use std::sync::Arc;

use allot_agent::sharing::SharingConfig;
use allot_system_tests::shim::kit;
use allot_system_tests::{Backend, TestCluster, spawn_cluster_with};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const GIB: u64 = 1 << 30;

/// A cluster with one agent of one simulated H200, sharing GPUs as `sharing` says.
async fn cluster(sharing: SharingConfig) -> (TestCluster, tempfile::TempDir, CancellationToken) {
    // Auto-sized jobs are sized on windows 60 times shorter (5 s, shrinking after 2 s).
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |cfg| cfg.sizing_time_scale = 60.0).await;
    c.create_tenant("ml", None).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let faults = dir.path().join("sim-faults");
    std::fs::create_dir_all(&faults).expect("fault dir");
    let backend = allot_agent::gpu::SimBackend::from_spec("1xH200", "sharer")
        .expect("gpus")
        .with_fault_dir(faults);
    let stop = CancellationToken::new();
    let cfg = allot_agent::AgentConfig {
        sharing,
        ..allot_system_tests::agent_config(&c.server, "sharer", dir.path().join("agent")).await
    };
    tokio::spawn(allot_agent::run(cfg, Arc::new(backend), stop.clone()));
    (c, dir, stop)
}

/// Jobs on shares run under the shim (and nowhere else), with 512 MiB of context memory
/// counted in their limits.
fn under_the_shim(kit: &allot_system_tests::shim::ShimKit) -> SharingConfig {
    SharingConfig {
        shim_library: Some(kit.shim.clone()),
        context_reserve_bytes: 512 << 20,
        require_shim: true,
    }
}

async fn log_of(c: &TestCluster, id: &str) -> String {
    c.http
        .get(c.url(&format!("/api/v1/jobs/{id}/log")))
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("log")
        .text()
        .await
        .expect("log text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_job_runs_under_the_shim_and_its_limits() {
    let kit = kit();
    let (c, _dir, stop) = cluster(under_the_shim(kit)).await;
    // The probe reaches the (fake) driver as PyTorch does; the fake driver's GPU is the
    // node's GPU the job was given.
    let script = format!(
        "ALLOT_FAKE_CUDA_UUIDS=$ALLOT_GPU_UUIDS exec {} procaddr ctx:0 meminfo alloc:mem:{} \
         alloc:mem:{}",
        kit.probe.display(),
        11 * GIB,
        8 * GIB
    );
    let id = c
        .submit_with(
            "ml",
            json!({
                "gpus": 1, "gpu_milli": 300, "gpu_memory_bytes": 10 * GIB,
                "gpu_compute": "elastic",
                "env": { "LD_LIBRARY_PATH": kit.driver_dir.display().to_string() },
            }),
            &["sh", "-c", &script],
        )
        .await;
    let job = c.wait_for_state(&id, "succeeded").await;
    assert_eq!(job["gpu_compute"], "elastic");
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert_eq!(nodes[0]["gpus"][0]["memory_enforcement"], "shim", "{nodes}");
    let log = log_of(&c, &id).await;
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(
        lines,
        [
            "init 0",
            "ctx 0 0",
            // The job sees its 10 GiB, less its context.
            &format!("meminfo {} {} 0", 10 * GIB - (512 << 20), 10 * GIB),
            &format!("alloc mem {} err 2", 11 * GIB),
            &format!("alloc mem {} ok 0", 8 * GIB),
        ],
        "{log}"
    );
    stop.cancel();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_limit_by_the_drivers_count_is_killed() {
    // No shim at all: the agent's NVML check is what stands.
    let (c, dir, stop) = cluster(SharingConfig::default()).await;
    let id = c
        .submit_with(
            "ml",
            json!({ "gpus": 1, "gpu_milli": 500, "gpu_memory_bytes": 10 * GIB }),
            &["sleep", "60"],
        )
        .await;
    let job = c.wait_for_state(&id, "running").await;
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert_eq!(
        nodes[0]["gpus"][0]["memory_enforcement"], "check",
        "the node says how it holds jobs to their GPU memory: {nodes}"
    );
    let pid = job["pid"].as_u64().expect("pid");
    // Within its limit (and the tolerance), it runs on.
    let file = dir
        .path()
        .join("sim-faults")
        .join(format!("gpu-mem-0-{pid}"));
    std::fs::write(&file, (10 * GIB).to_string()).expect("inject");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(job["state"], "running");
    // The driver says it holds 20 GiB of its 10: killed, and the job says why.
    std::fs::write(&file, (20 * GIB).to_string()).expect("inject");
    let job = c.wait_for_state(&id, "failed").await;
    let message = job["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("held 20 GiB of GPU memory") && message.contains("over its 10 GiB limit"),
        "{message}"
    );
    stop.cancel();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resizable_job_is_resized_while_it_runs_when_the_gpu_has_room() {
    let kit = kit();
    let (c, dir, stop) = cluster(under_the_shim(kit)).await;
    let asked = dir.path().join("asked");
    // 10 GiB at first: 15 GiB is refused; once resized to 20 GiB it goes through.
    let script = format!(
        "ALLOT_FAKE_CUDA_UUIDS=$ALLOT_GPU_UUIDS exec {} procaddr ctx:0 alloc:mem:{big} \
         touch:{} alloc-until:mem:{big} meminfo",
        kit.probe.display(),
        asked.display(),
        big = 15 * GIB,
    );
    let resizable = c
        .submit_with(
            "ml",
            json!({
                "gpus": 1, "gpu_milli": 300, "gpu_memory_bytes": 10 * GIB, "gpu_resizable": true,
                "env": { "LD_LIBRARY_PATH": kit.driver_dir.display().to_string() },
            }),
            &["sh", "-c", &script],
        )
        .await;
    let fixed = c
        .submit_with(
            "ml",
            json!({ "gpus": 1, "gpu_milli": 500, "gpu_memory_bytes": 10 * GIB }),
            &["sleep", "600"],
        )
        .await;
    c.wait_for_state(&fixed, "running").await;
    c.eventually("the job to hit its limit", || async {
        asked.exists().then_some(())
    })
    .await;
    let cluster_ref = &c;
    let resize = |id: &str, body: serde_json::Value| {
        let path = format!("/api/v1/jobs/{id}/resize");
        async move { cluster_ref.post(&path, body).await }
    };
    // Not every job allows it; bad input names its field; the GPU has 500 thousandths
    // free beside the other job, not 800.
    let (s, body) = resize(&fixed, json!({ "gpu_milli": 400 })).await;
    assert_eq!(s, allot_system_tests::StatusCode::CONFLICT, "{body}");
    let (s, body) = resize(&resizable, json!({ "gpu_milli": 1000 })).await;
    assert_eq!(
        s,
        allot_system_tests::StatusCode::UNPROCESSABLE_ENTITY,
        "{body}"
    );
    assert!(body.to_string().contains("gpu_milli"), "{body}");
    let (s, body) = resize(&resizable, json!({ "gpu_milli": 800 })).await;
    assert_eq!(s, allot_system_tests::StatusCode::CONFLICT, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("0.5 of a GPU free beside its other jobs, not 0.8")),
        "{body}"
    );
    // 400 thousandths and 20 GiB fit: applied at once, and the job's next allocation sees it.
    let (s, job) = resize(
        &resizable,
        json!({ "gpu_milli": 400, "gpu_memory_bytes": 20 * GIB }),
    )
    .await;
    assert_eq!(s, allot_system_tests::StatusCode::OK, "{job}");
    assert_eq!(job["held_gpu_milli"], 400);
    assert_eq!(job["gpu_memory_bytes"], 20 * GIB);
    let job = c.wait_for_state(&resizable, "succeeded").await;
    let log = log_of(&c, &resizable).await;
    assert!(
        log.contains(&format!("alloc mem {} err 2", 15 * GIB)),
        "{log}"
    );
    assert!(
        log.contains(&format!("alloc mem {} ok 0", 15 * GIB)),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "meminfo {} {} 0",
            20 * GIB - 15 * GIB - (512 << 20),
            20 * GIB
        )),
        "{log}"
    );
    // The history says when, so accounting can follow it.
    assert!(
        job.to_string()
            .contains("resized to 0.4 of each GPU, 20 GiB of GPU memory"),
        "{job}"
    );
    stop.cancel();
    c.shutdown().await;
}

/// The libraries `ldd` says these programs load, by their absolute paths.
fn libraries_of(programs: &[&std::path::Path]) -> Vec<String> {
    let mut libs = Vec::new();
    for p in programs {
        let out = std::process::Command::new("ldd")
            .arg(p)
            .output()
            .expect("ldd runs");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(path) = path.filter(|p| p.starts_with('/'))
                && !libs.iter().any(|l| l == path)
            {
                libs.push(path.to_owned());
            }
        }
    }
    libs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_shim_holds_a_containers_job_to_its_share() {
    use allot_system_tests::oci;
    if !oci::require_container_support() {
        return;
    }
    let kit = kit();
    // An image with the probe, the fake driver where a node's CDI spec would put the real
    // one, and the C library they all load (taken from this machine).
    let driver = std::fs::read(kit.driver_dir.join("libcuda.so.1")).expect("fake driver");
    let probe = std::fs::read(&kit.probe).expect("probe");
    let libs = libraries_of(&[&kit.probe, &kit.shim, &kit.driver_dir.join("libcuda.so.1")]);
    let files = oci::layer(|b| {
        let mut dirs = std::collections::BTreeSet::new();
        for path in libs
            .iter()
            .map(String::as_str)
            .chain(["/usr/lib/allot-test/x", "/usr/local/bin/x"])
        {
            let mut p = std::path::Path::new(path).parent();
            while let Some(d) = p.filter(|d| *d != std::path::Path::new("/")) {
                dirs.insert(d.display().to_string());
                p = d.parent();
            }
        }
        for d in &dirs {
            oci::add_dir(b, d.trim_start_matches('/'));
        }
        for lib in &libs {
            let bytes = std::fs::read(lib).expect("library");
            oci::add_file(b, lib.trim_start_matches('/'), &bytes, 0o755);
        }
        for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
            oci::add_file(b, &format!("usr/lib/allot-test/{name}"), &driver, 0o755);
        }
        oci::add_file(b, "usr/local/bin/probe", &probe, 0o755);
    });
    let registry = oci::Registry::start();
    registry
        .push(
            "ml/probe:1",
            &[oci::busybox_layer(), files],
            json!({ "Env": ["PATH=/bin:/usr/local/bin"] }),
        )
        .await;
    let addr = registry.addr.clone();
    let shim = kit.shim.clone();
    let c = allot_system_tests::spawn_cluster_of(
        Backend::Sqlite,
        1,
        "1xH200",
        |_| {},
        move |cfg| {
            let mut o = allot_agent::runtime::oci::OciConfig::discover(None).expect("runc");
            o.registries.insecure = vec![addr.clone()];
            cfg.runtime = allot_agent::RuntimeChoice::Oci(o);
            cfg.sharing = SharingConfig {
                shim_library: Some(shim.clone()),
                context_reserve_bytes: 512 << 20,
                require_shim: true,
            };
        },
    )
    .await;
    c.create_tenant("ml", None).await;
    let script = format!(
        "ALLOT_FAKE_CUDA_UUIDS=$ALLOT_GPU_UUIDS exec probe procaddr ctx:0 meminfo alloc:mem:{} \
         alloc:mem:{}",
        11 * GIB,
        8 * GIB
    );
    let id = c
        .submit_with(
            "ml",
            json!({
                "gpus": 1, "gpu_milli": 300, "gpu_memory_bytes": 10 * GIB,
                "image": format!("{}/ml/probe:1", registry.addr),
                "env": { "LD_LIBRARY_PATH": "/usr/lib/allot-test" },
            }),
            &["sh", "-c", &script],
        )
        .await;
    let job = c.wait_for_end(&id).await;
    let log = c.log_of(&id).await;
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    // The shim, preloaded from the node's read-only mount, reads the limits the agent
    // sealed and passed in (descriptors 3 and 4): the job sees its 10 GiB, less its
    // context, and is refused past it.
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(
        lines,
        [
            "init 0",
            "ctx 0 0",
            &format!("meminfo {} {} 0", 10 * GIB - (512 << 20), 10 * GIB),
            &format!("alloc mem {} err 2", 11 * GIB),
            &format!("alloc mem {} ok 0", 8 * GIB),
        ],
        "{log}"
    );
    c.shutdown().await;
}

/// `--gpus auto:0.6`: Allot sizes the share from what the job does. A busy loop wanting all
/// of the GPU starts at its tenant's default share (a tenth of a GPU), held to it (strict,
/// as asked) is held back by the shim's pacer, and is grown at once (to its ceiling, never
/// above); idle, it is shrunk, a step at a time. Each resize is
/// in the job's history and the audit log with its reason and figures, made by the sizing
/// and not a person. A job on a fixed share doing the same is left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_sized_job_grows_when_held_back_and_shrinks_when_idle() {
    let kit = kit();
    let (c, _dir, stop) = cluster(under_the_shim(kit)).await;
    let busy_then_idle = format!(
        "ALLOT_FAKE_CUDA_UUIDS=$ALLOT_GPU_UUIDS {} direct ctx:0 duty:1000:0:12; sleep 120",
        kit.probe.display()
    );
    let env = json!({ "LD_LIBRARY_PATH": kit.driver_dir.display().to_string() });
    let auto = c
        .submit_with(
            "ml",
            json!({
                "gpu_sizing": { "compute": true, "max_milli": 600 },
                "gpu_compute": "strict", "env": env,
            }),
            &["sh", "-c", &busy_then_idle],
        )
        .await;
    let fixed = c
        .submit_with(
            "ml",
            json!({ "gpus": 1, "gpu_milli": 150, "env": env }),
            &["sh", "-c", &busy_then_idle],
        )
        .await;
    // A job that never touches its GPU: it used nothing, and is shrunk.
    let idle = c
        .submit_with(
            "ml",
            json!({ "gpu_sizing": { "compute": true }, "env": env }),
            &["sleep", "120"],
        )
        .await;
    let job = c.wait_for_state(&auto, "running").await;
    assert_eq!(
        job["gpu_milli"], 100,
        "it starts at the platform's default share: {job}"
    );
    assert_eq!(
        job["gpu_sizing"]["memory"], true,
        "its memory is sized with it: {job}"
    );
    let path = format!("/api/v1/jobs/{auto}");
    let grown = c
        .eventually("the held-back job grown", || async {
            let (_, j) = c.get(&path).await;
            (j["held_gpu_milli"] == 600).then_some(j)
        })
        .await;
    // Idle after 12 s busy: a window of idle samples, the shrink's wait and the held-back
    // share's memory (seconds, at this test's time scale) before the first step down.
    let shrunk = c
        .eventually_within(
            "the idle job shrunk",
            std::time::Duration::from_secs(90),
            || async {
                let (_, j) = c.get(&path).await;
                j["held_gpu_milli"]
                    .as_u64()
                    .is_some_and(|m| m < 600)
                    .then_some(j)
            },
        )
        .await;
    assert!(shrunk["gpu_memory_bytes"].as_u64().is_some(), "{shrunk}");
    let events = |j: &serde_json::Value| -> Vec<String> {
        j["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["message"].as_str().map(str::to_owned))
            .filter(|m| m.starts_with("resized"))
            .collect()
    };
    let history = events(&shrunk);
    assert!(
        history
            .first()
            .is_some_and(|m| m.contains("held back") && m.contains("0.100 → ")),
        "{history:?} ({grown})"
    );
    assert!(
        history.iter().any(|m| m.contains("well below its share")),
        "{history:?}"
    );
    // Never above its ceiling, in any resize.
    let (_, tenant) = c.get("/api/v1/tenants/ml").await;
    let log = c.audit_log(tenant["id"].as_str().expect("tenant id")).await;
    let resizes: Vec<_> = log
        .iter()
        .filter(|e| e.action == "job.resize" && e.target == format!("job/{auto}"))
        .collect();
    assert!(resizes.len() >= 2, "{resizes:?}");
    for e in &resizes {
        assert_eq!(e.actor.id, "sizing", "{e:?}");
        assert!(
            e.reason.as_deref().is_some_and(|r| r.contains("samples")),
            "{e:?}"
        );
        let milli = e.after.as_ref().and_then(|a| a["gpu_milli"].as_u64());
        assert!(milli.is_some_and(|m| m <= 600), "{e:?}");
    }
    // The negative control: a fixed share is never resized, however held back.
    let (_, fixed) = c.get(&format!("/api/v1/jobs/{fixed}")).await;
    assert!(events(&fixed).is_empty(), "{fixed}");
    assert_eq!(fixed["held_gpu_milli"], 150, "{fixed}");
    let idle_path = format!("/api/v1/jobs/{idle}");
    c.eventually("the job that never used its GPU shrunk", || async {
        let (_, j) = c.get(&idle_path).await;
        j["held_gpu_milli"]
            .as_u64()
            .is_some_and(|m| m < 100)
            .then_some(())
    })
    .await;
    stop.cancel();
    c.shutdown().await;
}
