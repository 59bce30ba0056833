use std::collections::BTreeMap;

use allot_domain::MigSlot;
use allot_domain::mig::{GEOMETRIES, MigGeometry};

use super::*;

fn h200() -> &'static MigGeometry {
    GEOMETRIES
        .iter()
        .find(|g| g.board == "H200-141GB")
        .expect("H200 geometry")
}

fn slot(profile: u32, start: u8, uuid: &str) -> MigSlot {
    MigSlot {
        profile,
        start,
        uuid: uuid.to_owned(),
    }
}

fn gpu<'a>(node: &'a str, uuid: &'a str, instances: &'a [MigSlot]) -> MigGpu<'a> {
    MigGpu {
        node_id: node,
        node_name: node,
        gpu_uuid: uuid,
        geometry: h200(),
        instances,
        usable: true,
        containers: false,
    }
}

fn job<'a>(id: &'a str, profile: &'a str, seq: u64) -> MigJob<'a> {
    MigJob {
        id,
        tenant_id: "t",
        profile,
        priority: 0,
        seq,
        held: crate::quota::Amounts::of_parts(
            allot_domain::GpuParts::slices(
                allot_domain::mig::profile_named(profile).map_or(1, |p| p.compute_slices),
            ),
            0,
            0,
        ),
        image: false,
    }
}

fn held<'a>(uuid: &'a str, profile: &'a str) -> MigHeld<'a> {
    MigHeld {
        tenant_id: "t",
        profile,
        instance_uuid: uuid,
    }
}

