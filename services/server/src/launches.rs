//! What a node is sent to launch a job: the job's record, and what the control plane holds
//! for it elsewhere — its tenant's host uid range, pull credentials for its image's
//! registry, where its volumes are, and the values of the secrets it uses.

use allot_domain::{ImageRef, Job};
use allot_proto::v1::{Assignment, Gang, JobSecret, VolumeMount};
use allot_store::{CredentialRepo, JobRepo, NodeRepo, SecretRepo, Store, TenantRepo, VolumeRepo};

use crate::hub::{self, LaunchExtras};

/// What the node holding `job` (scheduled or running there) is sent when its assignments
/// are sent again: the stop while it is being stopped (the agent then never starts it),
/// else its launch if it has not started; nothing for a running job.
pub async fn resend(store: &Store, job: &Job) -> Option<Assignment> {
    if job.cancel_requested || job.preempt_reason.is_some() {
        Some(hub::cancel(job))
    } else if job.state == allot_domain::JobState::Scheduled {
        Some(launch(store, job).await)
    } else {
        None
    }
}

/// The launch of `job`. What cannot be looked up is left out and said in the log: the
/// node then fails the attempt with the reason (no uid range, a refused pull, a missing
/// volume), rather than a scheduling pass failing for every job.
pub async fn launch(store: &Store, job: &Job) -> Assignment {
    let (uid_slot, network_policy) = match store.tenant_by_id(&job.tenant_id).await {
        Ok(t) => (Some(t.uid_slot), Some(network_policy(&t.policy.network))),
        Err(e) => {
            tracing::warn!(job = %job.id, error = %e, "no tenant for the launch");
            (None, None)
        }
    };
    let credentials = match job.spec.image.as_deref().map(ImageRef::parse) {
        Some(Ok(image)) => {
            let registry = image.registry_host();
            match store.pull_secret(&job.tenant_id, registry).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(job = %job.id, %registry, error = %e,
                        "the tenant's registry credentials cannot be used; pulling without");
                    None
                }
            }
        }
        _ => None,
    };
    let volumes = if job.spec.volumes.is_empty() {
        Vec::new()
    } else {
        let declared = store.list_volumes().await.unwrap_or_else(|e| {
            tracing::warn!(job = %job.id, error = %e, "cannot read the volumes");
            Vec::new()
        });
        job.spec
            .volumes
            .iter()
            .map(|m| {
                let d = declared.iter().find(|d| d.name == m.volume);
                VolumeMount {
                    volume: m.volume.clone(),
                    // Empty: no longer declared, which the node refuses.
                    host_path: d.map(|d| d.host_path.clone()).unwrap_or_default(),
                    path: m.path.clone(),
                    read_only: m.read_only || d.is_some_and(|d| d.read_only),
                }
            })
            .collect()
    };
    let mut secrets = Vec::with_capacity(job.spec.secrets.len());
    for u in &job.spec.secrets {
        let value = match store.open_secret(&job.tenant_id, &u.secret).await {
            Ok(Some(v)) => v.0,
            // Empty: it cannot be had, which the node refuses (a stored value never is).
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(job = %job.id, secret = %u.secret, error = %e,
                    "the secret cannot be opened");
                Vec::new()
            }
        };
        secrets.push(JobSecret {
            env: u.env.clone().unwrap_or_default(),
            file: u.file.clone().unwrap_or_default(),
            value,
        });
    }
    let gang = match &job.replica {
        Some(r) => Some(gang(store, job, r).await),
        None => None,
    };
    hub::launch(
        job,
        LaunchExtras {
            uid_slot,
            credentials,
            volumes,
            secrets,
            gang,
            network_policy,
        },
    )
}

/// The tenant's network policy as a launch carries it.
fn network_policy(p: &allot_domain::NetworkPolicy) -> allot_proto::v1::NetworkPolicy {
    allot_proto::v1::NetworkPolicy {
        restricted: p.egress.is_some(),
        allow: p
            .egress
            .iter()
            .flatten()
            .map(|r| allot_proto::v1::EgressRule {
                cidr: r.cidr.to_string(),
                ports: r
                    .ports
                    .iter()
                    .map(|p| allot_proto::v1::PortRange {
                        first: u32::from(p.first),
                        last: u32::from(p.last),
                    })
                    .collect(),
            })
            .collect(),
        allow_host_network: p.allow_host_network,
    }
}

/// Where `job`, replica `r` of its gang, stands, and where the gang meets: replica 0's
/// node, at the gang's port for this attempt, reached from the nodes of its replicas.
/// A node whose address is unknown (an older agent, or the store unreadable) is named by
/// its name, which a fleet's DNS usually resolves.
async fn gang(store: &Store, job: &Job, r: &allot_domain::Replica) -> Gang {
    let members = store.gang(&r.gang_id).await.unwrap_or_else(|e| {
        tracing::warn!(job = %job.id, error = %e, "cannot read the gang");
        Vec::new()
    });
    let mut addresses = std::collections::BTreeMap::new();
    for node_id in members.iter().filter_map(|m| m.node_id.clone()) {
        if addresses.contains_key(&node_id) {
            continue;
        }
        let address = match store.node(&node_id).await {
            Ok(n) if !n.address.is_empty() => n.address,
            Ok(n) => n.name,
            Err(e) => {
                tracing::warn!(job = %job.id, error = %e, "cannot read a node of the gang");
                continue;
            }
        };
        addresses.insert(node_id, address);
    }
    // Replica 0's record is the gang's.
    let master_addr = members
        .iter()
        .find(|m| m.id == r.gang_id)
        .and_then(|first| first.node_id.as_ref())
        .and_then(|id| addresses.get(id).cloned())
        .unwrap_or_default();
    // Only the first replica's node forwards the rendezvous.
    let mut peer_addresses: Vec<String> = if r.rank == 0 {
        addresses.into_values().collect()
    } else {
        Vec::new()
    };
    peer_addresses.sort();
    peer_addresses.dedup();
    Gang {
        gang_id: r.gang_id.clone(),
        rank: r.rank,
        size: job.spec.replicas,
        master_addr,
        master_port: u32::from(allot_domain::gang::master_port(&r.gang_id, job.attempt)),
        peer_addresses,
    }
}
