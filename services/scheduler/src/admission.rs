//! Admission: what no node of the fleet and no quota above the tenant could ever give a
//! job, refused at submit (as `sbatch` refuses a request no partition can satisfy) instead
//! of waiting forever. Pure: the job's spec, the tenants and the registered nodes in; the
//! fields at fault, each with the largest the fleet or the quota can give, out.
//!
//! It is lenient where the scheduler might still place the job: every registered node
//! counts, ready or not, cordoned or not (they come back), a node's unknown CPU or memory
//! is unlimited, and a fleet with no nodes yet refuses nothing of the fleet (nodes join
//! later). It refuses only what holds whatever runs: a model no GPU has, more GPUs or GPU
//! memory than any node or GPU has, more CPU or memory than any node with those GPUs offers,
//! a MIG profile no GPU in MIG mode makes, and more than a hard limit of the tenant or a
//! tenant above it allows at once.

use allot_domain::error::Violations;
use allot_domain::quantity::{format_bytes, format_milli};
use allot_domain::{GPU_MILLI, Isolation, JobSpec, Node, Tenant, ValidationError};

const MIB: u64 = 1 << 20;

/// The request in the units the scheduler compares (MiB rounded as it rounds them).
fn mib_up(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

fn mib_down(bytes: u64) -> u64 {
    bytes / MIB
}

/// How the scheduler compares GPU models: case-insensitive and without a leading vendor
/// name, so `h200` accepts a GPU NVML calls `NVIDIA H200`.
pub(crate) fn model_key(model: &str) -> String {
    let m = model.trim();
    let m = m
        .strip_prefix("NVIDIA ")
        .or_else(|| m.strip_prefix("nvidia "))
        .unwrap_or(m);
    m.to_ascii_lowercase()
}

/// A model without surrounding space or a leading vendor name, as [`model_key`] compares.
fn bare_model(model: &str) -> &str {
    let m = model.trim();
    m.strip_prefix("NVIDIA ")
        .or_else(|| m.strip_prefix("nvidia "))
        .unwrap_or(m)
}

/// `model_key(a) == model_key(b)`, without allocating.
fn same_model(a: &str, b: &str) -> bool {
    bare_model(a).eq_ignore_ascii_case(bare_model(b))
}

/// Refuses what `spec` asks and no node of `nodes` or no hard limit on `tenant_id`'s chain
/// in `tenants` could ever give it, naming the field and the most that could be given.
pub fn check(
    spec: &JobSpec,
    tenant_id: &str,
    tenants: &[Tenant],
    nodes: &[Node],
) -> Result<(), ValidationError> {
    let mut v = Violations::default();
    runtime(spec, nodes, &mut v);
    fleet(spec, nodes, &mut v);
    quota(spec, tenant_id, tenants, nodes, &mut v);
    v.into_result()
}

/// A job from an image needs a node that runs containers; one without, a node that runs
/// processes (see [`Node::runs`]).
fn runtime(spec: &JobSpec, nodes: &[Node], v: &mut Violations) {
    let with_image = spec.image.is_some();
    if nodes.is_empty() || nodes.iter().any(|n| n.runs(with_image)) {
        return;
    }
    v.check(
        false,
        "image",
        if with_image {
            "no node runs jobs in containers (agent --runtime oci): every node runs jobs as \
             processes, which cannot run an image"
        } else {
            "every node runs jobs in containers (agent --runtime oci): the job must name an \
             image to run"
        },
    );
}

/// Models as the fleet names them, each once, in the order first seen.
fn fleet_models(nodes: &[Node], in_mig_mode: bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for g in nodes.iter().flat_map(|n| &n.gpus) {
        if g.mig.is_some() == in_mig_mode && !out.iter().any(|m| same_model(m, &g.model)) {
            out.push(g.model.clone());
        }
    }
    out
}

/// The MIG profiles some GPU in MIG mode of the fleet can make, each once, by name.
pub fn mig_profiles(nodes: &[Node]) -> Vec<&'static str> {
    makeable(nodes, |_| true)
}

