use super::*;

#[test]
fn a_short_id_is_the_random_end_of_a_uuid() {
    let id = "019ae4c2-7b1d-7a3e-9c41-5d2e8f0a1b3c";
    assert_eq!(short_id(id), "5d2e8f0a1b3c");
    assert!(is_short_id(short_id(id)));
    assert_eq!(short_id("abc"), "abc");
    // Not 12 hex digits: a name or a prefix, not a short id.
    for key in [
        "5d2e8f0a1b3",
        "5d2e8f0a1b3c0",
        "5d2e8f0a1b3g",
        "train-resnet",
        "%%%%%%%%%%%%",
    ] {
        assert!(!is_short_id(key), "{key}");
    }
}

pub(crate) fn spec() -> JobSpec {
    JobSpec {
        tenant: TenantName::parse("tenant", "team-a").expect("valid"),
        name: "train".into(),
        cpu_milli: 0,
        memory_bytes: 0,
        gpus: 1,
        gpu_milli: None,
        gpu_memory_bytes: None,
        gpu_models: Vec::new(),
        priority: 0,
        preemptible: true,
        isolation: None,
        class: None,
        max_retries: 0,
        command: vec!["sh".into(), "-c".into(), "echo hi".into()],
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
        image: None,
        network: JobNetwork::Private,
        replicas: 1,
        pack: None,
        array: None,
        dependencies: vec![],
    }
}

