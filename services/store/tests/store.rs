//! Repository behaviour, each test run against both SQLite and PostgreSQL.

use std::sync::Arc;

use allot_domain::{
    AuditContext, BindingSubject, Clock, FixedClock, GpuDevice, Isolation, JobSpec, JobState,
    PendingReason, Quota, ResourceLimits, Resources, Role, RoleBinding, TenantName, WorkloadClass,
};
use allot_store::testing::{Backend, TestDb};
use allot_store::{
    Admission, AuditRepo, AuthFailureRepo, EnrollmentRepo, IdentityRepo, JobFilter, JobRepo,
    JobUpdate, NewBinding, NewBootstrapToken, NewJob, NewNodeCertificate, NewToken,
    NodeRegistration, NodeRepo, SignIn, Store, StoreError, TenantRepo, TenantScope, TokenRepo,
};
use chrono::{Duration, TimeZone, Utc};

/// Defines `<name>_sqlite` and `<name>_postgres` from one async body taking a store and clock.
macro_rules! both_backends {
    ($name:ident, |$store:ident, $clock:ident| $body:block) => {
        mod $name {
            use super::*;

            async fn run(backend: Backend) {
                let db = TestDb::new(backend).await.expect("test database");
                let $clock = Arc::new(FixedClock::new(
                    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
                        .single()
                        .expect("time"),
                ));
                let $store: Store = db.store($clock.clone()).await.expect("store");
                $body
            }

            #[tokio::test]
            async fn sqlite() {
                run(Backend::Sqlite).await;
            }

            #[tokio::test]
            async fn postgres() {
                run(Backend::Postgres).await;
            }
        }
    };
}

/// Checks that a log's head root is the tree over its stored entries; returns its size.
async fn head_matches_entries(store: &Store, log: &str) -> u64 {
    let head = store.audit_head(log).await.expect("head");
    let leaves = store
        .audit_leaf_hashes(log, head.size)
        .await
        .expect("leaves");
    assert_eq!(allot_audit::merkle::root(&leaves), head.root, "{log}");
    head.size
}

fn ctx() -> AuditContext {
    AuditContext::system("store-test")
}

fn name(s: &str) -> TenantName {
    TenantName::parse("name", s).expect("valid name")
}

fn spec(tenant: &str, gpus: u32) -> JobSpec {
    JobSpec {
        tenant: name(tenant),
        name: "train".into(),
        cpu_milli: 4000,
        memory_bytes: 64 << 30,
        gpus,
        gpu_milli: None,
        gpu_memory_bytes: Some(80 << 30),
        gpu_models: vec!["H200".into()],
        priority: 100,
        preemptible: false,
        isolation: Some(Isolation::Dedicated),
        class: Some(WorkloadClass::Training),
        max_retries: 2,
        command: vec!["python".into(), "train.py".into()],
        env: [("EPOCHS".to_owned(), "3".to_owned())].into(),
        workdir: Some("/work".into()),
        checkpoint_dir: Some("/shared/ckpt".into()),
        volumes: vec![allot_domain::VolumeMount {
            volume: "shared".into(),
            path: "/shared".into(),
            read_only: false,
        }],
        secrets: vec![allot_domain::SecretUse {
            secret: "db-password".into(),
            env: Some("DB_PASSWORD".into()),
            file: None,
        }],
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

both_backends!(tenants_and_quotas, |store, _clock| {
    let t = store
        .create_tenant(
            &ctx(),
            &name("team-a"),
            None,
            Quota {
                guaranteed: Resources {
                    gpu_milli: 7500,
                    cpu_milli: 64_000,
                    memory_bytes: 1 << 40,
                    gpu_memory_bytes: 1 << 39,
                },
                limit: ResourceLimits {
                    gpu_milli: Some(8000),
                    gpu_memory_bytes: Some(1 << 40),
                    ..ResourceLimits::default()
                },
                weight: 3,
                min_isolation: Isolation::Mig,
                mig_limits: [("1g.18gb".to_owned(), 3)].into(),
                gpu_hour_budget_milli: Some(2_500),
            },
        )
        .await
        .expect("create");
    assert_eq!(t.quota.limit.gpu_milli, Some(8000));
    assert_eq!(t.quota.guaranteed.gpu_milli, 7500);
    assert_eq!(t.quota.mig_limits.get("1g.18gb"), Some(&3));
    assert_eq!(t.quota.gpu_hour_budget_milli, Some(2_500));
    assert_eq!((t.quota.weight, t.quota.min_isolation), (3, Isolation::Mig));
    let team = store
        .create_tenant(&ctx(), &name("team-a1"), Some(&t.id), Quota::default())
        .await
        .expect("a team");
    assert_eq!(team.parent_id.as_deref(), Some(t.id.as_str()));
    assert!(matches!(
        store
            .create_tenant(
                &ctx(),
                &name("orphan"),
                Some("no-such-id"),
                Quota::default()
            )
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store
            .create_tenant(&ctx(), &name("team-a"), None, Quota::default())
            .await,
        Err(StoreError::Conflict(_))
    ));
    let t2 = store
        .set_quota(
            &ctx(),
            "team-a",
            Quota {
                limit: ResourceLimits {
                    gpu_memory_bytes: Some(5),
                    ..ResourceLimits::default()
                },
                ..Quota::default()
            },
        )
        .await
        .expect("set quota");
    assert_eq!(t2.quota.limit.gpu_memory_bytes, Some(5));
    assert_eq!(t2.quota.limit.gpu_milli, None);
    assert_eq!(
        store.tenant_by_name("team-a").await.expect("get").quota,
        t2.quota
    );
    assert_eq!(
        store.tenant_by_id(&t.id).await.expect("by id").name,
        name("team-a")
    );
    assert!(matches!(
        store.tenant_by_name("nope").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.set_quota(&ctx(), "nope", Quota::default()).await,
        Err(StoreError::NotFound(_))
    ));
    store
        .create_tenant(&ctx(), &name("alpha"), None, Quota::default())
        .await
        .expect("create");
    let names: Vec<_> = store
        .list_tenants()
        .await
        .expect("list")
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["alpha", "team-a", "team-a1"]);
});

both_backends!(jobs_move_through_the_state_machine, |store, clock| {
    let t = store
        .create_tenant(&ctx(), &name("t"), None, Quota::default())
        .await
        .expect("tenant");
    let job = store
        .create_job(
            &ctx(),
            NewJob {
                traceparent: None,
                submitted_by: None,
                tenant_id: t.id.clone(),
                spec: spec("t", 2),
            },
        )
        .await
        .expect("create");
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.spec, spec("t", 2));
    // Counted by tenant and state, as the metrics report them.
    assert_eq!(
        store.count_jobs_by_state().await.expect("count"),
        vec![(t.id.clone(), JobState::Pending, 1)]
    );

    let reason = PendingReason {
        code: "X".into(),
        message: "waiting".into(),
    };
    store
        .set_pending_reason(&job.id, Some(reason.clone()))
        .await
        .expect("reason");
    assert_eq!(
        store
            .job(&TenantScope::All, &job.id)
            .await
            .expect("get")
            .pending_reason,
        Some(reason)
    );

    clock.advance(Duration::seconds(1));
    let scheduled = store
        .transition_job(
            &ctx(),
            &job.id,
            JobState::Pending,
            JobState::Scheduled,
            JobUpdate {
                node_id: Some("n1".into()),
                gpu_uuids: Some(vec!["GPU-1".into(), "GPU-2".into()]),
                ..Default::default()
            },
        )
        .await
        .expect("schedule");
    assert_eq!(
        scheduled.pending_reason, None,
        "placing a job clears its reason"
    );
    assert_eq!(scheduled.gpu_uuids, ["GPU-1", "GPU-2"]);
    assert_eq!(scheduled.scheduled_at, Some(clock.now()));

    // A stale writer that still thinks the job is pending loses.
    assert!(matches!(
        store
            .transition_job(
                &ctx(),
                &job.id,
                JobState::Pending,
                JobState::Scheduled,
                JobUpdate::default()
            )
            .await,
        Err(StoreError::Conflict(_))
    ));
    // Illegal transitions are refused before touching the database.
    assert!(matches!(
        store
            .transition_job(
                &ctx(),
                &job.id,
                JobState::Scheduled,
                JobState::Succeeded,
                JobUpdate::default()
            )
            .await,
        Err(StoreError::Conflict(_))
    ));

    clock.advance(Duration::seconds(1));
    store
        .transition_job(
            &ctx(),
            &job.id,
            JobState::Scheduled,
            JobState::Running,
            JobUpdate {
                pid: Some(4242),
                ..Default::default()
            },
        )
        .await
        .expect("run");
    clock.advance(Duration::seconds(1));
    let done = store
        .transition_job(
            &ctx(),
            &job.id,
            JobState::Running,
            JobState::Failed,
            JobUpdate {
                exit_code: Some(3),
                message: Some("exited with status 3".into()),
                log_tail: Some("boom\n".into()),
                ..Default::default()
            },
        )
        .await
        .expect("finish");
    assert_eq!(done.exit_code, Some(3));
    assert_eq!(done.pid, Some(4242));
    assert_eq!(done.log_tail.as_deref(), Some("boom\n"));
    assert_eq!(done.finished_at, Some(clock.now()));

    let events = store.job_events(&job.id).await.expect("events");
    let path: Vec<_> = events.iter().map(|e| (e.from, e.to)).collect();
    assert_eq!(
        path,
        [
            (None, JobState::Pending),
            (Some(JobState::Pending), JobState::Scheduled),
            (Some(JobState::Scheduled), JobState::Running),
            (Some(JobState::Running), JobState::Failed),
        ]
    );
    assert!(events.windows(2).all(|w| w[0].at < w[1].at));
    assert_eq!(events[3].message.as_deref(), Some("exited with status 3"));
});

