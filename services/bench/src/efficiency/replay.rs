//! `allot bench efficiency --demand …`: a fleet's demand replayed, each mode on a fresh
//! fleet — **exclusive** (every service on a whole GPU), **static** (at the share its
//! owner asked for, packed by the scheduler) and **auto** (`--gpus auto`: Allot sizes it) —
//! with a best-effort training backlog queued behind them. The control plane is told only
//! what the mode submits; every figure is measured: GPUs hosting services from where the
//! API says the services run (sampled each second), busy time from the fake driver's own
//! accounting, latencies at the client from each request's scheduled send, resizes and
//! restarts from the jobs' histories.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, bail};
use reqwest::Method;
use serde_json::{Value, json};

use super::demand::Demand;
use super::fleet::Fleet;
use super::{EfficiencyBench, Mode};

/// One mode's replay of `demand`, `time_scale` times faster than it was recorded.
pub async fn drive(
    args: &EfficiencyBench,
    fleet: &Fleet,
    mode: Mode,
    demand: &Demand,
    time_scale: f64,
) -> anyhow::Result<Value> {
    let keys: Vec<String> = demand.services.iter().map(|s| s.name.clone()).collect();
    let mut ids = Vec::new();
    for s in &demand.services {
        let body_extra = match mode {
            Mode::Exclusive => json!({}),
            Mode::Static => {
                let milli = (s.requested_gpus * 1000.0).round().clamp(1.0, 1000.0) as u32;
                if milli >= 1000 {
                    json!({})
                } else {
                    json!({
                        "gpu_milli": milli, "gpu_compute": "strict",
                        "gpu_memory_bytes": s.gpu_memory_bytes.unwrap_or(4 << 30),
                    })
                }
            }
            // With sizing off, Allot decides nothing: each service starts at, and keeps,
            // the share its owner asked for (what static runs at), so what auto adds over
            // static shows as the sizing's alone.
            Mode::Auto if args.sizing == super::SizingRules::Off => {
                let milli = (s.requested_gpus * 1000.0).round().clamp(20.0, 1000.0) as u32;
                if milli >= 1000 {
                    json!({})
                } else {
                    json!({
                        "gpu_sizing": { "compute": true, "memory": true },
                        "gpu_compute": args.sized_compute,
                        "gpu_milli": milli,
                    })
                }
            }
            Mode::Auto => json!({
                "gpu_sizing": { "compute": true, "memory": true },
                "gpu_compute": args.sized_compute,
            }),
            Mode::Elastic => bail!("a demand replay runs exclusive, static and auto"),
        };
        ids.push(
            fleet
                .submit_service_with(&s.name, body_extra, &args.serve_args())
                .await?,
        );
    }
    let ports = super::wait_for_ports(fleet, &keys).await?;
    // The backlog: a best-effort training loop per GPU, on what the services leave (in
    // every mode, wherever a mode's services leave room).
    let training = fleet.submit_backlog(&args.train_args(), true).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let replay = Duration::from_secs_f64(demand.span / time_scale);
    let requests = demand.requests(time_scale, args.request_cost_s(), args.seed);
    let start = tokio::time::Instant::now() + Duration::from_secs(1);
    let load = super::start_requests(fleet, &keys, &ports, requests, start, replay).await?;
    tokio::time::sleep_until(start).await;
    let (busy0, work0) = (fleet.busy_ns(), fleet.training_work());
    // Each second: which GPUs host services (as the API says), and their busy time since.
    let mut hosting_counts = Vec::new();
    let mut hosting_busy_s = 0.0;
    let mut hosting_gpu_s = 0.0;
    let mut last_busy = busy0.clone();
    let mut last_at = tokio::time::Instant::now();
    let mut hosting: BTreeSet<String> = BTreeSet::new();
    while tokio::time::Instant::now() < start + replay {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = tokio::time::Instant::now();
        let busy = fleet.busy_ns();
        let dt = now.duration_since(last_at).as_secs_f64();
        for g in &hosting {
            let d = busy
                .get(g)
                .copied()
                .unwrap_or(0)
                .saturating_sub(last_busy.get(g).copied().unwrap_or(0));
            hosting_busy_s += d as f64 / 1e9;
            hosting_gpu_s += dt;
        }
        hosting = service_gpus(&fleet.jobs().await?);
        hosting_counts.push(hosting.len() as f64);
        (last_busy, last_at) = (busy, now);
    }
    let (busy1, work1) = (fleet.busy_ns(), fleet.training_work());
    let outcome = load.await.context("the load generator")?;
    let window_s = replay.as_secs_f64();
    let (busy_s, _) = super::busy_total(&busy0, &busy1);
    let (resizes, moves) = histories(fleet, &ids).await?;
    let best_effort = super::work_between(&work0, &work1);
    let _ = super::stop_training(fleet, &training).await?;
    fleet.cancel_all(&ids).await?;

    let mean = if hosting_counts.is_empty() {
        0.0
    } else {
        hosting_counts.iter().sum::<f64>() / hosting_counts.len() as f64
    };
    let peak = hosting_counts.iter().copied().fold(0.0, f64::max);
    let latency = super::latency_report(&outcome, args.slo_ms);
    let over = outcome
        .latencies_ms
        .iter()
        .filter(|(_, ms)| *ms > args.slo_ms)
        .count();
    // When requests went over the objective: each ten seconds of the replay.
    let mut over_each_10s = vec![0u64; (window_s / 10.0).ceil() as usize + 1];
    for (at, ms) in &outcome.latencies_ms {
        if *ms > args.slo_ms
            && let Some(n) = over_each_10s.get_mut((at.as_secs_f64() / 10.0) as usize)
        {
            *n += 1;
        }
    }
    Ok(json!({
        "gpus_hosting_services_mean": mean,
        "gpus_hosting_services_peak": peak,
        "fleet_busy": busy_s / (window_s * fleet.gpus.len() as f64),
        "hosting_busy": if hosting_gpu_s > 0.0 { hosting_busy_s / hosting_gpu_s } else { 0.0 },
        "services_per_gpu": if mean > 0.0 { demand.services.len() as f64 / mean } else { 0.0 },
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        "p999_ms": latency["p99_9"],
        "over_100ms": over,
        "over_100ms_each_10s": over_each_10s,
        "requests": latency["requests"],
        // Requests over the objective, lost and refused among them, of all requests sent:
        // what "99.9% under 100 ms" is about (p99.9 is of the answered ones).
        "over_slo_share": latency["over_slo_share"],
        "lost": outcome.lost,
        "refused": outcome.refused,
        "best_effort_kernel_s_per_s": best_effort / window_s,
        "resizes": resizes,
        "moves": moves,
        "replay_secs": window_s,
        // GPUs hosting services, each second of the replay.
        "gpus_hosting_services_each_s": hosting_counts,
    }))
}

