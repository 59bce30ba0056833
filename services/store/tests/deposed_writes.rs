//! Deposed writes seen in the job rows themselves: each row names the epoch of the leader
//! handle that last wrote it, each term when it began, so a write made under a term after a
//! later one had begun shows without the audit log. The fence refuses such writes; the
//! unfenced handle (the negative control) makes them, and the check names them.

use std::sync::Arc;

use allot_domain::{
    AuditContext, Clock, FixedClock, JobSpec, JobState, PendingReason, Quota, TenantName,
};
use allot_store::testing::{Backend, TestDb};
use allot_store::{
    DeposedWrite, JobRepo, JobUpdate, LeaderRepo, LeadershipRepo, NewJob, Store, StoreError,
    TenantRepo, TenantScope,
};
use chrono::{Duration, TimeZone, Utc};

fn ctx() -> AuditContext {
    AuditContext::system("deposed-writes-test")
}

fn spec(tenant: &TenantName) -> JobSpec {
    JobSpec {
        tenant: tenant.clone(),
        name: "train".into(),
        cpu_milli: 1000,
        memory_bytes: 1 << 30,
        gpus: 1,
        gpu_milli: None,
        gpu_memory_bytes: None,
        gpu_models: Vec::new(),
        priority: 100,
        preemptible: false,
        isolation: None,
        class: None,
        max_retries: 0,
        command: vec!["true".into()],
        env: Default::default(),
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

fn placement(gpu: &str) -> JobUpdate {
    JobUpdate {
        node_id: Some("node-1".into()),
        gpu_uuids: Some(vec![gpu.to_owned()]),
        held_gpu_milli: Some(1000),
        ..Default::default()
    }
}

/// The epoch job `id`'s row names as its last writer.
async fn writer_of(store: &Store, id: &str) -> Option<i64> {
    store
        .job_writers()
        .await
        .expect("writers")
        .into_iter()
        .find(|w| w.job_id == id)
        .expect("the job's row")
        .writer_epoch
}

async fn run(backend: Backend) {
    let db = TestDb::new(backend).await.expect("test database");
    let clock = Arc::new(FixedClock::new(
        Utc.with_ymd_and_hms(2026, 12, 18, 9, 0, 0)
            .single()
            .expect("time"),
    ));
    let store: Store = db.store(clock.clone()).await.expect("store");
    let tenant = TenantName::parse("name", "t").expect("name");
    let t = store
        .create_tenant(&ctx(), &tenant, None, Quota::default())
        .await
        .expect("tenant");
    let mut ids = Vec::new();
    for _ in 0..4 {
        let job = store
            .create_job(
                &ctx(),
                NewJob {
                    tenant_id: t.id.clone(),
                    spec: spec(&tenant),
                    traceparent: None,
                    submitted_by: None,
                },
            )
            .await
            .expect("submit");
        ids.push(job.id);
    }
    let [a, b, c, d] = <[String; 4]>::try_from(ids).expect("four jobs");
    assert_eq!(
        writer_of(&store, &a).await,
        None,
        "a submit is no leader's write"
    );
    assert!(store.leader_terms().await.expect("terms").is_empty());
    assert!(store.deposed_job_writes().await.expect("check").is_empty());

    // Term 1: its writes name it.
    let ttl = Duration::seconds(5);
    let first = store
        .acquire("one", "one-1", "https://one:7070", ttl)
        .await
        .expect("acquire")
        .expect("the lease is free");
    assert_eq!(first.epoch, 1);
    let one = store.fenced(&first);
    one.place_together(&ctx(), vec![(a.clone(), placement("GPU-a"))])
        .await
        .expect("term 1 places a");
    assert_eq!(writer_of(&store, &a).await, Some(1));
    one.set_pending_reason(
        &d,
        Some(PendingReason {
            code: "Capacity".into(),
            message: "no room".into(),
        }),
    )
    .await
    .expect("term 1 says why d waits");
    assert_eq!(
        writer_of(&store, &d).await,
        Some(1),
        "a pending reason names its writer too"
    );

    // Term 1 stalls past its lease; term 2 begins.
    clock.advance(Duration::seconds(6));
    let second = store
        .acquire("two", "two-1", "https://two:7070", ttl)
        .await
        .expect("acquire")
        .expect("expired: two takes over");
    assert_eq!(second.epoch, 2);
    let terms = store.leader_terms().await.expect("terms");
    assert_eq!(
        terms
            .iter()
            .map(|t| (t.epoch, t.holder.as_str(), t.instance.as_str()))
            .collect::<Vec<_>>(),
        [(1, "one", "one-1"), (2, "two", "two-1")]
    );
    assert_eq!(terms[1].started_at, clock.now());
    assert!(terms[0].started_at < terms[1].started_at);
    assert!(
        store.deposed_job_writes().await.expect("check").is_empty(),
        "term 1 wrote only while it held"
    );

    // (a) Term 1 wakes: its fence refuses the write, and the rows show nothing.
    clock.advance(Duration::seconds(1));
    let refused = one
        .place_together(&ctx(), vec![(b.clone(), placement("GPU-b"))])
        .await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
    assert_eq!(writer_of(&store, &b).await, None);
    assert_eq!(
        store.job(&TenantScope::All, &b).await.expect("b").state,
        JobState::Pending
    );
    assert!(store.deposed_job_writes().await.expect("check").is_empty());

    // (b) The negative control: the same write without the fence lands, and the check
    // names it.
    store
        .unfenced_for_testing(&first)
        .place_together(&ctx(), vec![(b.clone(), placement("GPU-b"))])
        .await
        .expect("unfenced, it writes");
    assert_eq!(writer_of(&store, &b).await, Some(1));
    assert_eq!(
        store.deposed_job_writes().await.expect("check"),
        [DeposedWrite {
            job_id: b.clone(),
            writer_epoch: 1,
            written_at: clock.now(),
            superseded_by: 2,
        }]
    );

    // Term 2's own writes are no deposed writes.
    let two = store.fenced(&second);
    two.place_together(&ctx(), vec![(c.clone(), placement("GPU-c"))])
        .await
        .expect("term 2 places c");
    two.request_preemption(&ctx(), &a, "make room")
        .await
        .expect("term 2 preempts a");
    assert_eq!(writer_of(&store, &c).await, Some(2));
    assert_eq!(writer_of(&store, &a).await, Some(2));
    assert_eq!(
        store
            .deposed_job_writes()
            .await
            .expect("check")
            .into_iter()
            .map(|w| w.job_id)
            .collect::<Vec<_>>(),
        std::slice::from_ref(&b)
    );

    // A write through no leader's handle (a cancel through any replica) names no writer:
    // the column is the last writer, not the last leader that wrote.
    store
        .request_cancel(&ctx(), &b, "a test")
        .await
        .expect("cancel");
    assert_eq!(writer_of(&store, &b).await, None);
    assert!(store.deposed_job_writes().await.expect("check").is_empty());
}

#[tokio::test]
async fn deposed_job_writes_show_in_the_rows_sqlite() {
    run(Backend::Sqlite).await;
}

#[tokio::test]
async fn deposed_job_writes_show_in_the_rows_postgres() {
    run(Backend::Postgres).await;
}
