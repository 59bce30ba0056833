//! The cluster page's summary: nodes by state, GPUs by model (held, free, unhealthy) and a
//! heatmap of every GPU's share held, with who holds each part; the per-node details below
//! it are on demand.

use allot_domain::{GpuParts, Job, Node, NodeStatus};

/// A node's one state: `ready`, `cordoned` (ready, taking no new work), `draining` (an
/// operator drained it and jobs still run there: `holding` are the jobs holding capacity),
/// `drained` (nothing runs there any more) or `not-ready`.
pub(crate) fn node_state(n: &Node, status: NodeStatus, holding: &[Job]) -> &'static str {
    match (status, n.cordoned, &n.drain) {
        (NodeStatus::Ready, _, Some(_)) => {
            if holding
                .iter()
                .any(|j| j.node_id.as_deref() == Some(n.id.as_str()))
            {
                "draining"
            } else {
                "drained"
            }
        }
        (NodeStatus::Ready, false, None) => "ready",
        (NodeStatus::Ready, true, None) => "cordoned",
        (NodeStatus::NotReady, _, _) => "not-ready",
    }
}

/// The states [`node_state`] says.
pub(crate) const NODE_STATES: [&str; 5] = ["ready", "cordoned", "draining", "drained", "not-ready"];

pub(crate) struct Summary {
    pub ready: usize,
    pub cordoned: usize,
    /// Draining or drained by an operator.
    pub drained: usize,
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
    /// GPUs' worth new work could take: the unheld part of healthy GPUs on ready nodes
    /// that take work.
    pub free: String,
    /// GPUs' worth neither held nor free (unwell, draining, or on nodes taking no work).
    pub unavailable: String,
    /// Unhealthy or degraded GPUs.
    pub unwell: usize,
    /// GPUs an operator drained.
    pub drained: usize,
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

/// `nodes` (with their `status`: ready or not) and the jobs holding GPUs, summed up: per
/// model, held + free + unavailable is the model's GPUs exactly.
pub(crate) fn summary(nodes: &[(Node, NodeStatus)], holding: &[Job]) -> Summary {
    let mut s = Summary {
        ready: 0,
        cordoned: 0,
        drained: 0,
        not_ready: 0,
        models: Vec::new(),
        heat: Vec::new(),
    };
    #[derive(Default)]
    struct Model {
        gpus: usize,
        held: GpuParts,
        free: GpuParts,
        unavailable: GpuParts,
        unwell: usize,
        drained: usize,
    }
    let mut models: std::collections::BTreeMap<String, Model> = std::collections::BTreeMap::new();
    for (n, status) in nodes {
        let state = node_state(n, *status, holding);
        match state {
            "ready" => s.ready += 1,
            "cordoned" => s.cordoned += 1,
            "draining" | "drained" => s.drained += 1,
            _ => s.not_ready += 1,
        }
        let open = state == "ready";
        let mut cells = Vec::new();
        for g in &n.gpus {
            let on = g.holding(holding);
            let health = g.health(n.drained_gpus.contains(&g.uuid));
            let m = models.entry(g.model.clone()).or_default();
            m.gpus += 1;
            m.held += on.held;
            if open && health == "healthy" {
                m.free += on.free;
            } else {
                m.unavailable += on.free;
            }
            // A GPU an operator drained is not unwell: it is counted apart.
            match health {
                "healthy" => {}
                "draining" => m.drained += 1,
                _ => m.unwell += 1,
            }
            let quarters = on.held.0 * 4 / GpuParts::GPU.0;
            let level = match (on.held.is_zero(), quarters) {
                (true, _) => 0,
                (false, 0) => 1,
                (false, 1) => 2,
                (false, 2 | 3) => 3,
                _ => 4,
            };
            let who = on
                .jobs
                .iter()
                .map(|(j, p)| format!("{} of {}: {p}", j.spec.name, j.spec.tenant))
                .collect::<Vec<_>>();
            let title = format!(
                "{} GPU {} ({}, {health}): {} held{}",
                n.name,
                g.index,
                g.model,
                on.held,
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
        .map(|(model, m)| ModelRow {
            held_pct: m.held.0 * 100 / (m.gpus as u64 * GpuParts::GPU.0).max(1),
            model,
            gpus: m.gpus,
            held: m.held.to_string(),
            free: m.free.to_string(),
            unavailable: m.unavailable.to_string(),
            unwell: m.unwell,
            drained: m.drained,
        })
        .collect();
    s
}
