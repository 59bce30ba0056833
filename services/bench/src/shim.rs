//! `allot bench shim`: what the GPU-sharing shim adds to each call it intercepts.
//!
//! The C probe (`agent/shim/probe/probe.c`, built here with the system C compiler) calls
//! the fake CUDA driver in tight loops: 1000 allocations then 1000 frees, and 1000
//! zero-length kernel launches, 200 times, keeping the fastest pass (the cost without
//! scheduler noise). It runs alternately without the shim and with it preloaded, `rounds`
//! times each; the figures are medians over rounds, and the added cost is the difference of
//! the medians.

use std::path::{Path, PathBuf};
use std::process::Command;

use allot_shim_core::{ComputeMode, GpuGrant, JobRegion, pacer};
use anyhow::{Context, bail};
use serde_json::json;

#[derive(Debug, clap::Args)]
pub struct ShimBench {
    /// The shim (default: liballot_shim.so next to this executable).
    #[arg(long)]
    shim: Option<PathBuf>,
    /// The fake CUDA driver (default: liballot_fake_cuda.so next to this executable).
    #[arg(long)]
    driver: Option<PathBuf>,
    /// Rounds: each runs the probe once without and once with the shim.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// One line of JSON.
    #[arg(long)]
    json: bool,
}

fn beside_exe(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    Ok(exe.with_file_name(name))
}

/// The uuid the fake driver gives its device 0.
const FAKE_GPU: &str = "GPU-fa000000-0000-0000-0000-000000000000";

/// Per-call nanoseconds the probe printed: alloc, free, launch.
fn run_probe(
    probe: &allot_shim_core::probe::Probe,
    preload: Option<(&Path, &JobRegion)>,
) -> anyhow::Result<[f64; 3]> {
    let mut cmd = Command::new(&probe.program);
    cmd.args(["direct", "ctx:0", "bench:alloc:1000", "bench:launch:1000"])
        .env_clear()
        .env("LD_LIBRARY_PATH", &probe.driver_dir);
    if let Some((shim, region)) = preload {
        cmd.env("LD_PRELOAD", shim);
        region.pass_to(&mut cmd);
    }
    let out = cmd.output().context("running the probe")?;
    if !out.status.success() {
        bail!(
            "the probe failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let numbers = |prefix: &str| -> Vec<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    match (
        numbers("bench alloc ").as_slice(),
        numbers("bench launch ").as_slice(),
    ) {
        ([alloc, free], [launch]) => Ok([*alloc, *free, *launch]),
        _ => bail!("unexpected probe output: {text}"),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn region(compute_milli: u32) -> anyhow::Result<JobRegion> {
    let region = JobRegion::create(
        "bench",
        &[GpuGrant {
            uuid: FAKE_GPU.to_owned(),
            memory_limit: 64 << 30,
            compute_milli,
            mode: ComputeMode::Strict,
        }],
        0,
    )?;
    Ok(region)
}

pub fn run(args: &ShimBench) -> anyhow::Result<()> {
    let shim = match &args.shim {
        Some(p) => p.clone(),
        None => beside_exe("liballot_shim.so")?,
    };
    let driver = match &args.driver {
        Some(p) => p.clone(),
        None => beside_exe("liballot_fake_cuda.so")?,
    };
    for (what, path) in [("--shim", &shim), ("--driver", &driver)] {
        if !path.is_file() {
            bail!(
                "{what}: {} not found (build it: cargo build --release -p allot-shim -p allot-fake-cuda)",
                path.display()
            );
        }
    }
    let dir = tempfile::tempdir()?;
    let probe = allot_shim_core::probe::build(&driver, dir.path()).map_err(anyhow::Error::msg)?;
    // No limits to speak of: a whole share (launches counted, never paced) and 64 GiB.
    let unlimited = region(1000)?;
    // A paced share whose rate never makes a launch wait: the pacer's full path.
    let paced = region(500)?;
    if let Some(usage) = paced.usage(0) {
        pacer::set_rate(usage, 1e12);
    }
    let mut without = [Vec::new(), Vec::new(), Vec::new()];
    let mut with = [Vec::new(), Vec::new(), Vec::new()];
    let mut paced_launch = Vec::new();
    for _ in 0..args.rounds.max(1) {
        let bare = run_probe(&probe, None)?;
        let shimmed = run_probe(&probe, Some((&shim, &unlimited)))?;
        let throttled = run_probe(&probe, Some((&shim, &paced)))?;
        for i in 0..3 {
            without[i].push(bare[i]);
            with[i].push(shimmed[i]);
        }
        paced_launch.push(throttled[2]);
    }
    let case = |i: usize| {
        let (w, s) = (median(without[i].clone()), median(with[i].clone()));
        json!({ "without_ns": round(w), "with_ns": round(s), "added_ns": round(s - w) })
    };
    let bare_launch = median(without[2].clone());
    let paced = median(paced_launch);
    let out = json!({
        "rounds": args.rounds.max(1),
        "calls": {
            "cuMemAlloc_v2": case(0),
            "cuMemFree_v2": case(1),
            "cuLaunchKernel": case(2),
            "cuLaunchKernel_paced": {
                "without_ns": round(bare_launch),
                "with_ns": round(paced),
                "added_ns": round(paced - bare_launch),
            },
        },
        "target_added_ns": 50,
    });
    crate::harness::print(&out, args.json)
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
