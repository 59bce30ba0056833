use allot_domain::{Isolation, MigSlot, ResourceLimits};

use super::*;
use crate::testing::{node, spec, tenant};

fn fields(spec: &JobSpec, tenants: &[Tenant], nodes: &[Node]) -> Vec<(String, String)> {
    match check(spec, "team-a", tenants, nodes) {
        Ok(()) => Vec::new(),
        Err(e) => e.0.into_iter().map(|f| (f.field, f.reason)).collect(),
    }
}

fn h200s() -> Vec<Node> {
    vec![node("n1", &["H200"; 8]), node("n2", &["NVIDIA H200"; 4])]
}

fn only(out: &[(String, String)], field: &str, says: &str) {
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0, field, "{out:?}");
    assert!(out[0].1.contains(says), "{out:?}");
}

#[test]
fn what_some_node_can_give_is_admitted() {
    let t = [tenant("team-a", 2)];
    let ok = |s: JobSpec| assert_eq!(fields(&s, &t, &h200s()), Vec::new(), "{s:?}");
    ok(spec("j", "team-a", 8, None));
    ok(spec("j", "team-a", 1, Some(250)));
    ok(JobSpec {
        gpu_models: vec!["h200".into()],
        gpu_memory_bytes: Some(141 << 30),
        cpu_milli: 64_000,
        memory_bytes: 512 << 30,
        ..spec("j", "team-a", 4, None)
    });
    ok(spec("cpu", "team-a", 0, None));
}

#[test]
fn a_fleet_with_no_nodes_yet_refuses_nothing_of_the_fleet() {
    let s = JobSpec {
        gpu_models: vec!["A100".into()],
        ..spec("j", "team-a", 32, None)
    };
    assert_eq!(fields(&s, &[tenant("team-a", 0)], &[]), Vec::new());
}

#[test]
fn a_model_no_node_has_is_named() {
    let s = JobSpec {
        gpu_models: vec!["A100".into()],
        ..spec("j", "team-a", 1, None)
    };
    let out = fields(&s, &[tenant("team-a", 0)], &h200s());
    only(
        &out,
        "gpu_models",
        "no node has a GPU of model A100; the nodes have H200",
    );
}

#[test]
fn more_gpus_or_gpu_memory_than_any_node_has_are_refused_with_the_largest() {
    let t = [tenant("team-a", 0)];
    only(
        &fields(&spec("j", "team-a", 9, None), &t, &h200s()),
        "gpus",
        "no node has more than 8 GPUs",
    );
    let big = JobSpec {
        gpu_memory_bytes: Some(500 << 30),
        ..spec("j", "team-a", 1, None)
    };
    only(
        &fields(&big, &t, &h200s()),
        "gpu_memory_bytes",
        "no GPU has more than 141 GiB",
    );
    // Eight GPUs of one model on one node: n3's are split between two models.
    let mixed = [node(
        "n3",
        &[
            "H200", "H200", "H200", "H200", "A100", "A100", "A100", "A100",
        ],
    )];
    only(
        &fields(&spec("j", "team-a", 8, None), &t, &mixed),
        "gpus",
        "no node has more than 4 GPUs",
    );
    // Two of n1's eight in MIG mode: six whole GPUs, and the message says where the
    // other two went.
    let mut partly_mig = h200s();
    for g in partly_mig[0].gpus.iter_mut().take(2) {
        g.mig = Some(Vec::new());
    }
    only(
        &fields(&spec("j", "team-a", 8, None), &t, &partly_mig),
        "gpus",
        "no node has more than 6 GPUs outside MIG mode (n1 also has 2 in MIG mode",
    );
    // Without MIG GPUs the message does not mention MIG.
    let out = fields(&spec("j", "team-a", 9, None), &t, &h200s());
    assert!(!out[0].1.contains("MIG"), "{out:?}");
}