fn makeable(nodes: &[Node], model_ok: impl Fn(&str) -> bool) -> Vec<&'static str> {
    let mut profiles: Vec<&str> = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .filter(|g| g.mig.is_some() && model_ok(&g.model))
        .filter_map(|g| allot_domain::mig::geometry(&g.model, Some(g.memory_bytes >> 20)))
        .flat_map(|b| b.profiles.iter().map(|p| p.name))
        .collect();
    profiles.sort_unstable();
    profiles.dedup();
    profiles
}

fn fleet(spec: &JobSpec, nodes: &[Node], v: &mut Violations) {
    if nodes.is_empty() {
        return;
    }
    let wanted = &spec.gpu_models;
    let model_ok = |model: &str| wanted.is_empty() || wanted.iter().any(|w| same_model(w, model));
    let of_models = if wanted.is_empty() {
        String::new()
    } else {
        format!(" of model {}", spec.gpu_models.join(" or "))
    };
    // The nodes that have the GPUs asked for; the CPU and memory are looked for on them.
    let eligible: Vec<&Node> = if let Some(profile) = spec.mig_profile.as_deref() {
        let makes = |n: &Node| {
            n.gpus.iter().any(|g| {
                g.mig.is_some()
                    && model_ok(&g.model)
                    && allot_domain::mig::geometry(&g.model, Some(g.memory_bytes >> 20))
                        .is_some_and(|b| b.profile_named(profile).is_some())
            })
        };
        let eligible: Vec<&Node> = nodes.iter().filter(|n| makes(n)).collect();
        if eligible.is_empty() {
            let profiles = makeable(nodes, model_ok);
            let message = if profiles.is_empty() {
                format!(
                    "no GPU{of_models} is in MIG mode, so no node can make {profile} (an \
                     administrator puts a node's GPUs in MIG mode)"
                )
            } else {
                format!(
                    "no GPU{of_models} in MIG mode can make {profile}; the profiles they make: {}",
                    profiles.join(", ")
                )
            };
            v.check(false, "mig_profile", message);
            return;
        }
        eligible
    } else if spec.gpus > 0 {
        // Named only when something is refused.
        let models = || (fleet_models(nodes, false), fleet_models(nodes, true));
        if !wanted.is_empty()
            && !nodes
                .iter()
                .flat_map(|n| &n.gpus)
                .any(|g| model_ok(&g.model))
        {
            let (whole_models, mig_models) = models();
            let has = [whole_models, mig_models].concat();
            let has = if has.is_empty() {
                "the nodes have no GPUs".to_owned()
            } else {
                format!("the nodes have {}", has.join(", "))
            };
            v.check(
                false,
                "gpu_models",
                format!("no node has a GPU{of_models}; {has}"),
            );
            return;
        }
        let whole = |g: &allot_domain::GpuDevice| g.mig.is_none() && model_ok(&g.model);
        let largest = nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .filter(|g| whole(g))
            .map(|g| g.memory_bytes)
            .max();
        let Some(largest) = largest else {
            let (whole_models, mig_models) = models();
            let message = if whole_models.is_empty() && !mig_models.is_empty() {
                format!("every GPU{of_models} is in MIG mode: ask for a MIG profile (mig_profile)")
            } else {
                format!("no node has a GPU{of_models}")
            };
            v.check(false, "gpus", message);
            return;
        };
        let need = spec.gpu_memory_bytes.map_or(0, mib_up);
        if need > mib_down(largest) {
            v.check(
                false,
                "gpu_memory_bytes",
                format!(
                    "no GPU{of_models} has more than {} of memory",
                    format_bytes(largest)
                ),
            );
            return;
        }
        // Per node: the most GPUs of one model with the memory asked for (a job's GPUs are
        // of one model).
        let on = |n: &Node| -> u32 {
            let mut by_model: Vec<(&str, u32)> = Vec::new();
            for g in n
                .gpus
                .iter()
                .filter(|g| whole(g) && mib_down(g.memory_bytes) >= need)
            {
                match by_model.iter_mut().find(|(m, _)| same_model(m, &g.model)) {
                    Some((_, count)) => *count += 1,
                    None => by_model.push((&g.model, 1)),
                }
            }
            by_model.into_iter().map(|(_, c)| c).max().unwrap_or(0)
        };
        let most = nodes.iter().map(on).max().unwrap_or(0);
        if spec.gpus > most {
            let with_memory = spec
                .gpu_memory_bytes
                .map_or(String::new(), |b| format!(" with {} each", format_bytes(b)));
            // GPUs in MIG mode are not whole GPUs: say so where some would have counted.
            let in_mig = |n: &Node| {
                n.gpus
                    .iter()
                    .filter(|g| g.mig.is_some() && model_ok(&g.model))
                    .count()
            };
            let mig = nodes
                .iter()
                .filter(|n| in_mig(n) > 0)
                .max_by_key(|n| (on(n), in_mig(n)))
                .map_or(String::new(), |n| {
                    format!(
                        " outside MIG mode ({} also has {} in MIG mode, which run only jobs \
                         asking for a MIG profile)",
                        n.name,
                        in_mig(n)
                    )
                });
            v.check(
                false,
                "gpus",
                format!(
                    "no node has more than {most} GPUs{of_models}{with_memory}{mig} (a job runs \
                     on one node)"
                ),
            );
            return;
        }
        // A gang of whole GPUs: every replica somewhere at once.
        if spec.replicas > 1 && spec.gpu_milli.is_none_or(|m| m >= 1000) {
            let fit: u64 = nodes.iter().map(|n| u64::from(on(n) / spec.gpus)).sum();
            if u64::from(spec.replicas) > fit {
                v.check(
                    false,
                    "replicas",
                    format!(
                        "the fleet holds at most {fit} replica{} of {} GPUs{of_models} at once \
                         (all of a gang run together)",
                        if fit == 1 { "" } else { "s" },
                        spec.gpus
                    ),
                );
                return;
            }
        }
        nodes.iter().filter(|n| on(n) >= spec.gpus).collect()
    } else {
        nodes.iter().collect()
    };
    let on_them = if spec.gpus > 0 {
        " with the GPUs asked for"
    } else {
        ""
    };
    // The most any eligible node offers of one resource; 0 (the agent did not say) is
    // taken as unlimited.
    let most = |offer: fn(&Node) -> u64| {
        eligible
            .iter()
            .map(|n| match offer(n) {
                0 => u64::MAX,
                o => o,
            })
            .max()
            .unwrap_or(0)
    };
    let most_cpu = most(|n| n.cpu_milli);
    v.check(
        u64::from(spec.cpu_milli) <= most_cpu,
        "cpu_milli",
        format!(
            "no node{on_them} offers more than {} CPUs",
            format_milli(most_cpu)
        ),
    );
    let most_memory = most(|n| n.memory_bytes);
    v.check(
        mib_up(spec.memory_bytes) <= mib_down(most_memory),
        "memory_bytes",
        format!(
            "no node{on_them} offers more than {} of memory",
            format_bytes(most_memory)
        ),
    );
}

