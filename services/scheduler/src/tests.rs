use super::*;

fn node(id: &str, gpus: usize, mem_gib: u64) -> NodeView {
    NodeView {
        id: id.into(),
        name: id.into(),
        gpus: (0..gpus)
            .map(|i| GpuView {
                uuid: format!("{id}-gpu{i}"),
                model: "H200".into(),
                memory_bytes: mem_gib << 30,
                healthy: true,
            })
            .collect(),
    }
}

fn req(job: &str, tenant: &str, gpus: u32) -> Request {
    Request {
        job_id: job.into(),
        tenant_id: tenant.into(),
        tenant_name: tenant.into(),
        gpus,
        gpu_memory_bytes: None,
    }
}

fn placed(d: &Decision) -> Option<&Placed> {
    match d {
        Decision::Place { placed, .. } => Some(placed),
        Decision::Wait { .. } => None,
    }
}

fn reason(d: &Decision) -> Option<&PendingReason> {
    match d {
        Decision::Wait { reason, .. } => Some(reason),
        Decision::Place { .. } => None,
    }
}

#[test]
fn first_fit_fills_nodes_in_order_without_double_booking() {
    let snap = Snapshot {
        nodes: vec![node("a", 2, 141), node("b", 4, 141)],
        pending: vec![req("j1", "t", 2), req("j2", "t", 3), req("j3", "t", 2)],
        ..Default::default()
    };
    let d = schedule(&FirstFit, &snap);
    assert_eq!(placed(&d[0]).map(|p| p.node_id.as_str()), Some("a"));
    assert_eq!(placed(&d[1]).map(|p| p.node_id.as_str()), Some("b"));
    let r = reason(&d[2]).expect("j3 waits");
    assert_eq!(r.code, "InsufficientGpus");
    assert!(
        r.message.contains("most free on one node is 1"),
        "{}",
        r.message
    );
}

#[test]
fn existing_allocations_and_unhealthy_gpus_are_not_free() {
    let mut n = node("a", 2, 80);
    n.gpus[1].healthy = false;
    let snap = Snapshot {
        nodes: vec![n],
        allocations: vec![Allocation {
            tenant_id: "other".into(),
            node_id: "a".into(),
            gpu_uuids: vec!["a-gpu0".into()],
        }],
        pending: vec![req("j", "t", 1)],
        ..Default::default()
    };
    assert!(reason(&schedule(&FirstFit, &snap)[0]).is_some());
}

#[test]
fn tenant_gpu_cap_holds_jobs_with_numbers() {
    let snap = Snapshot {
        nodes: vec![node("a", 8, 141)],
        allocations: vec![Allocation {
            tenant_id: "t".into(),
            node_id: "a".into(),
            gpu_uuids: vec!["a-gpu0".into(), "a-gpu1".into()],
        }],
        quotas: HashMap::from([(
            "t".to_owned(),
            Quota {
                max_gpus: Some(3),
                max_gpu_memory_bytes: None,
            },
        )]),
        pending: vec![req("j1", "t", 1), req("j2", "t", 1), req("j3", "u", 1)],
    };
    let d = schedule(&FirstFit, &snap);
    assert!(placed(&d[0]).is_some());
    let r = reason(&d[1]).expect("over cap");
    assert_eq!(r.code, "TenantGpuCap");
    assert_eq!(r.message, "tenant t: 3 of 3 GPUs in use (cap 3); request 1");
    assert!(placed(&d[2]).is_some(), "other tenants are unaffected");
}

#[test]
fn tenant_memory_cap_counts_whole_gpus() {
    let snap = Snapshot {
        nodes: vec![node("a", 2, 141)],
        quotas: HashMap::from([(
            "t".to_owned(),
            Quota {
                max_gpus: None,
                max_gpu_memory_bytes: Some(100 << 30),
            },
        )]),
        pending: vec![req("j", "t", 1)],
        ..Default::default()
    };
    let r = schedule(&FirstFit, &snap);
    let r = reason(&r[0]).expect("141 GiB exceeds 100 GiB");
    assert_eq!(r.code, "TenantGpuMemoryCap");
    assert!(r.message.contains("141 GiB"), "{}", r.message);
}

#[test]
fn memory_requirement_skips_small_gpus() {
    let mut small = req("j", "t", 1);
    small.gpu_memory_bytes = Some(100 << 30);
    let snap = Snapshot {
        nodes: vec![node("t4", 4, 16), node("h200", 1, 141)],
        pending: vec![small],
        ..Default::default()
    };
    let d = schedule(&FirstFit, &snap);
    assert_eq!(placed(&d[0]).map(|p| p.node_id.as_str()), Some("h200"));
}

#[test]
fn no_nodes_is_its_own_reason() {
    let snap = Snapshot {
        pending: vec![req("j", "t", 1)],
        ..Default::default()
    };
    assert_eq!(
        reason(&schedule(&FirstFit, &snap)[0]).map(|r| r.code.as_str()),
        Some("NoReadyNodes")
    );
}

#[test]
fn cpu_only_jobs_need_a_ready_node_but_no_gpu() {
    let snap = Snapshot {
        nodes: vec![node("a", 0, 0)],
        pending: vec![req("j", "t", 0)],
        ..Default::default()
    };
    let d = schedule(&FirstFit, &snap);
    assert_eq!(placed(&d[0]).map(|p| p.gpu_uuids.len()), Some(0));
}
