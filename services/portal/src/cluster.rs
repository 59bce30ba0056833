//! The cluster page's summary: nodes by state, GPUs by model (held, free, unhealthy) and a
//! heatmap of every GPU's share held, with who holds each part; the per-node details below
//! it are on demand.

use allot_domain::{Job, Node, format_milli};

/// A node's one state: `ready`, `cordoned` (ready, taking no new work) or `not-ready`.
pub(crate) fn node_state(status: &str, cordoned: bool) -> &'static str {
    match (status, cordoned) {
        ("ready", false) => "ready",
        ("ready", true) => "cordoned",
        _ => "not-ready",
    }
}

pub(crate) struct Summary {
    pub ready: usize,
    pub cordoned: usize,
    pub not_ready: usize,
    pub models: Vec<ModelRow>,
    pub heat: Vec<HeatRow>,
}

pub(crate) struct ModelRow {
    pub model: String,
    pub gpus: usize,
    /// GPUs' worth held by jobs, e.g. `12.5`.
    pub held: String,
    pub held_pct: u64,
    /// Healthy GPUs nothing holds, on ready nodes that take work.
    pub free: usize,
    /// Unhealthy, draining or degraded.
    pub unwell: usize,
}

pub(crate) struct HeatRow {
    pub node_id: String,
    pub name: String,
    pub state: &'static str,
    pub cells: Vec<HeatCell>,
}

pub(crate) struct HeatCell {
    /// How much of it is held: 0 (nothing), 1 (up to a quarter), 2 (up to half), 3 (more),
    /// 4 (all).
    pub level: u8,
    pub health: &'static str,
    /// In words: the GPU, how much is held, and by which jobs of which tenants.
    pub title: String,
}

/// `nodes` (with their `status`: ready or not) and the jobs holding GPUs, summed up.
pub(crate) fn summary(nodes: &[(Node, String)], holding: &[Job]) -> Summary {
    let mut s = Summary {
        ready: 0,
        cordoned: 0,
        not_ready: 0,
        models: Vec::new(),
        heat: Vec::new(),
    };
    let mut models: std::collections::BTreeMap<String, (usize, u64, usize, usize)> =
        std::collections::BTreeMap::new();
    for (n, status) in nodes {
        let state = node_state(status, n.cordoned);
        match state {
            "ready" => s.ready += 1,
            "cordoned" => s.cordoned += 1,
            _ => s.not_ready += 1,
        }
        let mut cells = Vec::new();
        for g in &n.gpus {
            let on = g.holders(holding);
            let held: u64 = on.iter().map(|(_, m)| m).sum::<u64>().min(1000);
            let health = g.health(n.drained_gpus.contains(&g.uuid));
            let m = models.entry(g.model.clone()).or_default();
            m.0 += 1;
            m.1 += held;
            if health == "healthy" && held == 0 && state == "ready" {
                m.2 += 1;
            }
            if health != "healthy" {
                m.3 += 1;
            }
            let level = match held {
                0 => 0,
                1..=250 => 1,
                251..=500 => 2,
                501..=999 => 3,
                _ => 4,
            };
            let who = on
                .iter()
                .map(|(j, m)| format!("{} of {}: {}", j.spec.name, j.spec.tenant, format_milli(*m)))
                .collect::<Vec<_>>();
            let title = format!(
                "{} GPU {} ({}, {health}): {} held{}",
                n.name,
                g.index,
                g.model,
                format_milli(held),
                if who.is_empty() {
                    String::new()
                } else {
                    format!(" by {}", who.join(", "))
                }
            );
            cells.push(HeatCell {
                level,
                health,
                title,
            });
        }
        s.heat.push(HeatRow {
            node_id: n.id.clone(),
            name: n.name.clone(),
            state,
            cells,
        });
    }
    s.models = models
        .into_iter()
        .map(|(model, (gpus, held, free, unwell))| ModelRow {
            model,
            gpus,
            held: format_milli(held),
            held_pct: held * 100 / (gpus as u64 * 1000).max(1),
            free,
            unwell,
        })
        .collect();
    s
}