#[test]
fn cpu_and_memory_are_looked_for_on_the_nodes_with_the_gpus() {
    let t = [tenant("team-a", 0)];
    let mut nodes = h200s();
    nodes.push(Node {
        cpu_milli: 256_000,
        memory_bytes: 4 << 40,
        ..node("cpu-box", &[])
    });
    let s = JobSpec {
        cpu_milli: 128_000,
        memory_bytes: 10 << 40,
        ..spec("j", "team-a", 1, None)
    };
    let out = fields(&s, &t, &nodes);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].0, "cpu_milli");
    assert!(
        out[0]
            .1
            .contains("with the GPUs asked for offers more than 64 CPUs")
    );
    assert_eq!(out[1].0, "memory_bytes");
    assert!(out[1].1.contains("512 GiB"), "{out:?}");
    // Without GPUs the CPU node counts.
    let cpu_only = JobSpec {
        memory_bytes: 1 << 40,
        ..spec("j", "team-a", 0, None)
    };
    assert_eq!(
        fields(
            &JobSpec {
                cpu_milli: 128_000,
                ..cpu_only
            },
            &t,
            &nodes
        ),
        Vec::new()
    );
    // A node that did not say what it offers may offer anything.
    let unknown = [Node {
        cpu_milli: 0,
        memory_bytes: 0,
        ..node("n", &["H200"])
    }];
    assert_eq!(fields(&s, &t, &unknown), Vec::new());
}

#[test]
fn a_mig_profile_needs_a_gpu_in_mig_mode_that_makes_it() {
    let t = [tenant("team-a", 0)];
    let s = JobSpec {
        mig_profile: Some("1g.18gb".into()),
        isolation: Some(Isolation::Mig),
        ..spec("j", "team-a", 1, None)
    };
    only(
        &fields(&s, &t, &h200s()),
        "mig_profile",
        "no GPU is in MIG mode",
    );
    let mut mig = node("m", &["H200"]);
    mig.gpus[0].mig = Some(vec![MigSlot {
        profile: 19,
        start: 0,
        uuid: "MIG-1".into(),
    }]);
    assert_eq!(fields(&s, &t, &[mig.clone()]), Vec::new());
    assert_eq!(mig_profiles(&h200s()), Vec::<&str>::new());
    let mut both = h200s();
    both.push(mig.clone());
    assert_eq!(mig_profiles(&both).len(), 7, "H200's seven, once");
    let a100 = JobSpec {
        mig_profile: Some("1g.10gb".into()),
        ..s.clone()
    };
    only(
        &fields(&a100, &t, &[mig.clone()]),
        "mig_profile",
        "the profiles they make: 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb",
    );
    // Whole GPUs are not on a GPU in MIG mode.
    only(
        &fields(&spec("j", "team-a", 1, None), &t, &[mig]),
        "gpus",
        "every GPU is in MIG mode",
    );
}

#[test]
fn a_hard_limit_on_the_tenant_or_above_it_refuses_what_it_never_allows() {
    let mut parent = tenant("org", 0);
    parent.quota.limit = ResourceLimits {
        gpu_milli: Some(4000),
        ..Default::default()
    };
    let mut child = tenant("team-a", 0);
    child.parent_id = Some("org".into());
    child.quota.limit.cpu_milli = Some(8000);
    let t = [parent, child];
    only(
        &fields(&spec("j", "team-a", 8, None), &t, &h200s()),
        "gpus",
        "tenant `org` (which `team-a` is part of) may hold at most 4 GPUs at once (its hard \
         limit), and this job asks for 8",
    );
    only(
        &fields(
            &JobSpec {
                cpu_milli: 9000,
                ..spec("j", "team-a", 0, None)
            },
            &t,
            &h200s(),
        ),
        "cpu_milli",
        "tenant `team-a` may hold at most 8 CPUs",
    );
    assert_eq!(
        fields(&spec("j", "team-a", 4, None), &t, &h200s()),
        Vec::new()
    );
    // A quarter of a GPU run dedicated holds the whole GPU.
    let mut tight = tenant("team-a", 0);
    tight.quota.limit.gpu_milli = Some(500);
    tight.quota.min_isolation = Isolation::Dedicated;
    only(
        &fields(&spec("j", "team-a", 1, Some(250)), &[tight], &h200s()),
        "gpus",
        "(whole GPUs: it runs dedicated)",
    );
}