/// The tenant and every tenant above it, nearest first.
fn chain<'t>(tenant_id: &str, tenants: &'t [Tenant]) -> Vec<&'t Tenant> {
    let mut out: Vec<&Tenant> = Vec::new();
    let mut next = Some(tenant_id);
    while let Some(id) = next {
        let Some(t) = tenants.iter().find(|t| t.id == id) else {
            break;
        };
        if out.iter().any(|o| o.id == t.id) || out.len() > tenants.len() {
            break;
        }
        out.push(t);
        next = t.parent_id.as_deref();
    }
    out
}

fn quota(spec: &JobSpec, tenant_id: &str, tenants: &[Tenant], nodes: &[Node], v: &mut Violations) {
    let chain = chain(tenant_id, tenants);
    let Some(own) = chain.first() else {
        return;
    };
    let whose = |t: &Tenant| {
        if t.id == own.id {
            format!("tenant `{}`", t.name)
        } else {
            format!("tenant `{}` (which `{}` is part of)", t.name, own.name)
        }
    };
    if let Some(profile) = spec.mig_profile.as_deref() {
        for t in &chain {
            let none = t
                .quota
                .mig_limits
                .iter()
                .any(|(p, max)| p.eq_ignore_ascii_case(profile.trim()) && *max == 0);
            if none {
                v.check(
                    false,
                    "mig_profile",
                    format!(
                        "{} may hold no {profile} instance (its limit is 0)",
                        whose(t)
                    ),
                );
                return;
            }
        }
        // A MIG job counts against its profile's limits only.
        return;
    }
    let level = chain.iter().map(|t| t.quota.min_isolation).fold(
        spec.isolation
            .or(spec
                .class
                .map(allot_domain::WorkloadClass::default_isolation))
            .unwrap_or_default(),
        Isolation::max,
    );
    let share = if spec.gpus == 0 {
        0
    } else if level == Isolation::Dedicated {
        GPU_MILLI
    } else {
        spec.gpu_milli.unwrap_or(GPU_MILLI)
    };
    // A gang holds what it asks for once per replica; a whole GPU all of its memory (at
    // least the smallest the job could be given, of a model it accepts).
    let n = u64::from(spec.replicas.max(1));
    let gpus = n * u64::from(spec.gpus) * u64::from(share);
    let per_gpu_memory = if share >= GPU_MILLI {
        nodes
            .iter()
            .flat_map(|node| &node.gpus)
            .filter(|g| {
                g.mig.is_none()
                    && (spec.gpu_models.is_empty()
                        || spec.gpu_models.iter().any(|w| same_model(w, &g.model)))
            })
            .map(|g| mib_down(g.memory_bytes))
            .min()
            .unwrap_or(0)
            .max(spec.gpu_memory_bytes.map_or(0, mib_up))
    } else {
        spec.gpu_memory_bytes.map_or(0, mib_up)
    };
    let gpu_memory = n * u64::from(spec.gpus) * per_gpu_memory;
    let size = allot_domain::GangSize::new(spec.replicas, spec.gpus, Some(share), None);
    for t in &chain {
        let l = &t.quota.limit;
        let over = |asked: u64, limit: Option<u64>| asked > 0 && limit.is_some_and(|l| asked > l);
        if over(gpus, l.gpu_milli) {
            let dedicated = if share == GPU_MILLI && spec.gpu_milli.is_some_and(|m| m < GPU_MILLI) {
                " (whole GPUs: it runs dedicated)"
            } else {
                ""
            };
            v.check(
                false,
                "gpus",
                format!(
                    "{} may hold at most {} GPUs at once (its hard limit), and this job asks for \
                     {size}{dedicated}",
                    whose(t),
                    format_milli(l.gpu_milli.unwrap_or(0)),
                ),
            );
        }
        if over(n * u64::from(spec.cpu_milli), l.cpu_milli) {
            v.check(
                false,
                "cpu_milli",
                format!(
                    "{} may hold at most {} CPUs at once (its hard limit)",
                    whose(t),
                    format_milli(l.cpu_milli.unwrap_or(0))
                ),
            );
        }
        if over(n * mib_up(spec.memory_bytes), l.memory_bytes.map(mib_down)) {
            v.check(
                false,
                "memory_bytes",
                format!(
                    "{} may hold at most {} of memory at once (its hard limit)",
                    whose(t),
                    format_bytes(l.memory_bytes.unwrap_or(0))
                ),
            );
        }
        if over(gpu_memory, l.gpu_memory_bytes.map(mib_down)) {
            v.check(
                false,
                "gpu_memory_bytes",
                format!(
                    "{} may hold at most {} of GPU memory at once (its hard limit), and this \
                     job asks for {}",
                    whose(t),
                    format_bytes(l.gpu_memory_bytes.unwrap_or(0)),
                    format_bytes(gpu_memory * MIB)
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests;
