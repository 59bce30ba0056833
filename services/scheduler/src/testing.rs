//! Fixtures the scheduler's tests share: a time, nodes and tenants as the store returns them.

use std::collections::BTreeMap;

use allot_domain::{GpuDevice, Job, JobSpec, Node, Quota, Resources, Tenant, TenantName};
use chrono::{DateTime, TimeZone, Utc};

pub(crate) fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
        .single()
        .expect("valid time")
}

pub(crate) fn node(id: &str, models: &[&str]) -> Node {
    Node {
        id: id.into(),
        name: id.into(),
        registered_at: now(),
        last_heartbeat_at: now(),
        lease_expires_at: now() + chrono::Duration::seconds(30),
        agent_version: "test".into(),
        gpu_backend: "simulated".into(),
        runtime: "process".into(),
        cpu_milli: 64_000,
        memory_bytes: 512 << 30,
        cordoned: false,
        drain: None,
        drained_gpus: Vec::new(),
        approved_gpus: None,
        address: String::new(),
        labels: Default::default(),
        unavailable: String::new(),
        gpus: models
            .iter()
            .enumerate()
            .map(|(i, m)| GpuDevice {
                uuid: format!("{id}-gpu{i}"),
                index: i as u32,
                model: (*m).into(),
                memory_bytes: 141 << 30,
                healthy: true,
                degraded: false,
                memory_enforcement: Default::default(),
                mig: None,
                // One NVSwitch domain, as on an HGX board.
                nvlink_domain: Some(0),
            })
            .collect(),
    }
}

pub(crate) fn tenant(id: &str, guaranteed_gpus: u64) -> Tenant {
    Tenant {
        id: id.into(),
        name: TenantName::parse("name", id).expect("valid"),
        parent_id: None,
        quota: Quota {
            guaranteed: Resources {
                gpu_milli: guaranteed_gpus * 1000,
                ..Resources::default()
            },
            ..Quota::default()
        },
        policy: Default::default(),
        job_limits: Default::default(),
        uid_slot: 0,
        created_at: now(),
    }
}

/// A job of `tenant` named `name` asking 1 CPU, 1 GiB and `gpus` GPUs (`share` of each).
pub(crate) fn spec(name: &str, tenant: &str, gpus: u32, share: Option<u32>) -> JobSpec {
    JobSpec {
        tenant: TenantName::parse("tenant", tenant).expect("valid"),
        name: name.into(),
        cpu_milli: 1000,
        memory_bytes: 1 << 30,
        gpus,
        gpu_milli: share,
        gpu_memory_bytes: None,
        gpu_models: Vec::new(),
        priority: 0,
        preemptible: true,
        isolation: None,
        class: None,
        max_retries: 0,
        command: vec!["true".into()],
        env: BTreeMap::new(),
        workdir: None,
        checkpoint_dir: None,
        volumes: Vec::new(),
        secrets: Vec::new(),
        mig_profile: None,
        gpu_compute: None,
        gpu_resizable: false,
        gpu_sizing: Default::default(),
        time_limit_secs: None,
        replicas: 1,
        pack: None,
        array: None,
        dependencies: vec![],
        image: None,
        network: Default::default(),
    }
}

/// A pending job of `tenant` as the store returns it, submitted an hour before [`now`].
pub(crate) fn pending_job(id: &str, tenant: &str, gpus: u32, share: Option<u32>) -> Job {
    Job {
        id: id.into(),
        tenant_id: tenant.into(),
        spec: spec(id, tenant, gpus, share),
        state: allot_domain::JobState::Pending,
        pending_reason: None,
        node_id: None,
        gpu_uuids: Vec::new(),
        held_gpu_milli: None,
        borrowing: false,
        attempt: 1,
        cancel_requested: false,
        preempt_reason: None,
        failures: 0,
        retry_at: None,
        pid: None,
        exit_code: None,
        message: None,
        log_tail: None,
        created_at: now() - chrono::Duration::hours(1),
        updated_at: now(),
        scheduled_at: None,
        started_at: None,
        finished_at: None,
        traceparent: None,
        avoid: None,
        image_digest: None,
        replica: None,
        array_task: None,
        submitted_by: None,
    }
}
