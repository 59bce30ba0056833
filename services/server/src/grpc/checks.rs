//! What an agent's messages may say: GPUs it registered with, bounded lists, node names
//! and addresses, image digests, and which logs it may write. Each check refuses with a
//! status naming the field.

use allot_domain::{GpuDevice, MigSlot, Node};
use allot_proto::v1::Gpu;
use tonic::Status;

/// The attempts of `job` whose log node `node_id` may write: the one it runs now, and the
/// one before when the job was requeued because this node was lost (an agent killed and
/// started again ships what its attempt wrote meanwhile). Anything else is refused.
pub(super) fn log_writable_attempts(job: &allot_domain::Job, node_id: &str) -> Vec<u32> {
    let mut attempts = Vec::new();
    if job.node_id.as_deref() == Some(node_id) {
        attempts.push(job.attempt);
    }
    let lost_here = job
        .avoid
        .as_ref()
        .is_some_and(|a| a.node_id.as_deref() == Some(node_id));
    if lost_here && job.attempt > 1 {
        attempts.push(job.attempt - 1);
    }
    attempts
}

/// The digest a report says the job's image resolved to: only for a job with an image,
/// only a sha256 digest, and only the one its reference names if it names one.
pub(super) fn image_digest(
    job: &allot_domain::Job,
    reported: &str,
) -> Result<Option<String>, Status> {
    if reported.is_empty() {
        return Ok(None);
    }
    let well_formed = reported
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    let named = job
        .spec
        .image
        .as_deref()
        .and_then(|i| allot_domain::ImageRef::parse(i).ok());
    match named {
        Some(named) if well_formed && named.digest.as_deref().is_none_or(|d| d == reported) => {
            Ok(Some(reported.to_owned()))
        }
        _ => Err(Status::invalid_argument(
            "image_digest: not a sha256 digest of this job's image",
        )),
    }
}

pub(super) fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

/// A node's address as it says it: empty, an IP address, or a DNS name (what other nodes'
/// jobs are told to connect to, so nothing else: no ports, paths or spaces).
pub(super) fn valid_address(address: &str) -> Result<String, Status> {
    let dns = |a: &str| {
        a.len() <= 253
            && a.split('.').all(|label| {
                (1..=63).contains(&label.len())
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    };
    if address.is_empty() || address.parse::<std::net::IpAddr>().is_ok() || dns(address) {
        Ok(address.to_owned())
    } else {
        Err(Status::invalid_argument(
            "address: must be an IP address or a DNS name",
        ))
    }
}

/// The reported inventory, checked (`allot_domain::node::check_inventory`).
pub(super) fn gpus_from_proto(gpus: Vec<Gpu>) -> Result<Vec<GpuDevice>, Status> {
    let devices = gpus
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            if g.uuid.is_empty() || g.uuid.len() > 128 {
                return Err(Status::invalid_argument(format!(
                    "gpus[{i}].uuid must be 1 to 128 characters"
                )));
            }
            let mig = if g.mig_enabled {
                let mut slots = Vec::with_capacity(g.mig_instances.len());
                for (j, m) in g.mig_instances.into_iter().enumerate() {
                    if m.uuid.is_empty() || m.uuid.len() > 128 || m.start > 7 {
                        return Err(Status::invalid_argument(format!(
                            "gpus[{i}].mig_instances[{j}]: uuid must be 1 to 128 characters and start at most 7"
                        )));
                    }
                    slots.push(MigSlot {
                        profile: m.profile,
                        start: u8::try_from(m.start).unwrap_or(u8::MAX),
                        uuid: m.uuid,
                    });
                }
                Some(slots)
            } else {
                None
            };
            Ok(GpuDevice {
                uuid: g.uuid,
                index: g.index,
                model: g.model,
                memory_bytes: g.memory_bytes,
                healthy: g.healthy,
                degraded: g.degraded,
                mig,
                memory_enforcement: g.memory_enforcement.parse().map_err(|e: String| {
                    Status::invalid_argument(format!("gpus[{i}].memory_enforcement: {e}"))
                })?,
                nvlink_domain: match g.nvlink_domain {
                    Some(d) if d as usize >= allot_domain::node::MAX_NODE_GPUS => {
                        return Err(Status::invalid_argument(format!(
                            "gpus[{i}].nvlink_domain must be below {}",
                            allot_domain::node::MAX_NODE_GPUS
                        )));
                    }
                    d => d,
                },
            })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    allot_domain::node::check_inventory(&devices).map_err(invalid)?;
    Ok(devices)
}

/// A validation error as the gRPC status naming its fields.
pub(super) fn invalid(e: allot_domain::ValidationError) -> Status {
    let what: Vec<String> =
        e.0.iter()
            .take(8)
            .map(|f| format!("{}: {}", f.field, f.reason))
            .collect();
    Status::invalid_argument(what.join("; "))
}

/// `value`, refused naming `field` when above `max`.
pub(super) fn bounded<T: PartialOrd + std::fmt::Display>(
    field: &str,
    value: T,
    max: T,
) -> Result<T, Status> {
    if value > max {
        return Err(Status::invalid_argument(format!(
            "{field}: must be at most {max}"
        )));
    }
    Ok(value)
}

/// The GPUs (never MIG instances) that `uuids`, a job's placement on `node`, are on.
pub(super) fn gpu_parents(node: &Node, uuids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = uuids
        .iter()
        .map(|u| {
            node.gpus
                .iter()
                .find(|g| g.holds(u))
                .map_or_else(|| u.clone(), |g| g.uuid.clone())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Refuses an inventory naming GPUs the node was never approved for: a node's GPUs never
/// grow past those it registered with by a bootstrap token (`Node::unapproved`), so a
/// stolen key cannot invent GPUs to draw every tenant's work (and secrets).
pub(super) fn approved(node: &Node, gpus: &[GpuDevice]) -> Result<(), Status> {
    let extra = node.unapproved(gpus);
    if extra.is_empty() {
        return Ok(());
    }
    let shown: Vec<&str> = extra.iter().take(8).copied().collect();
    Err(Status::permission_denied(format!(
        "{} GPU(s) ({}{}) are not among those node {} registered with; an admin approves \
         more by a bootstrap token made to replace it (allot node bootstrap-token create \
         --node {} --replace)",
        extra.len(),
        shown.join(", "),
        if extra.len() > shown.len() {
            ", …"
        } else {
            ""
        },
        node.name,
        node.name
    )))
}
