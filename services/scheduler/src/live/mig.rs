//! MIG jobs on the live path: what each holds and where each goes (an instance of its
//! profile on a GPU in MIG mode, within the tenant's per-profile limits).

use super::*;

/// What a MIG job holds as quotas count it: its instance's compute slices of seven and its
/// memory, and its CPU and memory.
pub(super) fn mig_amounts(j: &StoredJob) -> Amounts {
    let profile = j
        .spec
        .mig_profile
        .as_deref()
        .and_then(allot_domain::mig::profile_named);
    Amounts::of_parts(
        allot_domain::GpuParts::slices(profile.map_or(0, |p| p.compute_slices)),
        u64::from(j.spec.cpu_milli),
        u64::from(mib_up(j.spec.memory_bytes)),
    )
    .with_gpu_memory(profile.map_or(0, |p| u64::from(p.memory_mib)))
}

/// MIG jobs' decisions: the GPUs in MIG mode, the instances held, the per-profile limits,
/// and the hard limits of the quota tree against what every job holds (`quota`, which the
/// placements made here are added to).
pub(super) fn mig_decisions(
    snap: &Snapshot<'_>,
    suspect_after: Option<(chrono::Duration, chrono::Duration)>,
    pending: &[crate::mig::MigJob<'_>],
    quota: Option<&mut crate::mig::MigQuota<'_>>,
) -> Vec<LiveDecision> {
    use crate::mig::{MigDecision, MigGpu, MigHeld, MigLimits};
    let mut gpus = Vec::new();
    for n in snap.nodes {
        let ready = node_ready(n, snap.now, suspect_after, snap.reachable);
        for g in &n.gpus {
            let (Some(instances), Some(geometry)) = (
                g.mig.as_deref(),
                allot_domain::mig::geometry(&g.model, Some(g.memory_bytes >> 20)),
            ) else {
                continue;
            };
            gpus.push(MigGpu {
                node_id: &n.id,
                node_name: &n.name,
                gpu_uuid: &g.uuid,
                geometry,
                instances,
                usable: ready && gpu_offered(n, g),
                containers: n.confines_jobs(),
            });
        }
    }
    let held: Vec<MigHeld<'_>> = snap
        .holding
        .iter()
        .filter_map(|j| {
            Some(MigHeld {
                tenant_id: &j.tenant_id,
                profile: j.spec.mig_profile.as_deref()?,
                instance_uuid: j.gpu_uuids.first()?,
            })
        })
        .collect();
    let limits = MigLimits {
        parent: snap
            .tenants
            .iter()
            .map(|t| (t.id.as_str(), t.parent_id.as_deref()))
            .collect(),
        limits: snap
            .tenants
            .iter()
            .map(|t| (t.id.as_str(), (t.name.as_str(), &t.quota.mig_limits)))
            .collect(),
    };
    crate::mig::plan(&gpus, &held, pending, &limits, quota)
        .into_iter()
        .map(|d| match d {
            MigDecision::Place {
                job_id,
                node_id,
                instance_uuid,
                gpu_milli,
            } => LiveDecision::Place {
                job_id,
                node_id,
                gpu_uuids: vec![instance_uuid],
                held_gpu_milli: gpu_milli,
                borrowing: false,
            },
            MigDecision::Repartition {
                node_id,
                gpu_uuid,
                layout,
            } => LiveDecision::Repartition {
                node_id,
                gpu_uuid,
                layout,
            },
            MigDecision::Wait { job_id, reason } => LiveDecision::Wait { job_id, reason },
        })
        .collect()
}