/// A stored job of [`spec`] in `state`, at its first attempt.
pub(crate) fn stored(id: &str, state: JobState) -> Job {
    let at = DateTime::<Utc>::from_timestamp(1_790_000_000, 0).expect("time");
    Job {
        id: id.into(),
        tenant_id: "t".into(),
        spec: spec(),
        state,
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
        created_at: at,
        updated_at: at,
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

#[test]
fn a_gang_has_from_one_to_the_most_replicas_and_no_mig_or_resizing() {
    let fields = |s: JobSpec| {
        s.validate()
            .err()
            .map(|e| e.0.into_iter().map(|f| f.field).collect::<Vec<_>>())
    };
    assert_eq!(
        fields(JobSpec {
            replicas: 4,
            ..spec()
        }),
        None
    );
    assert_eq!(
        fields(JobSpec {
            replicas: 0,
            ..spec()
        }),
        Some(vec!["replicas".to_owned()])
    );
    assert_eq!(
        fields(JobSpec {
            replicas: MAX_REPLICAS + 1,
            ..spec()
        }),
        Some(vec!["replicas".to_owned()])
    );
    assert_eq!(
        fields(JobSpec {
            replicas: 2,
            mig_profile: Some("1g.18gb".into()),
            ..spec()
        }),
        Some(vec!["replicas".to_owned()])
    );
    assert_eq!(
        fields(JobSpec {
            replicas: 2,
            gpu_milli: Some(500),
            gpu_resizable: true,
            gpu_sizing: Default::default(),
            ..spec()
        }),
        Some(vec!["gpu_resizable".to_owned()])
    );
}

#[test]
fn a_compute_mode_is_for_a_share_of_a_gpu() {
    let check = |milli: Option<u32>| {
        JobSpec {
            gpu_milli: milli,
            gpu_compute: Some(crate::GpuCompute::Elastic),
            ..spec()
        }
        .validate()
        .err()
        .map(|e| e.0.into_iter().map(|f| f.field).collect::<Vec<_>>())
    };
    assert_eq!(check(Some(300)), None);
    assert_eq!(check(None), Some(vec!["gpu_compute".to_owned()]));
    assert_eq!(check(Some(1000)), Some(vec!["gpu_compute".to_owned()]));
}

#[test]
fn a_mig_job_names_a_known_profile_and_asks_for_nothing_else() {
    let mig = |f: fn(&mut JobSpec)| {
        let mut s = JobSpec {
            mig_profile: Some("1g.18gb".into()),
            ..spec()
        };
        f(&mut s);
        s.validate()
            .err()
            .map(|e| e.0.into_iter().map(|f| f.field).collect::<Vec<_>>())
    };
    assert_eq!(mig(|_| {}), None);
    assert_eq!(mig(|s| s.mig_profile = Some("1G.10GB".into())), None);
    assert_eq!(mig(|s| s.isolation = Some(Isolation::Mig)), None);
    assert_eq!(
        mig(|s| s.mig_profile = Some("1g.99gb".into())),
        Some(vec!["mig_profile".to_owned()])
    );
    assert_eq!(mig(|s| s.gpus = 2), Some(vec!["mig_profile".to_owned()]));
    assert_eq!(
        mig(|s| s.gpu_milli = Some(500)),
        Some(vec!["mig_profile".to_owned()])
    );
    assert_eq!(
        mig(|s| s.isolation = Some(Isolation::Dedicated)),
        Some(vec!["isolation".to_owned()])
    );
}

#[test]
fn legal_paths_through_the_state_machine() {
    use JobState::*;
    assert!(Pending.can_become(Scheduled));
    assert!(Scheduled.can_become(Running));
    assert!(Running.can_become(Succeeded));
    assert!(Running.can_become(Cancelled));
    assert!(Pending.can_become(Cancelled));
    for terminal in [Succeeded, Failed, Cancelled] {
        for next in JobState::ALL {
            assert!(!terminal.can_become(next), "{terminal} -> {next}");
        }
    }
    assert_eq!(
        Pending.transition(Running),
        Err(TransitionError {
            from: Pending,
            to: Running
        })
    );
}

#[test]
fn valid_spec_passes() {
    assert_eq!(spec().validate(), Ok(()));
}

#[test]
fn the_runtimes_directory_is_no_working_directory() {
    for dir in ["/.allot", "/.allot/init", "/tmp/../.allot"] {
        let mut s = spec();
        s.workdir = Some(dir.into());
        let err = s.validate().expect_err(dir);
        assert_eq!(err.0[0].field, "workdir", "{dir}");
    }
    let mut s = spec();
    s.workdir = Some("/.allotment".into());
    assert_eq!(s.validate(), Ok(()));
}

#[test]
fn every_broken_rule_is_named() {
    let mut s = spec();
    s.name = String::new();
    s.gpus = MAX_JOB_GPUS + 1;
    s.command = vec![];
    s.env.insert("ALLOT_JOB_ID".into(), "x".into());
    s.env.insert("1BAD".into(), "x".into());
    s.workdir = Some("relative".into());
    let err = s.validate().expect_err("invalid");
    let fields: Vec<_> = err.0.iter().map(|e| e.field.as_str()).collect();
    for f in [
        "name",
        "gpus",
        "command",
        "env.ALLOT_JOB_ID",
        "env.1BAD",
        "workdir",
    ] {
        assert!(fields.contains(&f), "{f} missing from {fields:?}");
    }
}

#[test]
fn a_fraction_is_of_one_gpu() {
    let mut s = spec();
    s.gpu_milli = Some(300);
    assert_eq!(s.validate(), Ok(()));
    s.gpus = 2;
    assert_eq!(
        s.validate().expect_err("two fractions").0[0].field,
        "gpu_milli"
    );
    s.gpu_milli = Some(1000);
    assert_eq!(s.validate(), Ok(()));
    s.gpu_milli = Some(1001);
    assert_eq!(
        s.validate().expect_err("above a GPU").0[0].field,
        "gpu_milli"
    );
    s.gpu_milli = None;
    s.priority = 5000;
    s.gpu_models = vec![String::new()];
    let err = s.validate().expect_err("invalid");
    let fields: Vec<_> = err.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["gpu_models[0]", "priority"]);
}

#[test]
fn gpu_memory_needs_gpus() {
    let mut s = spec();
    s.gpus = 0;
    s.gpu_memory_bytes = Some(1 << 30);
    assert_eq!(
        s.validate().expect_err("invalid").0[0].field,
        "gpu_memory_bytes"
    );
}

mod elapsed {
    use super::super::{Elapsed, JobState, elapsed};
    use chrono::{Duration, TimeZone, Utc};

    #[test]
    fn each_phase_is_timed_from_where_it_began() {
        let t0 = Utc
            .with_ymd_and_hms(2026, 12, 1, 12, 0, 0)
            .single()
            .expect("time");
        let at = |m: i64| t0 + Duration::minutes(m);
        let now = at(60);
        let of = |state, attempt, started, finished| {
            let (phase, span) = elapsed(state, attempt, at(0), at(30), started, finished, now);
            (phase, span.num_minutes())
        };
        assert_eq!(
            of(JobState::Running, 1, Some(at(10)), None),
            (Elapsed::Running, 50)
        );
        assert_eq!(
            of(JobState::Succeeded, 1, Some(at(10)), Some(at(40))),
            (Elapsed::Ran, 30)
        );
        assert_eq!(
            of(JobState::Cancelled, 1, None, Some(at(5))),
            (Elapsed::EndedUnstarted, 5)
        );
        assert_eq!(of(JobState::Pending, 1, None, None), (Elapsed::Waiting, 60));
        // A requeued attempt waits from its requeue, whatever its first attempt ran.
        assert_eq!(
            of(JobState::Pending, 2, Some(at(10)), Some(at(30))),
            (Elapsed::Waiting, 30)
        );
        assert_eq!(
            of(JobState::Scheduled, 1, None, None),
            (Elapsed::InState, 30)
        );
    }
}
