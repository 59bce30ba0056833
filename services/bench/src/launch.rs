//! `allot bench launch`: how long the agent takes from an assignment's arrival to the job's
//! process running, with the `process` runtime and with the `oci` runtime (runc, the image
//! in the node's cache), side by side in one run.
//!
//! Each launch is timed from the moment the agent hands the attempt to its runtime (what it
//! does when a `Launch` arrives, after checking it) to the moment the runtime says the job's
//! process runs (`Started`): for a process, once it is spawned; for a container, once runc
//! has exec'd its first process and written its pid. Under `oci` that includes asking the
//! registry for the manifest (the cache serves the blobs), writing the bundle and runc's own
//! work; a container with its own network (`--network private`, the default) also waits for
//! its namespace, link, addresses, routes and the agent's nftables table, which a container
//! with `--network none` (an empty namespace runc makes) does not. The three alternate, so
//! all see the same machine.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_agent::image::local::{BUSYBOX, LocalRegistry};
use allot_agent::runtime::oci::{OciConfig, OciRuntime};
use allot_agent::runtime::process::ProcessRuntime;
use allot_agent::runtime::{JobRuntime, LaunchSpec, Network, Outcome, StopSignal, joblog};
use anyhow::Context;
use clap::Args;

use crate::harness::percentile;

#[derive(Debug, Args)]
pub struct LaunchBench {
    /// Launches measured per runtime.
    #[arg(long, default_value_t = 50)]
    launches: usize,
    /// The added median the oci runtime (with the job's own network) may cost over the
    /// process runtime, in milliseconds (the run fails past it).
    #[arg(long, default_value_t = 150.0)]
    target_ms: f64,
    /// One line of JSON instead of indented output.
    #[arg(long)]
    json: bool,
}

fn spec(job: usize, image: Option<String>, network: Network) -> LaunchSpec {
    LaunchSpec {
        job_id: format!("bench-{job}"),
        job_name: "bench".into(),
        tenant: "bench".into(),
        node_name: "bench".into(),
        command: vec!["true".into()],
        env: Default::default(),
        workdir: None,
        gpu_uuids: Vec::new(),
        gpus: Vec::new(),
        attempt: 1,
        gpu_milli: 1000,
        gpu_memory_bytes: 0,
        cpu_milli: 500,
        memory_bytes: 256 << 20,
        image,
        pull_credentials: None,
        network,
        network_policy: Some(Default::default()),
        gang: None,
        node_address: String::new(),
        checkpoint_dir: None,
        volumes: Vec::new(),
        secrets: Vec::new(),
        uid_slot: Some(0),
        inherit_fds: Vec::new(),
        preload: None,
    }
}

/// One launch: milliseconds from hand-over to running.
async fn launch(
    runtime: &dyn JobRuntime,
    dir: &Path,
    job: usize,
    image: Option<String>,
    network: Network,
) -> anyhow::Result<f64> {
    let stop = StopSignal::default();
    let log = joblog::path(dir, &format!("bench-{job}"), 1);
    let t0 = Instant::now();
    let mut running = None;
    let done = allot_agent::runtime::supervise(
        runtime,
        spec(job, image, network),
        log,
        &stop,
        Duration::from_secs(1),
        |_| running = Some(Instant::now()),
    )
    .await;
    match (done.outcome, running) {
        (Outcome::Succeeded, Some(at)) => Ok((at - t0).as_secs_f64() * 1e3),
        (other, _) => anyhow::bail!(
            "launch {job} with {} did not run: {other:?} {}",
            runtime.kind().as_str(),
            done.log_tail
        ),
    }
}

fn summary(mut ms: Vec<f64>) -> serde_json::Value {
    ms.sort_by(f64::total_cmp);
    serde_json::json!({
        "launches": ms.len(),
        "median_ms": percentile(&ms, 0.5),
        "p99_ms": percentile(&ms, 0.99),
        "max_ms": ms.last().copied().unwrap_or(0.0),
    })
}