both_backends!(cancelling, |store, _clock| {
    let t = store
        .create_tenant(&ctx(), &name("t"), None, Quota::default())
        .await
        .expect("tenant");
    let pending = store
        .create_job(
            &ctx(),
            NewJob {
                traceparent: None,
                submitted_by: None,
                tenant_id: t.id.clone(),
                spec: spec("t", 1),
            },
        )
        .await
        .expect("job");
    let c = store
        .request_cancel(&ctx(), &pending.id, "a test")
        .await
        .expect("cancel");
    assert_eq!(
        c.state,
        JobState::Cancelled,
        "a pending job is cancelled at once"
    );
    assert_eq!(
        store
            .request_cancel(&ctx(), &pending.id, "a test")
            .await
            .expect("again")
            .state,
        JobState::Cancelled
    );

    let running = store
        .create_job(
            &ctx(),
            NewJob {
                traceparent: None,
                submitted_by: None,
                tenant_id: t.id.clone(),
                spec: spec("t", 1),
            },
        )
        .await
        .expect("job");
    store
        .transition_job(
            &ctx(),
            &running.id,
            JobState::Pending,
            JobState::Scheduled,
            JobUpdate::default(),
        )
        .await
        .expect("schedule");
    let c = store
        .request_cancel(&ctx(), &running.id, "a test")
        .await
        .expect("cancel");
    assert_eq!(c.state, JobState::Scheduled, "the node must stop it first");
    assert!(c.cancel_requested);
    assert!(matches!(
        store.request_cancel(&ctx(), "missing", "a test").await,
        Err(StoreError::NotFound(_))
    ));
});

/// Every job's id, three a page, newest or oldest first.
async fn every_page(store: &Store, oldest_first: bool) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let (before, after) = if oldest_first {
            (None, cursor.clone())
        } else {
            (cursor.clone(), None)
        };
        let page = store
            .list_jobs(JobFilter {
                before,
                after,
                oldest_first,
                limit: Some(3),
                ..JobFilter::new(TenantScope::All)
            })
            .await
            .expect("page");
        seen.extend(page.jobs.iter().map(|j| j.id.clone()));
        match page.next {
            Some(n) => cursor = Some(n),
            None => return seen,
        }
    }
}

both_backends!(listing_filters_and_pages, |store, clock| {
    let a = store
        .create_tenant(&ctx(), &name("a"), None, Quota::default())
        .await
        .expect("a");
    let b = store
        .create_tenant(&ctx(), &name("b"), None, Quota::default())
        .await
        .expect("b");
    let mut ids = Vec::new();
    for i in 0..7 {
        clock.advance(Duration::milliseconds(5));
        let (tenant, tname) = if i % 2 == 0 { (&a, "a") } else { (&b, "b") };
        ids.push(
            store
                .create_job(
                    &ctx(),
                    NewJob {
                        traceparent: None,
                        submitted_by: None,
                        tenant_id: tenant.id.clone(),
                        spec: spec(tname, 1),
                    },
                )
                .await
                .expect("job")
                .id,
        );
    }
    store
        .transition_job(
            &ctx(),
            &ids[6],
            JobState::Pending,
            JobState::Cancelled,
            JobUpdate::default(),
        )
        .await
        .expect("cancel");

    // Newest first, three at a time, no gaps or repeats.
    let seen = every_page(&store, false).await;
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(seen, expected);

    let only_a = store
        .list_jobs(JobFilter::new(TenantScope::tenant(a.id.clone())))
        .await
        .expect("a");
    assert_eq!(only_a.jobs.len(), 4);
    assert!(only_a.jobs.iter().all(|j| j.spec.tenant.as_str() == "a"));
    // A job outside the scope is missing, and an empty scope reads nothing.
    let other = seen
        .iter()
        .find(|id| !only_a.jobs.iter().any(|j| &j.id == *id))
        .expect("a job of another tenant");
    assert!(matches!(
        store.job(&TenantScope::tenant(a.id.clone()), other).await,
        Err(StoreError::NotFound(_))
    ));
    let none = store
        .list_jobs(JobFilter::new(TenantScope::Tenants(vec![])))
        .await
        .expect("empty scope");
    assert!(none.jobs.is_empty());
    let cancelled = store
        .list_jobs(JobFilter {
            states: vec![JobState::Cancelled],
            ..JobFilter::new(TenantScope::All)
        })
        .await
        .expect("cancelled");
    assert_eq!(cancelled.jobs.len(), 1);
    assert_eq!(cancelled.jobs[0].id, ids[6]);

    // Oldest first, paged on with `after`, and counted whatever the page.
    let seen = every_page(&store, true).await;
    assert_eq!(seen, ids);
    let count = |f: JobFilter| async { store.count_jobs(f).await.expect("count") };
    assert_eq!(count(JobFilter::new(TenantScope::All)).await, 7);
    assert_eq!(
        count(JobFilter {
            limit: Some(2),
            before: Some(ids[3].clone()),
            ..JobFilter::new(TenantScope::tenant(a.id.clone()))
        })
        .await,
        4
    );

    // A name search matches part of a name in either case, and what is typed literally:
    // `%` and `_` are no wildcards.
    for n in ["ResNet_50%", "resnet-x"] {
        let mut s = spec("a", 1);
        s.name = n.into();
        store
            .create_job(
                &ctx(),
                NewJob {
                    traceparent: None,
                    submitted_by: None,
                    tenant_id: a.id.clone(),
                    spec: s,
                },
            )
            .await
            .expect("job");
    }
    let named = |part: &str| {
        let part = part.to_owned();
        async {
            let mut names: Vec<String> = store
                .list_jobs(JobFilter {
                    name_contains: Some(part),
                    ..JobFilter::new(TenantScope::All)
                })
                .await
                .expect("search")
                .jobs
                .into_iter()
                .map(|j| j.spec.name)
                .collect();
            names.sort();
            names
        }
    };
    assert_eq!(named("RESNET").await, ["ResNet_50%", "resnet-x"]);
    assert_eq!(named("_50%").await, ["ResNet_50%"]);
    assert_eq!(
        named("_x").await,
        Vec::<String>::new(),
        "`_` is no wildcard"
    );
    assert_eq!(named("%").await, ["ResNet_50%"]);
});

