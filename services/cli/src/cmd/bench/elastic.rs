//! `allot bench elastic`: exclusive allocation, static sharing and elastic sharing with
//! forecasting, side by side on the same simulated fleet and load (see `allot_elastic::sim`).

use std::path::PathBuf;

use allot_elastic::{ElasticPolicy, SimConfig, simulate};
use anyhow::Context;
use clap::Args;

#[derive(Debug, Args)]
pub struct ElasticBench {
    /// Simulated hours (after two days of history the forecaster is fitted on).
    #[arg(long, default_value_t = 72)]
    hours: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The elastic share policy (default: the shipped policies/elastic.toml).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Nodes of 8 GPUs.
    #[arg(long, default_value_t = 16)]
    nodes: u32,
    /// One line of JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &ElasticBench) -> anyhow::Result<()> {
    if !(1..=24 * 60).contains(&args.hours) {
        anyhow::bail!("--hours must be from 1 to 1440");
    }
    if !(1..=1000).contains(&args.nodes) {
        anyhow::bail!("--nodes must be from 1 to 1000");
    }
    let policy = match &args.policy {
        Some(p) => ElasticPolicy::parse(
            &std::fs::read_to_string(p).with_context(|| format!("--policy {}", p.display()))?,
        )?,
        None => ElasticPolicy::builtin()?,
    };
    let mut cfg = SimConfig::new(args.hours, args.seed);
    // The load scales with the fleet (the defaults are sized for 16 nodes).
    cfg.peak_rps *= f64::from(args.nodes) / f64::from(cfg.nodes);
    cfg.nodes = args.nodes;
    let started = std::time::Instant::now();
    let report = simulate(&cfg, &policy);
    let mut out = serde_json::to_value(&report)?;
    if let Some(o) = out.as_object_mut() {
        o.insert("wall_s".into(), started.elapsed().as_secs_f64().into());
    }
    super::print(&out, args.json)
}