pub async fn run(args: &LaunchBench) -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "allot bench launch runs containers: run it as root"
    );
    anyhow::ensure!(args.launches > 0, "--launches must be at least 1");
    let dir = tempfile::tempdir().context("temp dir")?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
    }
    let registry = LocalRegistry::start(&dir.path().join("registry"))
        .context("starting docker-registry (Debian package docker-registry)")?;
    anyhow::ensure!(
        Path::new(BUSYBOX).is_file(),
        "{BUSYBOX} is missing (Debian package busybox-static)"
    );
    registry.push_busybox("bench/busybox:1").await?;
    let image = format!("{}/bench/busybox:1", registry.addr);
    let process_dir = dir.path().join("process");
    let oci_dir = dir.path().join("oci");
    let process: Arc<dyn JobRuntime> = Arc::new(ProcessRuntime::new(&process_dir));
    let mut cfg = OciConfig::discover(None).map_err(anyhow::Error::msg)?;
    cfg.registries.insecure = vec![registry.addr.clone()];
    std::fs::create_dir_all(&oci_dir)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&oci_dir, std::fs::Permissions::from_mode(0o711))?;
    }
    let oci: Arc<dyn JobRuntime> =
        Arc::new(OciRuntime::new(&oci_dir, "bench", cfg.clone()).map_err(anyhow::Error::msg)?);
    oci.prepare().await.map_err(anyhow::Error::msg)?;
    let measured = measure(
        args.launches,
        &process,
        &process_dir,
        &oci,
        &oci_dir,
        &image,
    )
    .await;
    // What the runtimes keep for their jobs (the container runtime's parent cgroup and job
    // networks) goes, whatever the measurement did.
    oci.shut_down().await;
    process.shut_down().await;
    let (p, private, none) = measured?;
    let process = summary(p);
    let oci_summary = summary(private);
    let none_summary = summary(none);
    let median = |v: &serde_json::Value| v["median_ms"].as_f64().unwrap_or(0.0);
    let added = median(&oci_summary) - median(&process);
    let out = serde_json::json!({
        "process": process,
        "oci": oci_summary,
        "oci_network_none": none_summary,
        "oci_runtime": cfg.runtime.display().to_string(),
        "cgroups": allot_agent::runtime::cgroup::Hierarchy::detect().name(),
        "oci_added_median_ms": added,
        "network_added_median_ms": median(&oci_summary) - median(&none_summary),
        "target_added_median_ms": args.target_ms,
        "met": added <= args.target_ms,
    });
    crate::harness::print(&out, args.json)?;
    anyhow::ensure!(
        added <= args.target_ms,
        "oci added {added:.1} ms at the median, over the {} ms target",
        args.target_ms
    );
    Ok(())
}

/// Warms each up, then times `launches` launches of each: a process, a container with its
/// own network and one with none, taking turns (which goes first rotates).
async fn measure(
    launches: usize,
    process: &Arc<dyn JobRuntime>,
    process_dir: &Path,
    oci: &Arc<dyn JobRuntime>,
    oci_dir: &Path,
    image: &str,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let image = || Some(image.to_owned());
    // Warm the image cache (and the page cache) before measuring.
    launch(oci.as_ref(), oci_dir, 0, image(), Network::Private).await?;
    launch(process.as_ref(), process_dir, 0, None, Network::Host).await?;
    let (mut p, mut private, mut none) = (Vec::new(), Vec::new(), Vec::new());
    for i in 1..=launches {
        for turn in 0..3 {
            match (i + turn) % 3 {
                0 => p.push(launch(process.as_ref(), process_dir, i, None, Network::Host).await?),
                1 => {
                    private.push(launch(oci.as_ref(), oci_dir, i, image(), Network::Private).await?)
                }
                _ => none.push(
                    // Another job id: the same attempt twice would be a replayed launch.
                    launch(oci.as_ref(), oci_dir, launches + i, image(), Network::None).await?,
                ),
            }
        }
    }
    Ok((p, private, none))
}