both_backends!(tokens, |store, clock| {
    assert_eq!(store.count_admin_tokens().await.expect("count"), 0);
    let t = store
        .create_tenant(&ctx(), &name("t"), None, Quota::default())
        .await
        .expect("tenant");
    let admin = store
        .create_token(
            &ctx(),
            NewToken {
                name: "root".into(),
                tenant_id: None,
                role: Role::Admin,
                secret_hash: "a".repeat(64),
                expires_at: None,
            },
        )
        .await
        .expect("admin");
    let member = store
        .create_token(
            &ctx(),
            NewToken {
                name: "ci".into(),
                tenant_id: Some(t.id.clone()),
                role: Role::Member,
                secret_hash: "b".repeat(64),
                expires_at: Some(clock.now() + Duration::hours(1)),
            },
        )
        .await
        .expect("member");
    assert_eq!(store.count_admin_tokens().await.expect("count"), 1);

    clock.advance(Duration::minutes(1));
    let (used, version) = store
        .use_token(&"b".repeat(64))
        .await
        .expect("use")
        .expect("found");
    assert_eq!(used.id, member.id);
    // The tenants' version comes with it, as the versioned tree reads it; a change to a
    // tenant moves it.
    let (tree_version, _) = store.versioned_tenant_tree().await.expect("tree");
    assert_eq!(version, tree_version);
    assert_eq!(
        store
            .token(&TenantScope::All, &member.id)
            .await
            .expect("get")
            .last_used_at,
        Some(clock.now())
    );
    // Kept to the minute: a use within a minute of the recorded one writes nothing.
    let first_use = clock.now();
    clock.advance(Duration::seconds(30));
    store.use_token(&"b".repeat(64)).await.expect("use again");
    let last = |store: &Store| {
        let (store, id) = (store.clone(), member.id.clone());
        async move {
            store
                .token(&TenantScope::All, &id)
                .await
                .expect("get")
                .last_used_at
        }
    };
    assert_eq!(last(&store).await, Some(first_use));
    clock.advance(Duration::seconds(31));
    store.use_token(&"b".repeat(64)).await.expect("a minute on");
    assert_eq!(last(&store).await, Some(clock.now()));
    assert!(
        store
            .use_token(&"c".repeat(64))
            .await
            .expect("use")
            .is_none()
    );

    // Read in groups: concurrent requests answered each with its own token (or none),
    // the same token asked for twice answered twice.
    let (reader, _task) = allot_store::TokenReader::start(store.clone(), 16);
    let [ha, hb, hc] = ["a", "b", "c"].map(|c| c.repeat(64));
    let (a, b, b_again, unknown) = tokio::join!(
        reader.use_token(&ha),
        reader.use_token(&hb),
        reader.use_token(&hb),
        reader.use_token(&hc),
    );
    let id = |r: Result<Option<(allot_domain::ApiToken, i64)>, StoreError>| {
        r.expect("read").map(|(t, _)| t.id)
    };
    assert_eq!(id(a), Some(admin.id.clone()));
    assert_eq!(id(b), Some(member.id.clone()));
    assert_eq!(id(b_again), Some(member.id.clone()));
    assert_eq!(id(unknown), None);

    let revoked = store
        .revoke_token(&ctx(), &TenantScope::tenant(t.id.clone()), &member.id)
        .await
        .expect("revoke");
    assert!(!revoked.is_usable(clock.now()));
    // A read after the revocation sees it.
    let (after, _) = reader
        .use_token(&"b".repeat(64))
        .await
        .expect("read")
        .expect("found");
    assert!(!after.is_usable(clock.now()));
    let of_t = TenantScope::tenant(t.id.clone());
    assert_eq!(store.list_tokens(&of_t).await.expect("list").len(), 1);
    assert_eq!(
        store
            .list_tokens(&TenantScope::All)
            .await
            .expect("list")
            .len(),
        2
    );
    // A tenant's scope never reaches a platform-wide token.
    assert!(matches!(
        store.token(&of_t, &admin.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.revoke_token(&ctx(), &of_t, &admin.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(admin.is_usable(clock.now() + Duration::days(3650)));
    // Secret hashes are unique.
    assert!(matches!(
        store
            .create_token(
                &ctx(),
                NewToken {
                    name: "dup".into(),
                    tenant_id: None,
                    role: Role::Admin,
                    secret_hash: "a".repeat(64),
                    expires_at: None,
                }
            )
            .await,
        Err(StoreError::Conflict(_))
    ));
});

both_backends!(
    a_registration_sent_again_for_its_key_is_a_retry,
    |store, clock| {
        // An agent's registration timed out after the control plane committed it: the token is
        // spent and the certificate never arrived. The same request again (same node, same key)
        // is that registration, not a second use; nothing else is.
        for hash in ["r1", "r2"] {
            store
                .create_bootstrap_token(
                    &ctx(),
                    NewBootstrapToken {
                        secret_hash: hash.repeat(32),
                        description: String::new(),
                        expires_at: clock.now() + Duration::hours(1),
                        node_name: "n*".into(),
                        replace: false,
                    },
                )
                .await
                .expect("token");
        }
        let reg = |hash: &str, name: &str, key: &str, serial: &str| NodeRegistration {
            cpu_milli: 8_000,
            memory_bytes: 64 << 30,
            name: name.into(),
            admission: Admission::BootstrapToken {
                secret_hash: hash.repeat(32),
                key: key.into(),
            },
            certificate: NewNodeCertificate {
                serial: serial.into(),
                issued_at: clock.now(),
                expires_at: clock.now() + Duration::hours(24),
            },
            agent_version: "0.1.0".into(),
            gpu_backend: "simulated".into(),
            runtime: "process".into(),
            gpus: vec![],
            lease_expires_at: clock.now() + Duration::seconds(15),
            address: String::new(),
        };
        let current = |serial: &'static str| {
            let (store, now) = (&store, clock.now());
            async move { store.node_by_certificate(serial, now).await.expect("read") }
        };
        let first = store
            .register_node(&ctx(), reg("r1", "n1", "k1", "c1"))
            .await
            .expect("registered");
        clock.advance(Duration::seconds(5));
        let retry = store
            .register_node(&ctx(), reg("r1", "n1", "k1", "c2"))
            .await
            .expect("the same registration, sent again");
        assert_eq!(retry.id, first.id, "the same node");
        assert!(
            current("c1").await.is_none(),
            "the lost answer's certificate is revoked"
        );
        assert_eq!(current("c2").await.map(|n| n.id), Some(first.id.clone()));
        // Another key, or another name the token's pattern would have admitted, is a second
        // use: refused, and the node's certificate still stands.
        for (name, key) in [("n1", "k2"), ("n2", "k1")] {
            let refused = store
                .register_node(&ctx(), reg("r1", name, key, "c3"))
                .await;
            assert!(
                matches!(&refused, Err(StoreError::Refused(m)) if m.contains("already used")),
                "{name} {key}: {refused:?}"
            );
        }
        assert!(current("c2").await.is_some());
        // Past the retry window, the same request is a second use too.
        clock.advance(allot_store::REGISTRATION_RETRY_WINDOW);
        let late = store
            .register_node(&ctx(), reg("r1", "n1", "k1", "c4"))
            .await;
        assert!(matches!(late, Err(StoreError::Refused(_))), "{late:?}");
        assert!(current("c2").await.is_some());
        // A node revoked by an admin is not brought back by its spent token, even at once and
        // with its own key.
        let n3 = store
            .register_node(&ctx(), reg("r2", "n3", "k3", "c5"))
            .await
            .expect("registered");
        store.revoke_node(&ctx(), &n3.id).await.expect("revoked");
        let back = store
            .register_node(&ctx(), reg("r2", "n3", "k3", "c6"))
            .await;
        assert!(matches!(back, Err(StoreError::Refused(_))), "{back:?}");
        assert!(current("c6").await.is_none());
    }
);

both_backends!(nodes_register_and_heartbeat, |store, clock| {
    // GPU 1 is in MIG mode, with one instance.
    let gpu = |i: u32| GpuDevice {
        uuid: format!("GPU-n1-{i}"),
        index: i,
        model: "H200".into(),
        memory_bytes: 141 << 30,
        healthy: true,
        degraded: false,
        memory_enforcement: Default::default(),
        nvlink_domain: Some(0),
        mig: (i == 1).then(|| {
            vec![allot_domain::MigSlot {
                profile: 19,
                start: 0,
                uuid: "MIG-n1-1-0".into(),
            }]
        }),
    };
    let token = |hash: &str, ttl: i64| NewBootstrapToken {
        secret_hash: hash.repeat(32),
        description: "rack 4".into(),
        expires_at: clock.now() + Duration::seconds(ttl),
        node_name: "n*".into(),
        // t2 is the admin's explicit replace of n1.
        replace: hash == "t2",
    };
    let reg = |admission: Admission, serial: &str, gpus: Vec<GpuDevice>, version: &str| {
        NodeRegistration {
            cpu_milli: 64_000,
            memory_bytes: 512 << 30,
            name: "n1".into(),
            admission,
            certificate: NewNodeCertificate {
                serial: serial.into(),
                issued_at: clock.now(),
                expires_at: clock.now() + Duration::hours(24),
            },
            agent_version: version.into(),
            gpu_backend: "simulated".into(),
            runtime: "process".into(),
            gpus,
            lease_expires_at: clock.now() + Duration::seconds(15),
            address: String::new(),
        }
    };
    // Each registration is for a key of its own (`key`), as each agent's is.
    let by_token = |hash: &str, key: &str| Admission::BootstrapToken {
        secret_hash: hash.repeat(32),
        key: key.into(),
    };
    let by_cert = |serial: &str| Admission::Certificate {
        serial: serial.into(),
    };
    store
        .create_bootstrap_token(&ctx(), token("t1", 3600))
        .await
        .expect("token");
    store
        .create_bootstrap_token(&ctx(), token("t2", 3600))
        .await
        .expect("token");
    store
        .create_bootstrap_token(&ctx(), token("t3", 3600))
        .await
        .expect("token");
    store
        .create_bootstrap_token(&ctx(), token("t0", -1))
        .await
        .expect("expired token");

    // Neither an unknown nor an expired token, nor a certificate of a node never
    // registered, admits anyone.
    for admission in [by_token("xx", "k0"), by_token("t0", "k0"), by_cert("c0")] {
        let refused = store
            .register_node(&ctx(), reg(admission, "c0", vec![], "0.1.0"))
            .await;
        assert!(
            matches!(refused, Err(StoreError::Refused(_))),
            "{refused:?}"
        );
    }
    let node = store
        .register_node(
            &ctx(),
            reg(by_token("t1", "k1"), "c1", vec![gpu(0), gpu(1)], "0.1.0"),
        )
        .await
        .expect("register");
    assert_eq!(node.gpus.len(), 2);
    let cert = store
        .node_certificate("c1")
        .await
        .expect("read")
        .expect("recorded");
    assert_eq!(cert.node_id, node.id);
    assert!(cert.current(clock.now()));
    // What authenticates an agent's calls: the node, with its GPUs in order, while the
    // certificate is current; nothing for an unknown or expired one.
    let authenticated = store
        .node_by_certificate("c1", clock.now())
        .await
        .expect("read")
        .expect("current");
    assert_eq!(
        (authenticated.id.as_str(), authenticated.gpus),
        (node.id.as_str(), vec![gpu(0), gpu(1)])
    );
    for (serial, at) in [("c0", clock.now()), ("c1", cert.expires_at)] {
        let none = store.node_by_certificate(serial, at).await.expect("read");
        assert!(none.is_none(), "{serial}: {none:?}");
    }
    // The token is spent.
    let reused = store
        .register_node(&ctx(), reg(by_token("t1", "k9"), "c9", vec![], "0.1.0"))
        .await;
    assert!(matches!(reused, Err(StoreError::Refused(_))), "{reused:?}");
    let listed = store.list_bootstrap_tokens().await.expect("list");
    let t1 = listed
        .iter()
        .find(|t| t.used_by.as_deref() == Some("n1"))
        .expect("used");
    assert_eq!(t1.used_at, Some(clock.now()));

    // Re-registering with its certificate keeps the identity, and records the new one.
    let again = store
        .register_node(&ctx(), reg(by_cert("c1"), "c2", vec![gpu(0)], "0.1.1"))
        .await
        .expect("re-register");
    assert_eq!(again.id, node.id);
    assert!(
        store
            .node_certificate("c1")
            .await
            .expect("read")
            .expect("kept")
            .current(clock.now())
    );

    // A token not made to replace a node does not take over its name.
    let refused = store
        .register_node(
            &ctx(),
            reg(by_token("t3", "k3"), "c3", vec![gpu(0)], "0.1.1"),
        )
        .await;
    assert!(
        matches!(&refused, Err(StoreError::Refused(m)) if m.contains("already registered")),
        "{refused:?}"
    );
    // One made to replace it does: its earlier certificates stop authenticating.
    store
        .register_node(
            &ctx(),
            reg(by_token("t2", "k3"), "c3", vec![gpu(0)], "0.1.1"),
        )
        .await
        .expect("taken over");
    for old in ["c1", "c2"] {
        let c = store
            .node_certificate(old)
            .await
            .expect("read")
            .expect("kept");
        assert!(!c.current(clock.now()), "{old} still current");
        let revoked = store.node_by_certificate(old, clock.now()).await;
        assert!(matches!(revoked, Ok(None)), "{old}: {revoked:?}");
        let refused = store
            .register_node(&ctx(), reg(by_cert(old), "c4", vec![], "0.1.1"))
            .await;
        assert!(
            matches!(refused, Err(StoreError::Refused(_))),
            "{refused:?}"
        );
    }
    // Renewal adds a certificate; revoking the node revokes every current one.
    store
        .add_node_certificate(
            &ctx(),
            &node.id,
            NewNodeCertificate {
                serial: "c5".into(),
                issued_at: clock.now(),
                expires_at: clock.now() + Duration::hours(1),
            },
        )
        .await
        .expect("renewed");
    assert_eq!(
        store.revoke_node(&ctx(), &node.id).await.expect("revoked"),
        2
    );
    assert!(
        !store
            .node_certificate("c5")
            .await
            .expect("read")
            .expect("kept")
            .current(clock.now())
    );
    assert!(matches!(
        store.revoke_node(&ctx(), "missing").await,
        Err(StoreError::NotFound(_))
    ));
    let t3 = store
        .list_bootstrap_tokens()
        .await
        .expect("list")
        .into_iter()
        .find(|t| t.used_at.is_none() && t.expires_at > clock.now())
        .expect("t3");
    store
        .delete_bootstrap_token(&ctx(), &t3.id)
        .await
        .expect("deleted");
    let gone = store
        .register_node(&ctx(), reg(by_token("t3", "k6"), "c6", vec![], "0.1.1"))
        .await;
    assert!(matches!(gone, Err(StoreError::Refused(_))), "{gone:?}");
    // The registration that took the node over with token t2 is the one in force.
    store
        .register_node(
            &ctx(),
            NodeRegistration {
                name: "n1".into(),
                ..reg(by_token("t2", "k7"), "c7", vec![], "0.1.1")
            },
        )
        .await
        .expect_err("t2 is spent");
    let node = store.node(&node.id).await.expect("node");
    store
        .heartbeat(
            &node.id,
            Some(vec![gpu(0), gpu(1)]),
            clock.now() + Duration::seconds(15),
        )
        .await
        .expect("heartbeat");

    clock.advance(Duration::seconds(5));
    let mut sick = gpu(0);
    sick.healthy = false;
    let mut suspect = gpu(1);
    suspect.degraded = true;
    let beat = store
        .heartbeat(
            &node.id,
            Some(vec![sick.clone(), suspect.clone()]),
            clock.now() + Duration::seconds(15),
        )
        .await
        .expect("heartbeat");
    assert_eq!(beat.last_heartbeat_at, clock.now());
    let listed = store.list_nodes().await.expect("list");
    assert_eq!(listed.len(), 1);
    // Counted ready while its lease stands, not once it lapsed.
    let ready = |at| store.count_ready_nodes(at);
    assert_eq!(ready(clock.now()).await.expect("count"), 1);
    assert_eq!(
        ready(clock.now() + Duration::seconds(15))
            .await
            .expect("count"),
        0
    );
    assert_eq!(listed[0].gpus, vec![sick.clone(), suspect.clone()]);
    assert_eq!(listed[0].agent_version, "0.1.1");
    // A heartbeat without inventory keeps the one reported last.
    let beat = store
        .heartbeat(&node.id, None, clock.now() + Duration::seconds(15))
        .await
        .expect("heartbeat without inventory");
    assert_eq!(beat.gpus, vec![sick, suspect]);
    assert!(matches!(
        store.heartbeat("missing", None, clock.now()).await,
        Err(StoreError::NotFound(_))
    ));

    // Heartbeats group-committed: a lease, a changed inventory and samples written with
    // the group; a beat of a node that is gone fails alone.
    // Written through a leader's handle only: a replica that leads no term writes none.
    use allot_store::LeadershipRepo;
    let (followers, _task) = allot_store::BeatBatcher::start(|| None, 64);
    let refused = followers
        .write(allot_store::Beat {
            node_id: node.id.clone(),
            lease_expires_at: clock.now() + Duration::seconds(600),
            gpus: None,
            samples: None,
            unavailable: None,
        })
        .await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
    let term = store
        .acquire("beats", "one", "", Duration::seconds(600))
        .await
        .expect("campaign")
        .expect("the lease is free");
    let leader = store.fenced(&term);
    let (beats, _task) = allot_store::BeatBatcher::start(move || Some(leader.clone()), 64);
    clock.advance(Duration::seconds(5));
    let sample = allot_domain::GpuSample {
        utilization: 0.5,
        ..Default::default()
    };
    let until = clock.now() + Duration::seconds(15);
    let (ours, gone) = tokio::join!(
        beats.write(allot_store::Beat {
            node_id: node.id.clone(),
            lease_expires_at: until,
            gpus: Some(vec![gpu(0)]),
            samples: Some((clock.now(), vec![("GPU-n1-0".into(), sample)])),
            unavailable: Some("low on disk".into()),
        }),
        beats.write(allot_store::Beat {
            node_id: "missing".into(),
            lease_expires_at: until,
            gpus: None,
            samples: None,
            unavailable: None,
        }),
    );
    ours.expect("the node's beat");
    assert!(matches!(gone, Err(StoreError::NotFound(_))), "{gone:?}");
    let beaten = store.node(&node.id).await.expect("node");
    assert_eq!(beaten.lease_expires_at, until);
    assert_eq!(beaten.last_heartbeat_at, clock.now());
    assert_eq!(beaten.gpus, vec![gpu(0)]);
    assert_eq!(
        beaten.unavailable, "low on disk",
        "what the node said of itself"
    );
    use allot_store::SampleRepo;
    let points = store
        .gpu_samples(Some("GPU-n1-0"), 10, clock.now() - Duration::minutes(1))
        .await
        .expect("samples");
    assert_eq!(points.len(), 1, "{points:?}");
    // Samples naming one GPU twice cannot be bucketed in one statement (PostgreSQL); the
    // lease is renewed all the same.
    clock.advance(Duration::seconds(5));
    let until = clock.now() + Duration::seconds(15);
    beats
        .write(allot_store::Beat {
            node_id: node.id.clone(),
            lease_expires_at: until,
            gpus: None,
            samples: Some((
                clock.now(),
                vec![("GPU-n1-0".into(), sample), ("GPU-n1-0".into(), sample)],
            )),
            unavailable: Some(String::new()),
        })
        .await
        .expect("the lease renewed");
    let renewed = store.node(&node.id).await.expect("node");
    assert_eq!(renewed.lease_expires_at, until);
    assert_eq!(renewed.unavailable, "", "it takes work again");
});

both_backends!(
    submits_group_commit_and_one_that_cannot_be_written_fails_alone,
    |store, _clock| {
        let a = store
            .create_tenant(&ctx(), &name("a"), None, Quota::default())
            .await
            .expect("tenant");
        let b = store
            .create_tenant(&ctx(), &name("b"), None, Quota::default())
            .await
            .expect("tenant");
        let (submits, _task) = allot_store::SubmitBatcher::start(store.clone(), 256);
        let submit = |tenant: &allot_domain::Tenant, gpus: u32, replicas: u32| {
            let (submits, tenant) = (submits.clone(), tenant.clone());
            async move {
                let mut spec = spec(tenant.name.as_str(), gpus);
                spec.replicas = replicas;
                submits
                    .create(
                        ctx(),
                        NewJob {
                            traceparent: None,
                            submitted_by: None,
                            tenant_id: tenant.id.clone(),
                            spec,
                        },
                    )
                    .await
            }
        };
        let mut queued = Vec::new();
        for i in 0..40u32 {
            let tenant = if i % 2 == 0 { &a } else { &b };
            // One job's GPUs do not fit the column: it cannot be written.
            let gpus = if i == 7 { u32::MAX } else { 1 };
            let replicas = if i == 10 { 3 } else { 1 };
            queued.push(tokio::spawn(submit(tenant, gpus, replicas)));
        }
        let mut created = Vec::new();
        for (i, q) in queued.into_iter().enumerate() {
            let result = q.await.expect("task");
            if i == 7 {
                assert!(result.is_err(), "{result:?}");
            } else {
                let job = result.expect("created");
                assert_eq!(job.state, JobState::Pending);
                assert_eq!(
                    job.tenant_id,
                    if i % 2 == 0 { &a.id } else { &b.id }.clone()
                );
                created.push(job);
            }
        }
        assert_eq!(created.len(), 39);
        let mut ids: Vec<&str> = created.iter().map(|j| j.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 39, "each submit its own job");
        // Every job (each replica of the gang too) stored, each with its audit entry.
        let stored = store
            .list_jobs(JobFilter::new(TenantScope::All))
            .await
            .expect("list")
            .jobs;
        assert_eq!(stored.len(), 41);
        let entries =
            head_matches_entries(&store, &a.id).await + head_matches_entries(&store, &b.id).await;
        let submits_logged = store
            .search_audit(&allot_store::AuditSearch {
                action: Some("job.submit".into()),
                limit: 1000,
                ..Default::default()
            })
            .await
            .expect("search")
            .len();
        assert_eq!(submits_logged, 41);
        assert!(entries >= 41);
    }
);

both_backends!(the_pending_view_reads_what_changed, |store, clock| {
    use allot_store::PendingJobs;
    let t = store
        .create_tenant(&ctx(), &name("t"), None, Quota::default())
        .await
        .expect("tenant");
    let submit = || {
        let (store, tenant_id) = (store.clone(), t.id.clone());
        async move {
            store
                .create_job(
                    &ctx(),
                    NewJob {
                        traceparent: None,
                        submitted_by: None,
                        tenant_id,
                        spec: spec("t", 1),
                    },
                )
                .await
        }
    };
    // Ids order by their time: a second apart, they order as submitted.
    let one = submit().await.expect("one");
    clock.advance(Duration::seconds(1));
    let two = submit().await.expect("two");
    let mut view = PendingJobs::default();
    view.refresh(&store).await.expect("full read");
    let ids = |view: &PendingJobs| view.jobs().iter().map(|j| j.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&view), [two.id.clone(), one.id.clone()]);

    // One placed, one submitted: the view follows.
    clock.advance(Duration::seconds(1));
    store
        .transition_job(
            &ctx(),
            &one.id,
            JobState::Pending,
            JobState::Scheduled,
            JobUpdate::default(),
        )
        .await
        .expect("placed");
    clock.advance(Duration::seconds(1));
    let three = submit().await.expect("three");
    clock.advance(Duration::seconds(1));
    view.refresh(&store).await.expect("changes");
    assert_eq!(ids(&view), [three.id.clone(), two.id.clone()]);

    // Back in the queue, later than the overlap: read as a change all the same.
    clock.advance(PendingJobs::OVERLAP * 2);
    store
        .transition_job(
            &ctx(),
            &one.id,
            JobState::Scheduled,
            JobState::Pending,
            JobUpdate::default(),
        )
        .await
        .expect("requeued");
    clock.advance(Duration::seconds(1));
    view.refresh(&store).await.expect("changes");
    assert_eq!(
        ids(&view),
        [three.id.clone(), two.id.clone(), one.id.clone()]
    );

    // A reason the pass wrote is kept by the view (it changes no `updated_at`).
    let reason = PendingReason {
        code: "TenantLimit".into(),
        message: "at its limit".into(),
    };
    store
        .set_pending_reasons(vec![(two.id.clone(), Some(reason.clone()))])
        .await
        .expect("reasons");
    view.reasons_written(vec![(two.id.clone(), Some(reason.clone()))]);
    view.refresh(&store).await.expect("nothing new");
    assert_eq!(view.jobs()[1].pending_reason, Some(reason.clone()));

    // A change the incremental reads cannot see (stamped long before it was written, as
    // by a clock far behind) is found by the next full read.
    let stale = clock.now() - Duration::hours(1);
    let behind = Arc::new(FixedClock::new(stale));
    let late = store.with_clock(behind);
    late.transition_job(
        &ctx(),
        &three.id,
        JobState::Pending,
        JobState::Cancelled,
        JobUpdate::default(),
    )
    .await
    .expect("cancelled");
    clock.advance(Duration::seconds(1));
    view.refresh(&store).await.expect("changes");
    assert_eq!(view.jobs().len(), 3, "missed until the next full read");
    clock.advance(PendingJobs::FULL_READ_EVERY);
    view.refresh(&store).await.expect("full read");
    assert_eq!(ids(&view), [two.id.clone(), one.id.clone()]);
});

async fn restart_keeps_data(backend: Backend) {
    let db = TestDb::new(backend).await.expect("db");
    let clock = Arc::new(allot_domain::SystemClock);
    let store = db.store(clock.clone()).await.expect("first start");
    store
        .create_tenant(&ctx(), &name("keep"), None, Quota::default())
        .await
        .expect("tenant");
    store.close().await.expect("close");
    // Connecting again re-runs the migrator, which must find nothing to do.
    let store = db.store(clock).await.expect("second start");
    assert_eq!(store.list_tenants().await.expect("list").len(), 1);
}

#[tokio::test]
async fn migrations_are_idempotent_across_restarts_sqlite() {
    restart_keeps_data(Backend::Sqlite).await;
}

#[tokio::test]
async fn migrations_are_idempotent_across_restarts_postgres() {
    restart_keeps_data(Backend::Postgres).await;
}

both_backends!(
    every_change_is_audited_in_a_verifiable_append_only_log,
    |store, clock| {
        let t = store
            .create_tenant(&ctx(), &name("audited"), None, Quota::default())
            .await
            .expect("tenant");
        store
            .set_quota(
                &ctx(),
                "audited",
                Quota {
                    limit: ResourceLimits {
                        gpu_milli: Some(2000),
                        ..ResourceLimits::default()
                    },
                    ..Quota::default()
                },
            )
            .await
            .expect("quota");
        // Concurrent writers to one log still get gap-free sequence numbers.
        let mut tasks = Vec::new();
        for _ in 0..12 {
            let s = store.clone();
            let tenant = t.id.clone();
            tasks.push(tokio::spawn(async move {
                s.create_job(
                    &ctx(),
                    NewJob {
                        traceparent: None,
                        submitted_by: None,
                        tenant_id: tenant,
                        spec: spec("audited", 1),
                    },
                )
                .await
            }));
        }
        let mut ids = Vec::new();
        for task in tasks {
            ids.push(task.await.expect("join").expect("job").id);
        }
        clock.advance(Duration::seconds(1));
        store
            .request_cancel(&ctx(), &ids[0], "a test")
            .await
            .expect("cancel");

        let head = store.audit_head(&t.id).await.expect("head");
        assert_eq!(
            head.size,
            1 + 12 + 1,
            "quota, 12 submissions, 1 cancellation"
        );
        let entries = store.audit_entries(&t.id, 0, 1000).await.expect("entries");
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (0..head.size).collect::<Vec<_>>());
        let mut leaves = Vec::new();
        for e in &entries {
            let body = e.body.as_deref().expect("not pruned");
            assert_eq!(e.leaf_hash, allot_audit::merkle::leaf_hash(body.as_bytes()));
            let parsed: allot_domain::AuditEntry = serde_json::from_str(body).expect("entry json");
            assert_eq!(parsed.seq, e.seq);
            assert_eq!(parsed.log, t.id);
            assert_eq!(parsed.actor.id, "store-test");
            assert_eq!(
                parsed.canonical_bytes(),
                body.as_bytes(),
                "stored bytes are canonical"
            );
            leaves.push(e.leaf_hash);
        }
        assert_eq!(head.root, allot_audit::merkle::root(&leaves));
        let actions: Vec<String> = entries.iter().map(|e| e.action.clone()).collect();
        assert_eq!(actions[0], "tenant.quota.set");
        assert_eq!(actions[1], "job.submit");
        assert_eq!(actions.last().map(String::as_str), Some("job.transition"));

        let system = store
            .audit_entries(allot_domain::SYSTEM_LOG, 0, 10)
            .await
            .expect("system");
        assert_eq!(system.len(), 1);
        assert_eq!(system[0].action, "tenant.create");
        let heads = store.audit_heads().await.expect("heads");
        assert_eq!(heads.len(), 2);

        // A failed change records nothing.
        assert!(
            store
                .create_tenant(&ctx(), &name("audited"), None, Quota::default())
                .await
                .is_err()
        );
        assert_eq!(
            store
                .audit_head(allot_domain::SYSTEM_LOG)
                .await
                .expect("head")
                .size,
            1
        );
    }
);

async fn append_only(backend: Backend) {
    let db = TestDb::new(backend).await.expect("db");
    let store = db.store_with_system_clock().await.expect("store");
    store
        .create_tenant(&ctx(), &name("t"), None, Quota::default())
        .await
        .expect("tenant");
    let head = store.audit_head("system").await.expect("head");
    store
        .insert_checkpoint(allot_store::StoredCheckpoint {
            log: head.log,
            size: head.size,
            root: head.root,
            note: "a signed note".into(),
        })
        .await
        .expect("checkpoint");
    let raw = sea_orm::Database::connect(db.url.as_str())
        .await
        .expect("raw connection");
    use sea_orm::ConnectionTrait;
    for sql in [
        "UPDATE audit_entries SET body = '{}'",
        "DELETE FROM audit_entries",
        // Pruning must clear the whole payload and change nothing else.
        "UPDATE audit_entries SET body = NULL",
        "UPDATE audit_entries SET body = NULL, actor = NULL, target = NULL, action = 'x'",
        "UPDATE audit_entries SET body = NULL, actor = NULL, target = NULL, leaf_hash = 'ab'",
        "UPDATE audit_entries SET seq = seq + 1",
        "UPDATE audit_checkpoints SET note = ''",
    ] {
        let err = raw.execute_unprepared(sql).await.expect_err(sql);
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    let prune = "UPDATE audit_entries SET body = NULL, actor = NULL, target = NULL";
    raw.execute_unprepared(
        "INSERT INTO audit_holds (log_id, reason, set_by, set_at) \
         VALUES ('system', 'r', 'x', '2026-01-01 00:00:00+00')",
    )
    .await
    .expect("hold");
    let err = raw.execute_unprepared(prune).await.expect_err("held");
    assert!(err.to_string().contains("legal hold"), "{err}");
    raw.execute_unprepared("DELETE FROM audit_holds")
        .await
        .expect("release");
    raw.execute_unprepared(prune)
        .await
        .expect("pruning is allowed");
    let err = raw
        .execute_unprepared("UPDATE audit_entries SET body = '{}'")
        .await
        .expect_err("a pruned payload cannot come back");
    assert!(err.to_string().contains("append-only"), "{err}");
    if backend == Backend::Postgres {
        let err = raw
            .execute_unprepared("TRUNCATE audit_entries")
            .await
            .expect_err("truncate");
        assert!(err.to_string().contains("append-only"), "{err}");
    }
    let entries = store.audit_entries("system", 0, 10).await.expect("entries");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].body, None);
    assert_eq!(entries[0].action, "tenant.create");
    assert_eq!(head_matches_entries(&store, "system").await, 1);
}