/// The GPUs running services, as the API lists them.
fn service_gpus(jobs: &[Value]) -> BTreeSet<String> {
    jobs.iter()
        .filter(|j| j["tenant"] == "serving" && j["state"] == "running")
        .flat_map(|j| j["gpu_uuids"].as_array().cloned().unwrap_or_default())
        .filter_map(|g| g.as_str().map(str::to_owned))
        .collect()
}

/// Resizes in the services' histories, and their restarts (attempts after the first).
async fn histories(fleet: &Fleet, ids: &[String]) -> anyhow::Result<(u64, u64)> {
    let (mut resizes, mut moves) = (0, 0);
    for id in ids {
        let job: Value = fleet
            .client
            .call(Method::GET, &format!("/api/v1/jobs/{id}"), None::<&Value>)
            .await?;
        resizes += job["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("resized"))
            })
            .count() as u64;
        moves += job["attempt"].as_u64().unwrap_or(1).saturating_sub(1);
    }
    Ok((resizes, moves))
}

/// The targets, auto against exclusive and static on the same demand: (name, measured,
/// target, met).
pub fn targets(modes: &serde_json::Map<String, Value>) -> Vec<(String, Option<f64>, String, bool)> {
    let f = |m: &str, k: &str| modes.get(m).and_then(|v| v[k].as_f64());
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let mut t = Vec::new();
    let spg = ratio(
        f("auto", "services_per_gpu"),
        f("exclusive", "services_per_gpu"),
    );
    t.push((
        "services_per_gpu_vs_exclusive".into(),
        spg,
        "≥ 5".into(),
        spg.is_some_and(|v| v >= 5.0),
    ));
    let hb = f("auto", "hosting_busy");
    t.push((
        "hosting_busy".into(),
        hb,
        "≥ 0.7".into(),
        hb.is_some_and(|v| v >= 0.7),
    ));
    let fb = f("auto", "fleet_busy");
    t.push((
        "fleet_busy".into(),
        fb,
        "≥ 0.8".into(),
        fb.is_some_and(|v| v >= 0.8),
    ));
    let p = f("auto", "p999_ms");
    t.push((
        "p999_ms".into(),
        p,
        "< 100".into(),
        p.is_some_and(|v| v < 100.0),
    ));
    let lost = match (f("auto", "lost"), f("auto", "refused")) {
        (Some(l), Some(r)) => Some(l + r),
        _ => None,
    };
    t.push((
        "lost_and_refused".into(),
        lost,
        "0".into(),
        lost == Some(0.0),
    ));
    let vs_static = ratio(
        f("auto", "gpus_hosting_services_mean"),
        f("static", "gpus_hosting_services_mean"),
    );
    t.push((
        "hosting_gpus_vs_static".into(),
        vs_static,
        "≤ 0.7".into(),
        vs_static.is_some_and(|v| v <= 0.7),
    ));
    t
}

