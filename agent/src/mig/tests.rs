use allot_domain::mig::GEOMETRIES;

use super::*;
use crate::gpu::{GpuBackend, SimBackend};

/// The simulator's models with MIG, one per supported board.
const BOARDS: [(&str, &str); 4] = [
    ("1xA100-40GB:mig", "A100-40GB"),
    ("1xA100-80GB:mig", "A100-80GB"),
    ("1xH100:mig", "H100-80GB"),
    ("1xH200:mig", "H200-141GB"),
];

fn one_gpu(spec: &str) -> (SimBackend, GpuInfo) {
    let b = SimBackend::from_spec(spec, "mig-test").expect("valid spec");
    let gpu = b.inventory().expect("inventory").remove(0);
    (b, gpu)
}

fn shape(instances: &[MigInstance]) -> Layout {
    instances.iter().map(|i| (i.profile, i.start)).collect()
}

fn idle(_: &str) -> bool {
    false
}

#[test]
fn every_valid_layout_is_reachable_on_every_board() {
    for (spec, board) in BOARDS {
        let (b, gpu) = one_gpu(spec);
        let g = GEOMETRIES
            .iter()
            .find(|g| g.board == board)
            .expect("geometry");
        let layouts = g.all_layouts();
        assert!(layouts.len() > 20, "{board}: {} layouts", layouts.len());
        // From whatever the previous layout was, so every transition destroys and creates.
        for layout in &layouts {
            let actual = reconcile(&b, &gpu, layout, &idle)
                .unwrap_or_else(|e| panic!("{board} {layout:?}: {e}"));
            assert_eq!(shape(&actual), sorted(layout.clone()), "{board}");
            let uuids: std::collections::HashSet<_> = actual.iter().map(|i| &i.uuid).collect();
            assert_eq!(
                uuids.len(),
                actual.len(),
                "{board}: instance UUIDs are distinct"
            );
            assert!(actual.iter().all(|i| i.uuid.starts_with("MIG-")));
        }
    }
}

#[test]
fn invalid_layouts_are_refused_and_change_nothing() {
    let (b, gpu) = one_gpu("1xH200:mig");
    let before = reconcile(&b, &gpu, &[(9, 0)], &idle).expect("one 3g.71gb");
    let refused: [&[(u32, u8)]; 5] = [
        &[(9, 0), (9, 2)],   // 3g starts only at 0 or 4
        &[(14, 0), (15, 0)], // overlap at slice 0
        &[(0, 0), (19, 0)],  // 7g takes the whole GPU
        &[(99, 0)],          // no such profile
        &[(20, 0), (20, 1)], // one 1g+me per GPU
    ];
    for layout in refused {
        let err = reconcile(&b, &gpu, layout, &idle).expect_err("invalid");
        assert!(
            matches!(err, MigReconcileError::Invalid { .. }),
            "{layout:?}: {err}"
        );
        assert_eq!(b.mig_instances(0).expect("read"), Some(before.clone()));
    }
    let (t4, gpu) = one_gpu("1xT4");
    assert!(matches!(
        reconcile(&t4, &gpu, &[(19, 0)], &idle),
        Err(MigReconcileError::NoMig(_))
    ));
}

#[test]
fn an_instance_running_a_job_is_not_destroyed() {
    let (b, gpu) = one_gpu("1xA100-80GB:mig");
    let actual = reconcile(&b, &gpu, &[(19, 0), (19, 1)], &idle).expect("two 1g");
    let running = actual[0].uuid.clone();
    let err = reconcile(&b, &gpu, &[(0, 0)], &|uuid: &str| uuid == running).expect_err("busy");
    assert!(matches!(err, MigReconcileError::Busy { .. }), "{err}");
    assert_eq!(
        shape(&b.mig_instances(0).expect("read").unwrap_or_default()),
        [(19, 0), (19, 1)]
    );
    // Keeping the busy instance and adding around it is fine.
    let grown = reconcile(&b, &gpu, &[(19, 0), (19, 1), (14, 2)], &|uuid: &str| {
        uuid == running
    })
    .expect("added");
    assert_eq!(grown.len(), 3);
    assert!(
        grown.iter().any(|i| i.uuid == running),
        "the running instance stays"
    );
}

#[test]
fn stored_layouts_are_recreated_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = LayoutStore::new(dir.path());
    let (b, gpu) = one_gpu("1xH100:mig");
    let layout = vec![(14, 0), (14, 2), (19, 4), (19, 5), (19, 6)];
    let before = apply(&b, &store, &gpu, &layout, &idle).expect("applied");

    // A new agent process: the simulated GPU starts with no instances.
    let (fresh, gpus) = {
        let (b, gpu) = one_gpu("1xH100:mig");
        (b, vec![gpu])
    };
    assert_eq!(fresh.mig_instances(0).expect("read"), Some(Vec::new()));
    let failures = restore(&fresh, &store, &gpus).expect("restored");
    assert!(failures.is_empty(), "{failures:?}");
    let after = fresh.mig_instances(0).expect("read").unwrap_or_default();
    assert_eq!(shape(&after), shape(&before));
    assert_eq!(after, before, "the same instances, with the same UUIDs");
}