/// The control plane running as the application role of `allot_migrations::roles`: its
/// work goes on, but the audit log can only grow (and be pruned as the triggers allow).
#[tokio::test]
async fn the_postgres_application_role_can_only_append_to_the_audit_log() {
    use sea_orm::ConnectionTrait;
    let db = TestDb::new(Backend::Postgres).await.expect("db");
    let owner = db.store_with_system_clock().await.expect("owner migrates");
    owner
        .create_tenant(&ctx(), &name("t"), None, Quota::default())
        .await
        .expect("tenant");
    let role = format!(
        "allot_app_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let superuser = sea_orm::Database::connect(db.url.as_str())
        .await
        .expect("superuser");
    superuser
        .execute_unprepared(&format!("CREATE ROLE {role} LOGIN PASSWORD 'app-secret'"))
        .await
        .expect("create role");
    superuser
        .execute_unprepared(&allot_migrations::postgres_app_role_grants(&role).expect("grants"))
        .await
        .expect("grants");

    let app_url = db.url_as(&role, "app-secret");
    let app = Store::connect(&app_url, Arc::new(allot_domain::SystemClock))
        .await
        .expect("the application role connects to an up-to-date schema");
    let tenant = app
        .create_tenant(&ctx(), &name("u"), None, Quota::default())
        .await
        .expect("audited change as the application role");
    app.set_quota(&ctx(), "u", Quota::default())
        .await
        .expect("another");
    assert_eq!(
        app.prune_audit(&ctx(), &tenant.id, Utc::now() + Duration::seconds(1))
            .await
            .expect("pruning is allowed"),
        1
    );
    // A takeover records its term, which the role may add but not rewrite.
    use allot_store::LeadershipRepo;
    app.acquire("a", "a-1", "", Duration::seconds(5))
        .await
        .expect("a takeover as the application role")
        .expect("the lease is free");
    assert_eq!(app.leader_terms().await.expect("terms").len(), 1);

    let raw = sea_orm::Database::connect(app_url.as_str())
        .await
        .expect("app connection");
    for sql in [
        "DELETE FROM audit_entries",
        "UPDATE audit_entries SET leaf_hash = 'x'",
        "UPDATE audit_entries SET seq = seq + 1",
        "TRUNCATE audit_entries",
        "UPDATE audit_checkpoints SET note = ''",
        "DELETE FROM audit_checkpoints",
        "UPDATE leader_terms SET started_at = started_at",
        "DELETE FROM leader_terms",
        "TRUNCATE leader_terms",
        "DELETE FROM seaql_migrations",
        "DROP TRIGGER audit_entries_no_update_delete ON audit_entries",
        "ALTER TABLE audit_entries DISABLE TRIGGER ALL",
        "SET session_replication_role = replica",
        "CREATE TABLE sneaky (x int)",
    ] {
        let err = raw.execute_unprepared(sql).await.expect_err(sql);
        let msg = err.to_string();
        assert!(
            msg.contains("permission denied") || msg.contains("must be owner"),
            "{sql}: {msg}"
        );
    }
    assert_eq!(
        head_matches_entries(&app, "system").await,
        3,
        "two tenants and a pruning"
    );
}

#[tokio::test]
async fn audit_entries_cannot_be_changed_or_removed_sqlite() {
    append_only(Backend::Sqlite).await;
}

#[tokio::test]
async fn audit_entries_cannot_be_changed_or_removed_postgres() {
    append_only(Backend::Postgres).await;
}

both_backends!(
    pruning_keeps_leaf_hashes_and_yields_to_legal_holds,
    |store, clock| {
        use allot_domain::AuditEvent;
        let events: Vec<AuditEvent> = (0..5)
            .map(|i| AuditEvent::success("t1", "job.submit", format!("job/{i}")))
            .collect();
        store
            .record_events(&ctx(), "t1", events)
            .await
            .expect("old");
        clock.advance(Duration::days(40));
        let cutoff = clock.now() - Duration::days(30);
        store
            .record_event(&ctx(), AuditEvent::success("t1", "job.submit", "job/new"))
            .await
            .expect("new");
        let head = store.audit_head("t1").await.expect("head");

        store
            .set_legal_hold(&ctx(), "t1", "matter 7")
            .await
            .expect("hold");
        assert!(matches!(
            store.set_legal_hold(&ctx(), "t1", "again").await,
            Err(StoreError::Conflict(_))
        ));
        assert!(matches!(
            store.prune_audit(&ctx(), "t1", cutoff).await,
            Err(StoreError::Conflict(m)) if m.contains("matter 7")
        ));
        assert_eq!(
            store.legal_holds().await.expect("holds")[0].set_by,
            "system:store-test"
        );
        store
            .release_legal_hold(&ctx(), "t1")
            .await
            .expect("release");
        assert!(matches!(
            store.release_legal_hold(&ctx(), "t1").await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(
            store
                .prune_audit(&ctx(), "t1", cutoff)
                .await
                .expect("prune"),
            5
        );
        assert_eq!(
            store
                .prune_audit(&ctx(), "t1", cutoff)
                .await
                .expect("again"),
            0
        );

        let entries = store.audit_entries("t1", 0, 10).await.expect("entries");
        let pruned: Vec<bool> = entries.iter().map(|e| e.body.is_none()).collect();
        assert_eq!(pruned, [true, true, true, true, true, false]);
        assert_eq!(
            store.audit_head("t1").await.expect("head"),
            head,
            "the tree is intact"
        );
        assert_eq!(
            store.audit_leaf_hashes("t1", 6).await.expect("leaves"),
            entries.iter().map(|e| e.leaf_hash).collect::<Vec<_>>()
        );
        let system = store
            .search_audit(&allot_store::AuditSearch {
                logs: Some(vec!["system".into()]),
                action: Some("audit.*".into()),
                limit: 100,
                ..Default::default()
            })
            .await
            .expect("search");
        let actions: Vec<&str> = system.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(
            actions,
            ["audit.hold.set", "audit.hold.release", "audit.prune"],
            "a no-op prune records nothing"
        );
    }
);

both_backends!(
    audit_search_filters_and_resumes_after_a_cursor,
    |store, clock| {
        use allot_domain::{AuditEvent, Outcome};
        for i in 0..6u32 {
            let mut e = AuditEvent::success(
                if i % 2 == 0 { "a" } else { "b" },
                if i < 3 {
                    "token.create"
                } else {
                    "token_x.create"
                },
                format!("token/{i}"),
            );
            if i == 5 {
                e.outcome = Outcome::Denied;
            }
            store.record_event(&ctx(), e).await.expect("event");
            clock.advance(Duration::seconds(1));
        }
        let find = |q: allot_store::AuditSearch| {
            let store = store.clone();
            async move {
                store
                    .search_audit(&q)
                    .await
                    .expect("search")
                    .into_iter()
                    .map(|e| (e.log, e.seq))
                    .collect::<Vec<_>>()
            }
        };
        let q = |f: fn(&mut allot_store::AuditSearch)| {
            let mut q = allot_store::AuditSearch {
                limit: 100,
                ..Default::default()
            };
            f(&mut q);
            q
        };
        let s = |l: &str, n: u64| (l.to_owned(), n);
        // `_` in a prefix is literal, not a wildcard.
        assert_eq!(
            find(q(|q| q.action = Some("token.*".into()))).await,
            [s("a", 0), s("b", 0), s("a", 1)]
        );
        assert_eq!(
            find(q(|q| q.action = Some("token_*".into()))).await,
            [s("b", 1), s("a", 2), s("b", 2)]
        );
        assert_eq!(
            find(q(|q| q.outcome = Some(Outcome::Denied))).await,
            [s("b", 2)]
        );
        assert_eq!(
            find(q(|q| q.target = Some("token/4".into()))).await,
            [s("a", 2)]
        );
        assert_eq!(
            find(q(|q| q.actor = Some("store-test".into()))).await.len(),
            6
        );
        assert_eq!(
            find(q(|q| q.actor = Some("token:store-test".into())))
                .await
                .len(),
            0
        );
        let all = store
            .search_audit(&q(|q| q.logs = Some(vec!["a".into(), "b".into()])))
            .await
            .expect("all");
        let mut after = q(|q| q.limit = 2);
        after.after = Some((all[1].at, all[1].log.clone(), all[1].seq));
        assert_eq!(find(after).await, [s("a", 1), s("b", 1)]);
        let mut window = q(|_| {});
        window.since = Some(all[2].at);
        window.until = Some(all[4].at);
        assert_eq!(find(window).await, [s("a", 1), s("b", 1)]);
    }
);

both_backends!(
    batched_audit_appends_stay_gap_free_and_hashed,
    |store, _clock| {
        use allot_domain::AuditEvent;
        let events = |n: usize| -> Vec<AuditEvent> {
            (0..n)
                .map(|i| AuditEvent::success("bulk", "bench.append", format!("item/{i}")))
                .collect()
        };
        assert_eq!(
            store
                .record_events(&ctx(), "bulk", events(1500))
                .await
                .expect("batch"),
            0
        );
        assert_eq!(
            store
                .record_events(&ctx(), "bulk", events(7))
                .await
                .expect("batch"),
            1500
        );
        let bad = vec![AuditEvent::success("other", "x", "y")];
        assert!(
            store.record_events(&ctx(), "bulk", bad).await.is_err(),
            "one log per batch"
        );
        assert_eq!(head_matches_entries(&store, "bulk").await, 1507);
    }
);

both_backends!(
    the_audit_batcher_commits_concurrent_events_in_order,
    |store, _clock| {
        use allot_domain::AuditEvent;
        let (batcher, task) = allot_store::AuditBatcher::start(store.clone(), 64);
        let mut waits = Vec::new();
        for i in 0..200 {
            let b = batcher.clone();
            let log = if i % 2 == 0 { "even" } else { "odd" };
            waits.push(tokio::spawn(async move {
                b.record(
                    ctx(),
                    AuditEvent::success(log, "bench.append", format!("item/{i}")),
                )
                .await
            }));
        }
        let mut seqs: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
        for (i, w) in waits.into_iter().enumerate() {
            let seq = w.await.expect("join").expect("recorded");
            seqs.entry(if i % 2 == 0 {
                "even".into()
            } else {
                "odd".into()
            })
            .or_default()
            .push(seq);
        }
        for (log, mut s) in seqs {
            s.sort_unstable();
            assert_eq!(s, (0..100).collect::<Vec<u64>>(), "{log}");
            head_matches_entries(&store, &log).await;
        }
        drop(batcher);
        task.await.expect("the batcher stops when dropped");
    }
);

both_backends!(
    checkpointed_sizes_are_the_largest_per_log,
    |store, _clock| {
        use allot_store::StoredCheckpoint;
        assert!(store.checkpointed_sizes().await.expect("sizes").is_empty());
        for (log, size) in [("a", 3), ("a", 9), ("b", 4), ("a", 5)] {
            store
                .insert_checkpoint(StoredCheckpoint {
                    log: log.into(),
                    size,
                    root: [0; 32],
                    note: format!("{log} {size}\n"),
                })
                .await
                .expect("checkpoint");
        }
        let sizes = store.checkpointed_sizes().await.expect("sizes");
        assert_eq!(sizes, [("a".to_owned(), 9), ("b".to_owned(), 4)].into());
        assert_eq!(
            store
                .latest_checkpoint("a")
                .await
                .expect("latest")
                .map(|c| c.size),
            Some(9)
        );
    }
);

/// Caps written before quotas nested (whole GPUs) read back as GPU-milli limits.
async fn existing_caps_become_gpu_milli_limits(backend: Backend) {
    use allot_migrations::MigratorTrait;
    use sea_orm::ConnectionTrait;

    let db = TestDb::new(backend).await.expect("test database");
    let conn = sea_orm::Database::connect(db.url.as_str())
        .await
        .expect("connect");
    allot_migrations::Migrator::up(&conn, Some(3))
        .await
        .expect("the schema before quotas nested");
    conn.execute_unprepared(
        "INSERT INTO tenants (id, name, max_gpus, max_gpu_memory_bytes, created_at) VALUES \
         ('t-capped', 'capped', 3, 1099511627776, '2026-11-29T12:00:00+00:00'), \
         ('t-free', 'free', NULL, NULL, '2026-11-29T12:00:00+00:00')",
    )
    .await
    .expect("tenants of the old schema");
    conn.close().await.expect("close");

    let store = db
        .store_with_system_clock()
        .await
        .expect("migrates on connect");
    let capped = store.tenant_by_name("capped").await.expect("capped");
    assert_eq!(capped.quota.limit.gpu_milli, Some(3000));
    assert_eq!(capped.quota.limit.gpu_memory_bytes, Some(1 << 40));
    assert_eq!(capped.quota.guaranteed, Resources::default());
    assert_eq!(
        (capped.quota.weight, capped.quota.min_isolation),
        (1, Isolation::Shared)
    );
    let free = store.tenant_by_name("free").await.expect("free");
    assert_eq!(free.quota, Quota::default());
}

#[tokio::test]
async fn existing_caps_become_gpu_milli_limits_sqlite() {
    existing_caps_become_gpu_milli_limits(Backend::Sqlite).await;
}

#[tokio::test]
async fn existing_caps_become_gpu_milli_limits_postgres() {
    existing_caps_become_gpu_milli_limits(Backend::Postgres).await;
}

both_backends!(users_and_role_bindings, |store, clock| {
    let t = store
        .create_tenant(&ctx(), &name("ml"), None, Quota::default())
        .await
        .expect("tenant");
    let alice = || SignIn {
        issuer: "https://idp".into(),
        subject: "alice".into(),
        email: Some("alice@example.com".into()),
        name: None,
    };
    let first = store.sign_in(alice()).await.expect("created");
    let again = store.sign_in(alice()).await.expect("found");
    assert_eq!(first.id, again.id, "one user per issuer and subject");
    clock.advance(Duration::minutes(5));
    let renamed = store
        .sign_in(SignIn {
            name: Some("Alice".into()),
            ..alice()
        })
        .await
        .expect("updated");
    assert_eq!(renamed.name.as_deref(), Some("Alice"));
    assert_eq!(renamed.last_seen_at, clock.now());
    let other_issuer = store
        .sign_in(SignIn {
            issuer: "https://other-idp".into(),
            ..alice()
        })
        .await
        .expect("another person");
    assert_ne!(other_issuer.id, first.id);

    let by_user = store
        .create_binding(
            &ctx(),
            NewBinding {
                subject: BindingSubject::User {
                    user_id: first.id.clone(),
                },
                role: Role::Member,
                tenant_id: Some(t.id.clone()),
            },
        )
        .await
        .expect("user binding");
    let by_claim = store
        .create_binding(
            &ctx(),
            NewBinding {
                subject: BindingSubject::Claim {
                    claim: "groups".into(),
                    value: "ops".into(),
                },
                role: Role::Admin,
                tenant_id: None,
            },
        )
        .await
        .expect("claim binding");
    let ops = [("groups".to_owned(), "ops".to_owned())];
    let roles = store.roles_of(&first.id, &ops).await.expect("roles");
    assert_eq!(roles.len(), 2, "{roles:?}");
    assert!(roles.contains(&RoleBinding::platform(Role::Admin)));
    assert_eq!(
        store.roles_of(&other_issuer.id, &[]).await.expect("roles"),
        []
    );
    // Scopes: a tenant's scope never reaches a platform binding.
    let of_t = TenantScope::tenant(t.id.clone());
    assert_eq!(store.list_bindings(&of_t).await.expect("list").len(), 1);
    assert_eq!(
        store
            .list_bindings(&TenantScope::All)
            .await
            .expect("list")
            .len(),
        2
    );
    assert!(matches!(
        store.binding(&of_t, &by_claim.id).await,
        Err(StoreError::NotFound(_))
    ));

    store
        .revoke_binding(&ctx(), &TenantScope::All, &by_claim.id)
        .await
        .expect("revoked");
    let roles = store.roles_of(&first.id, &ops).await.expect("roles");
    assert_eq!(roles, [RoleBinding::tenant(Role::Member, t.id.clone())]);

    // Deleting a user revokes their bindings, and signing in again does not revive them.
    let deleted = store.delete_user(&ctx(), &first.id).await.expect("deleted");
    assert!(deleted.deleted_at.is_some());
    assert!(
        store
            .sign_in(alice())
            .await
            .expect("found")
            .deleted_at
            .is_some()
    );
    assert!(
        store
            .binding(&TenantScope::All, &by_user.id)
            .await
            .expect("binding")
            .revoked_at
            .is_some()
    );
    assert_eq!(store.roles_of(&first.id, &ops).await.expect("roles"), []);

    // Every change is on record.
    let system = store
        .audit_entries("system", 0, 100)
        .await
        .expect("entries");
    let actions: Vec<&str> = system.iter().map(|e| e.action.as_str()).collect();
    for a in [
        "user.create",
        "binding.create",
        "binding.revoke",
        "user.delete",
    ] {
        assert!(actions.contains(&a), "{a}: {actions:?}");
    }
    head_matches_entries(&store, "system").await;
});

both_backends!(
    gpu_samples_are_averaged_into_buckets_and_pruned,
    |store, clock| {
        use allot_domain::GpuSample;
        use allot_store::SampleRepo;
        let at = chrono::DateTime::parse_from_rfc3339("2026-11-30T10:00:01Z")
            .expect("time")
            .with_timezone(&chrono::Utc);
        let s = |u: f64, throttle: u32, ecc: u64| GpuSample {
            utilization: u,
            memory_used_bytes: 1 << 30,
            power_watts: 100.0,
            temperature_c: 40.0,
            pcie_rx_bytes_per_s: u * 1e9,
            pcie_tx_bytes_per_s: 5e8,
            nvlink_rx_bytes_per_s: u * 1e11,
            nvlink_tx_bytes_per_s: 0.0,
            throttle_mask: throttle,
            ecc_corrected: ecc,
            ecc_uncorrected: 0,
        };
        // Three samples in one 10-second bucket, a fourth in the next; all in one 5-minute one.
        for (offset, u, throttle, ecc) in [
            (0, 0.2, 0b001, 5),
            (3, 0.4, 0, 6),
            (6, 0.6, 0b100, 9),
            (12, 1.0, 0, 9),
        ] {
            store
                .record_gpu_samples(
                    "n1",
                    at + Duration::seconds(offset),
                    &[("GPU-a".into(), s(u, throttle, ecc))],
                )
                .await
                .expect("recorded");
        }
        let fine = store
            .gpu_samples(Some("GPU-a"), 10, at - Duration::minutes(1))
            .await
            .expect("read");
        assert_eq!(fine.len(), 2, "{fine:?}");
        assert!((fine[0].utilization - 0.4).abs() < 1e-9, "{fine:?}");
        // Traffic is averaged, every throttle reason seen is kept, ECC counts are the last.
        assert!(
            (fine[0].pcie_rx_bytes_per_s - 0.4e9).abs() < 1.0,
            "{fine:?}"
        );
        assert!((fine[0].nvlink_rx_bytes_per_s - 0.4e11).abs() < 1.0);
        assert!((fine[0].pcie_tx_bytes_per_s - 5e8).abs() < 1.0);
        assert_eq!(fine[0].throttle_mask, 0b101);
        assert_eq!(fine[0].ecc_corrected, 9);
        assert_eq!(fine[1].throttle_mask, 0);
        assert_eq!(fine[0].at, at - Duration::seconds(1));
        assert!((fine[1].utilization - 1.0).abs() < 1e-9);
        let coarse = store
            .gpu_samples(None, 300, at - Duration::minutes(10))
            .await
            .expect("read");
        assert_eq!(coarse.len(), 1);
        assert!((coarse[0].utilization - 0.55).abs() < 1e-9, "{coarse:?}");
        assert_eq!(coarse[0].memory_used_bytes, 1 << 30);
        // A day on, the 10-second buckets go and the 5-minute one stays.
        let _ = clock;
        let pruned = store
            .prune_gpu_samples(at + Duration::days(1) + Duration::minutes(1))
            .await
            .expect("pruned");
        assert_eq!(pruned, 2);
        assert_eq!(
            store
                .gpu_samples(None, 300, at - Duration::days(1))
                .await
                .expect("read")
                .len(),
            1
        );
    }
);

both_backends!(sign_ins_in_progress_are_taken_once, |store, clock| {
    use allot_store::{PendingSignIn, SignInRepo};
    let ttl = Duration::minutes(10);
    let pending = PendingSignIn {
        verifier: "verifier".into(),
        nonce: "nonce".into(),
        return_to: "/portal".into(),
    };
    store
        .begin_sign_in("a", &pending, ttl, 2)
        .await
        .expect("begun");
    // Any replica on this database takes it, once.
    assert_eq!(
        store.take_sign_in("a", ttl).await.expect("take"),
        Some(pending.clone())
    );
    assert_eq!(store.take_sign_in("a", ttl).await.expect("again"), None);
    assert_eq!(store.take_sign_in("never", ttl).await.expect("none"), None);
    // At most `max` at once; expired ones are swept and cannot be taken.
    store.begin_sign_in("b", &pending, ttl, 2).await.expect("b");
    store.begin_sign_in("c", &pending, ttl, 2).await.expect("c");
    assert!(matches!(
        store.begin_sign_in("d", &pending, ttl, 2).await,
        Err(StoreError::Conflict(_))
    ));
    clock.advance(Duration::minutes(11));
    assert_eq!(store.take_sign_in("b", ttl).await.expect("late"), None);
    store
        .begin_sign_in("d", &pending, ttl, 2)
        .await
        .expect("room again once the old ones expired");
});

both_backends!(
    failed_authentications_count_per_source_and_window_across_replicas,
    |store, clock| {
        // Two replicas of the control plane on one database count one client together.
        let other = store.clone();
        let window = std::time::Duration::from_secs(60);
        let start = clock.now();
        assert_eq!(
            store
                .count_auth_failure("10.0.0.1", window)
                .await
                .expect("count"),
            (start, 1)
        );
        assert_eq!(
            other
                .count_auth_failure("10.0.0.1", window)
                .await
                .expect("count"),
            (start, 2)
        );
        assert_eq!(
            store
                .count_auth_failure("10.0.0.2", window)
                .await
                .expect("count"),
            (start, 1)
        );
        clock.advance(chrono::Duration::seconds(59));
        assert_eq!(
            other
                .count_auth_failure("10.0.0.1", window)
                .await
                .expect("count"),
            (start, 3)
        );
        // The window has ended: a new one counts from one.
        clock.advance(chrono::Duration::seconds(1));
        let later = clock.now();
        assert_eq!(
            store
                .count_auth_failure("10.0.0.1", window)
                .await
                .expect("count"),
            (later, 1)
        );
        // Concurrent failures are each counted once.
        let mut counting = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let s = store.clone();
            counting.spawn(async move { s.count_auth_failure("10.0.0.3", window).await });
        }
        let mut seen: Vec<u32> = counting
            .join_all()
            .await
            .into_iter()
            .map(|c| c.expect("count").1)
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (1..=8).collect::<Vec<_>>());
        // Ended windows are swept; current ones stay.
        clock.advance(chrono::Duration::seconds(61));
        assert_eq!(store.sweep_auth_failures(window).await.expect("sweep"), 3);
    }
);

both_backends!(
    fair_share_history_is_saved_whole_and_read_back,
    |store, clock| {
        use allot_store::{FairShareHistory, FairShareRepo};
        assert_eq!(
            store.fair_share_history().await.expect("read"),
            FairShareHistory::default(),
            "nothing saved yet"
        );
        let at = clock.now();
        let first = FairShareHistory {
            by_tenant: [("t1".to_owned(), 3600.5), ("t2".to_owned(), 12.0)].into(),
            recorded_at: Some(at),
        };
        store.save_fair_share_history(&first).await.expect("save");
        assert_eq!(store.fair_share_history().await.expect("read"), first);
        // A later save replaces it whole: a tenant absent from it is forgotten, nonsense is
        // not kept.
        clock.advance(Duration::seconds(10));
        let second = FairShareHistory {
            by_tenant: [
                ("t2".to_owned(), 20.0),
                ("t3".to_owned(), f64::NAN),
                ("t4".to_owned(), -1.0),
            ]
            .into(),
            recorded_at: Some(clock.now()),
        };
        store.save_fair_share_history(&second).await.expect("save");
        let read = store.fair_share_history().await.expect("read");
        assert_eq!(read.by_tenant, [("t2".to_owned(), 20.0)].into());
        assert_eq!(read.recorded_at, Some(clock.now()));
    }
);

both_backends!(a_leaders_writes_are_fenced_by_its_term, |store, clock| {
    use allot_store::{FairShareHistory, FairShareRepo, LeadershipRepo, StoreError};
    let ttl = Duration::seconds(5);
    let history = |s: f64| FairShareHistory {
        by_tenant: [("t1".to_owned(), s)].into(),
        recorded_at: Some(clock.now()),
    };
    let first = store
        .acquire("a", "a-1", "https://a:7070", ttl)
        .await
        .expect("acquire")
        .expect("the lease was never held: a takes it");
    assert_eq!(first.epoch, 1);
    assert!(
        store
            .acquire("b", "b-1", "https://b:7070", ttl)
            .await
            .expect("acquire")
            .is_none(),
        "held and unexpired: b waits"
    );
    let a = store.fenced(&first);
    a.save_fair_share_history(&history(1.0))
        .await
        .expect("a leads");
    clock.advance(Duration::seconds(3));
    let first = store
        .renew(&first, ttl)
        .await
        .expect("renew")
        .expect("still a's");
    let leader = store.leader().await.expect("read");
    assert_eq!(
        (leader.holder.as_str(), leader.address.as_str()),
        ("a", "https://a:7070")
    );
    assert!(leader.holds_at(clock.now()));

    // a stalls past its lease: before anyone takes over, its own expiry fences it.
    clock.advance(Duration::seconds(6));
    let refused = a.save_fair_share_history(&history(2.0)).await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
    let second = store
        .acquire("b", "b-1", "https://b:7070", ttl)
        .await
        .expect("acquire")
        .expect("expired: b takes over");
    assert_eq!(second.epoch, 2);
    // a wakes: it can neither renew nor write, whatever its clock says now.
    assert!(store.renew(&first, ttl).await.expect("renew").is_none());
    let b = store.fenced(&second);
    for refused in [
        a.save_fair_share_history(&history(3.0)).await,
        a.set_pending_reason("no-such-job", None).await,
    ] {
        assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
    }
    b.save_fair_share_history(&history(4.0))
        .await
        .expect("b leads");
    assert_eq!(
        store.fair_share_history().await.expect("read").by_tenant,
        [("t1".to_owned(), 4.0)].into(),
        "only the leader's writes landed"
    );
    // The negative control: the same write without the fence lands.
    store
        .unfenced_for_testing(&first)
        .save_fair_share_history(&history(5.0))
        .await
        .expect("unfenced");
    // What the leader audits names its term.
    use allot_store::AuditRepo;
    let seq = b
        .record_event(
            &AuditContext::system("scheduler"),
            allot_domain::AuditEvent::success(allot_domain::SYSTEM_LOG, "test.leader", "x"),
        )
        .await
        .expect("audited");
    let entries = store
        .audit_entries(allot_domain::SYSTEM_LOG, seq, 1)
        .await
        .expect("entries");
    let body: serde_json::Value =
        serde_json::from_str(entries[0].body.as_deref().unwrap_or("null")).expect("JSON");
    assert_eq!(body["actor"]["source"], "leader b epoch 2", "{body}");
    // Another process under b's name (a second replica given it, or b started again):
    // it waits out the lease, whatever its name; b's own process takes it on.
    assert!(
        store
            .acquire("b", "b-2", "https://b2:7070", ttl)
            .await
            .expect("acquire")
            .is_none(),
        "b's name, another process: it waits"
    );
    assert_eq!(store.leader().await.expect("read").instance, "b-1");
    // A clean stop hands over at once.
    store.resign(&second).await.expect("resign");
    let third = store
        .acquire("a", "a-1", "https://a:7070", ttl)
        .await
        .expect("acquire")
        .expect("resigned: a takes it back");
    assert_eq!(third.epoch, 3);
    assert!(matches!(
        b.save_fair_share_history(&history(6.0)).await,
        Err(StoreError::Fenced(_))
    ));
});

/// Replicas started together on a database never migrated: each applies what is pending
/// under one lock, so every start succeeds and every migration is recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_together_on_an_empty_database_all_start() {
    use allot_migrations::MigratorTrait;
    use sea_orm::ConnectionTrait;
    let db = TestDb::new(Backend::Postgres).await.expect("db");
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let url = db.url.clone();
            tokio::spawn(async move {
                Store::connect(&url, std::sync::Arc::new(allot_domain::SystemClock)).await
            })
        })
        .collect();
    for start in starts {
        start.await.expect("task").expect("a replica starts");
    }
    let conn = sea_orm::Database::connect(db.url.as_str())
        .await
        .expect("connect");
    let rows = conn
        .query_all_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT version, count(*) AS n FROM seaql_migrations GROUP BY version",
        ))
        .await
        .expect("migrations table");
    assert_eq!(
        rows.len(),
        allot_migrations::Migrator::migrations().len(),
        "every migration applied"
    );
    for r in rows {
        assert_eq!(r.try_get::<i64>("", "n").expect("count"), 1);
    }
}

both_backends!(
    every_change_to_a_tenant_moves_the_tenants_version,
    |store, _clock| {
        let version = |store: &Store| {
            let store = store.clone();
            async move { store.versioned_tenant_tree().await.expect("tree").0 }
        };
        let mut last = version(&store).await;
        let mut moved = |now: i64, what: &str| {
            assert!(now > last, "{what}: {now} after {last}");
            last = now;
        };
        store
            .create_tenant(&ctx(), &name("t"), None, Quota::default())
            .await
            .expect("create");
        moved(version(&store).await, "create");
        store
            .set_quota(&ctx(), "t", Quota::default())
            .await
            .expect("quota");
        moved(version(&store).await, "quota");
        store
            .set_policy(&ctx(), "t", allot_domain::TenantPolicy::default())
            .await
            .expect("policy");
        moved(version(&store).await, "policy");
        store.delete_tenant(&ctx(), "t").await.expect("delete");
        moved(version(&store).await, "delete");
        // A refused change moves nothing.
        let before = version(&store).await;
        assert!(store.delete_tenant(&ctx(), "t").await.is_err());
        assert_eq!(version(&store).await, before);
    }
);