/// Replays `--demand` in each mode; the report, and whether auto met every target (a run
/// without auto, exclusive or static meets none it cannot be measured against).
pub async fn run(
    args: &EfficiencyBench,
    spec: &str,
    root: &std::path::Path,
) -> anyhow::Result<(Value, bool)> {
    let demand = Demand::load(spec, args.services())?;
    let time_scale = args
        .time_scale
        .unwrap_or_else(|| (demand.span / args.secs as f64).max(1.0));
    if !(time_scale >= 1.0 && time_scale.is_finite()) {
        bail!("--time-scale must be at least 1");
    }
    let kit = super::fleet::Kit::find(root)?;
    let modes = args.modes_or(&[Mode::Exclusive, Mode::Static, Mode::Auto]);
    let mut reports = serde_json::Map::new();
    for mode in modes {
        let dir = root.join(mode.name());
        let mut spec = args.fleet(None);
        spec.sizing_time_scale = time_scale;
        let fleet = Fleet::start(&kit, &dir, &spec).await?;
        let result = drive(args, &fleet, mode, &demand, time_scale).await;
        fleet.stop().await;
        reports.insert(mode.name().into(), result?);
    }
    let targets = targets(&reports);
    let met = reports.contains_key("auto") && targets.iter().all(|(_, _, _, met)| *met);
    let out = json!({
        "scenario": "replay",
        "demand": spec,
        "services": demand.services.len(),
        "demand_span_s": demand.span,
        "time_scale": time_scale,
        "sizing": args.sizing.name(),
        "sized_compute": args.sized_compute,
        // What an oracle knowing every service's demand, moving them for free, would host
        // them on (15% headroom, GPUs filled to 0.9): no scheduler does better.
        "oracle_gpus_hosting_services_mean": demand.oracle_gpus(0.15, 0.9),
        "fleet_gpus": args.fleet_gpus(),
        "max_jobs_per_gpu": super::fleet::MAX_JOBS_PER_GPU,
        "modes": reports,
        "targets": targets.iter().map(|(name, measured, target, met)| {
            (name.clone(), json!({ "measured": measured, "target": target, "met": met }))
        }).collect::<serde_json::Map<_, _>>(),
        "met": met,
    });
    Ok((out, met))
}