#[test]
fn a_mig_limit_of_zero_refuses_the_profile() {
    let mut t = tenant("team-a", 0);
    t.quota.mig_limits.insert("1g.18gb".into(), 0);
    let s = JobSpec {
        mig_profile: Some("1G.18GB".into()),
        isolation: Some(Isolation::Mig),
        ..spec("j", "team-a", 1, None)
    };
    only(
        &fields(&s, &[t], &[]),
        "mig_profile",
        "may hold no 1G.18GB instance",
    );
}

#[test]
fn a_gang_the_whole_fleet_cannot_hold_at_once_is_refused() {
    // 8 + 4 H200s: three replicas of 4 GPUs fit (two on n1), four do not.
    let t = [tenant("team-a", 2)];
    let gang = |replicas, gpus| JobSpec {
        replicas,
        ..spec("j", "team-a", gpus, None)
    };
    assert_eq!(fields(&gang(3, 4), &t, &h200s()), Vec::new());
    only(
        &fields(&gang(4, 4), &t, &h200s()),
        "replicas",
        "the fleet holds at most 3 replicas of 4 GPUs",
    );
    only(
        &fields(&gang(2, 8), &t, &h200s()),
        "replicas",
        "at most 1 replica of 8 GPUs",
    );
}

#[test]
fn models_compare_as_their_keys_do() {
    for (a, b) in [
        ("NVIDIA H200", "h200"),
        ("nvidia A100", " A100 "),
        ("H100", "H200"),
        ("NVIDIA  H100", "h100"),
        ("NVIDIA H100 80GB HBM3", "nvidia h100 80gb hbm3"),
    ] {
        assert_eq!(
            super::same_model(a, b),
            super::model_key(a) == super::model_key(b),
            "{a} vs {b}"
        );
    }
}

/// A job is refused, naming `image`, when no node runs what it needs: an image without a
/// node running containers, a job without one on a fleet that only runs containers.
#[test]
fn a_job_no_node_can_run_for_want_of_an_image_or_containers_is_refused() {
    let t = [tenant("team-a", 2)];
    let processes = h200s();
    let containers: Vec<Node> = h200s()
        .into_iter()
        .map(|mut n| {
            n.runtime = "oci".into();
            n
        })
        .collect();
    let with_image = JobSpec {
        image: Some("registry.example/team-a/train:1".into()),
        ..spec("j", "team-a", 1, None)
    };
    only(
        &fields(&with_image, &t, &processes),
        "image",
        "no node runs jobs in containers",
    );
    only(
        &fields(&spec("j", "team-a", 1, None), &t, &containers),
        "image",
        "must name an image",
    );
    assert_eq!(fields(&with_image, &t, &containers), Vec::new());
    let mut mixed = processes.clone();
    mixed.push(containers[0].clone());
    assert_eq!(fields(&with_image, &t, &mixed), Vec::new());
    assert_eq!(
        fields(&spec("j", "team-a", 1, None), &t, &mixed),
        Vec::new()
    );
}

/// A tenant limited in GPU memory is refused a whole GPU bigger than its limit: a whole GPU
/// holds all of its memory.
#[test]
fn a_whole_gpu_past_a_gpu_memory_limit_is_refused() {
    let mut capped = tenant("team-a", 0);
    capped.quota.limit.gpu_memory_bytes = Some(100 << 30);
    let out = fields(&spec("j", "team-a", 1, None), &[capped], &h200s());
    only(&out, "gpu_memory_bytes", "of GPU memory at once");
}