fn code(d: &[MigDecision], job: &str) -> String {
    d.iter()
        .find_map(|d| match d {
            MigDecision::Wait { job_id, reason } if job_id == job => Some(reason.code.clone()),
            MigDecision::Place { job_id, .. } if job_id == job => Some("placed".into()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no decision for {job}: {d:?}"))
}

fn layouts(d: &[MigDecision]) -> Vec<(String, Vec<(u32, u8)>)> {
    d.iter()
        .filter_map(|d| match d {
            MigDecision::Repartition {
                gpu_uuid, layout, ..
            } => Some((gpu_uuid.clone(), layout.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_free_instance_is_taken_on_the_fullest_gpu() {
    let a = [slot(19, 0, "MIG-a0"), slot(19, 1, "MIG-a1")];
    let b = [slot(19, 0, "MIG-b0"), slot(19, 1, "MIG-b1")];
    let d = plan(
        &[gpu("n1", "GPU-a", &a), gpu("n2", "GPU-b", &b)],
        &[held("MIG-b0", "1g.18gb")],
        &[job("j", "1g.18gb", 0)],
        &MigLimits::default(),
        None,
    );
    assert_eq!(
        d,
        vec![MigDecision::Place {
            job_id: "j".into(),
            node_id: "n2".into(),
            instance_uuid: "MIG-b1".into(),
            gpu_milli: 142,
        }]
    );
}

#[test]
fn a_missing_instance_is_created_beside_the_others_and_the_job_waits_for_it() {
    let a = [slot(19, 0, "MIG-a0")];
    let d = plan(
        &[gpu("n1", "GPU-a", &a)],
        &[held("MIG-a0", "1g.18gb")],
        &[job("j1", "3g.71gb", 0), job("j2", "1g.18gb", 1)],
        &MigLimits::default(),
        None,
    );
    assert_eq!(code(&d, "j1"), "MigRepartitioning");
    assert_eq!(code(&d, "j2"), "MigRepartitioning");
    // One repartition serves both: the held instance stays where it is.
    assert_eq!(
        layouts(&d),
        vec![("GPU-a".to_owned(), vec![(19, 0), (19, 1), (9, 4)])]
    );
    h200()
        .validate(&layouts(&d)[0].1)
        .expect("a layout the board allows");
}

#[test]
fn an_idle_gpu_is_repartitioned_to_serve_what_waits() {
    // One 7g instance nobody uses; the jobs want 2g instances.
    let a = [slot(0, 0, "MIG-whole")];
    let d = plan(
        &[gpu("n1", "GPU-a", &a)],
        &[],
        &[job("j1", "2g.35gb", 0), job("j2", "2g.35gb", 1)],
        &MigLimits::default(),
        None,
    );
    assert_eq!(code(&d, "j1"), "MigRepartitioning");
    assert_eq!(code(&d, "j2"), "MigRepartitioning");
    assert_eq!(
        layouts(&d),
        vec![("GPU-a".to_owned(), vec![(14, 0), (14, 2)])]
    );
}

#[test]
fn held_instances_survive_every_repartition() {
    let a = [slot(9, 0, "MIG-busy"), slot(9, 4, "MIG-free")];
    let d = plan(
        &[gpu("n1", "GPU-a", &a)],
        &[held("MIG-busy", "3g.71gb")],
        &[job("j", "2g.35gb", 0)],
        &MigLimits::default(),
        None,
    );
    assert_eq!(code(&d, "j"), "MigRepartitioning");
    let (_, layout) = &layouts(&d)[0];
    assert!(layout.contains(&(9, 0)), "{layout:?}");
    assert!(layout.contains(&(14, 4)), "{layout:?}");
}

#[test]
fn a_full_gpu_or_none_in_mig_mode_makes_the_job_wait_saying_so() {
    let full = [slot(0, 0, "MIG-whole")];
    let d = plan(
        &[gpu("n1", "GPU-a", &full)],
        &[held("MIG-whole", "7g.141gb")],
        &[job("j", "1g.18gb", 0)],
        &MigLimits::default(),
        None,
    );
    assert_eq!(code(&d, "j"), "MigUnavailable");
    assert!(layouts(&d).is_empty());
    let d = plan(
        &[],
        &[],
        &[job("j", "1g.18gb", 0)],
        &MigLimits::default(),
        None,
    );
    assert_eq!(code(&d, "j"), "MigUnavailable");
    // A profile of another board (H100's 1g.10gb) is not offered by H200s.
    let d = plan(
        &[gpu("n1", "GPU-a", &[])],
        &[],
        &[job("j", "1g.10gb", 0)],
        &MigLimits::default(),
        None,
    );
    assert_eq!(code(&d, "j"), "MigUnavailable");
    // Unusable GPUs (node not ready, GPU unhealthy or drained) offer nothing.
    let mut down = gpu("n1", "GPU-a", &[]);
    down.usable = false;
    let d = plan(
        &[down],
        &[],
        &[job("j", "1g.18gb", 0)],
        &MigLimits::default(),
        None,
    );
    assert_eq!(code(&d, "j"), "MigUnavailable");
}

#[test]
fn per_profile_limits_hold_up_the_tenant_tree() {
    let parent_limits = BTreeMap::from([("1g.18gb".to_owned(), 2)]);
    let none = BTreeMap::new();
    let limits = MigLimits {
        parent: HashMap::from([("t", Some("org")), ("u", Some("org")), ("org", None)]),
        limits: HashMap::from([
            ("org", ("org", &parent_limits)),
            ("t", ("team-t", &none)),
            ("u", ("team-u", &none)),
        ]),
    };
    let a = [
        slot(19, 0, "MIG-0"),
        slot(19, 1, "MIG-1"),
        slot(19, 2, "MIG-2"),
    ];
    // team-t holds one; team-u asks for two: the second would be the org's third.
    let pending = [
        MigJob {
            tenant_id: "u",
            ..job("u1", "1g.18gb", 0)
        },
        MigJob {
            tenant_id: "u",
            ..job("u2", "1g.18gb", 1)
        },
    ];
    let d = plan(
        &[gpu("n1", "GPU-a", &a)],
        &[held("MIG-0", "1g.18gb")],
        &pending,
        &limits,
        None,
    );
    assert_eq!(code(&d, "u1"), "placed");
    assert_eq!(code(&d, "u2"), "MigLimit");
    // Other profiles are unlimited.
    let d = plan(
        &[gpu("n1", "GPU-a", &a)],
        &[held("MIG-0", "1g.18gb"), held("MIG-1", "1g.18gb")],
        &[MigJob {
            tenant_id: "u",
            ..job("big", "3g.71gb", 0)
        }],
        &limits,
        None,
    );
    assert_eq!(code(&d, "big"), "MigRepartitioning");
}

#[test]
fn higher_priority_goes_first_for_the_last_instance() {
    let a = [slot(0, 0, "MIG-whole")];
    let d = plan(
        &[gpu("n1", "GPU-a", &a)],
        &[],
        &[
            job("old", "7g.141gb", 0),
            MigJob {
                priority: 10,
                ..job("urgent", "7g.141gb", 1)
            },
        ],
        &MigLimits::default(),
        None,
    );
    assert_eq!(code(&d, "urgent"), "placed");
    assert_eq!(code(&d, "old"), "MigUnavailable");
}
