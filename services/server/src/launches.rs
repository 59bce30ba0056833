//! What a node is sent to launch a job: the job's record, and what the control plane holds
//! for it elsewhere — its tenant's host uid range, pull credentials for its image's
//! registry, where its volumes are, and the values of the secrets it uses.

use allot_domain::{ImageRef, Job};
use allot_proto::v1::{Assignment, Gang, JobSecret, VolumeMount};
use allot_store::{
    CredentialRepo, JobRepo, NodeRepo, SecretRepo, Store, TenantRepo, TenantScope, VolumeRepo,
};

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
    let uid_slot = match store.tenant_by_id(&job.tenant_id).await {
        Ok(t) => Some(t.uid_slot),
        Err(e) => {
            tracing::warn!(job = %job.id, error = %e, "no tenant for the launch");
            None
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
        },
    )
}

/// Where `job`, replica `r` of its gang, stands, and where the gang meets: replica 0's
/// node, at the gang's port for this attempt. Replica 0's node address unknown (an older
/// agent, or the store unreadable): its name, which a fleet's DNS usually resolves.
async fn gang(store: &Store, job: &Job, r: &allot_domain::Replica) -> Gang {
    // Replica 0's record is the gang's.
    let first_node = match store.job(&TenantScope::All, &r.gang_id).await {
        Ok(first) => first.node_id,
        Err(e) => {
            tracing::warn!(job = %job.id, error = %e, "cannot read the gang");
            None
        }
    };
    let master_addr = match first_node {
        Some(id) => match store.node(&id).await {
            Ok(n) if !n.address.is_empty() => n.address,
            Ok(n) => n.name,
            Err(e) => {
                tracing::warn!(job = %job.id, error = %e, "cannot read the gang's first node");
                String::new()
            }
        },
        None => String::new(),
    };
    Gang {
        gang_id: r.gang_id.clone(),
        rank: r.rank,
        size: job.spec.replicas,
        master_addr,
        master_port: u32::from(allot_domain::gang::master_port(&r.gang_id, job.attempt)),
    }
}
