use super::process::{ProcessRuntime, process_group_alive};
use super::*;

fn spec(cmd: &[&str]) -> LaunchSpec {
    LaunchSpec {
        job_id: "j1".into(),
        job_name: "test".into(),
        tenant: "t".into(),
        node_name: "n".into(),
        command: cmd.iter().map(|s| (*s).to_owned()).collect(),
        env: BTreeMap::from([("GREETING".to_owned(), "hi".to_owned())]),
        workdir: None,
        gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
        gpus: Vec::new(),
        attempt: 1,
        gpu_milli: 1000,
        gpu_memory_bytes: 0,
        cpu_milli: 0,
        memory_bytes: 0,
        image: None,
        pull_credentials: None,
        network: Network::Host,
        network_policy: None,
        gang: None,
        node_address: String::new(),
        checkpoint_dir: None,
        volumes: Vec::new(),
        secrets: Vec::new(),
        uid_slot: Some(0),
        inherit_fds: Vec::new(),
        preload: None,
    }
}

async fn run(dir: &std::path::Path, spec: LaunchSpec, stop: &StopSignal) -> Finished {
    let runtime = ProcessRuntime::new(dir);
    let log = joblog::path(dir, &spec.job_id, spec.attempt);
    supervise(&runtime, spec, log, stop, Duration::from_secs(1), |_| {}).await
}

#[tokio::test]
async fn captures_output_and_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stop = StopSignal::default();
    let done = run(
        dir.path(),
        spec(&[
            "sh",
            "-c",
            "echo $GREETING $CUDA_VISIBLE_DEVICES $ALLOT_JOB_ID; echo err >&2",
        ]),
        &stop,
    )
    .await;
    assert_eq!(done.outcome, Outcome::Succeeded);
    assert_eq!(done.log_tail, "hi GPU-a,GPU-b j1\nerr\n");
}

#[tokio::test]
async fn reports_exit_codes_and_launch_failures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stop = StopSignal::default();
    let done = run(dir.path(), spec(&["sh", "-c", "exit 3"]), &stop).await;
    assert!(matches!(
        done.outcome,
        Outcome::Failed {
            exit_code: Some(3),
            ..
        }
    ));
    let done = run(dir.path(), spec(&["/no/such/program"]), &stop).await;
    match done.outcome {
        Outcome::Failed {
            exit_code: None,
            message,
        } => assert!(message.contains("could not start"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_job_cannot_turn_its_log_into_a_link() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "node key").expect("write");
    let stop = StopSignal::default();
    // The job knows where its log is and replaces it with a link to a node file.
    let log = joblog::path(dir.path(), "j1", 1);
    let script = format!(
        "echo mine; rm -f {log}; ln -s {secret} {log}; echo more",
        log = log.display(),
        secret = secret.display()
    );
    let done = run(dir.path(), spec(&["sh", "-c", &script]), &stop).await;
    assert_eq!(done.outcome, Outcome::Succeeded);
    assert!(
        !done.log_tail.contains("node key"),
        "the node file is not shown as the log: {:?}",
        done.log_tail
    );
    // The next attempt's log does not write through the link either.
    let mut again = spec(&["sh", "-c", "echo second"]);
    std::fs::remove_file(joblog::path(dir.path(), "j1", 2)).ok();
    std::os::unix::fs::symlink(&secret, joblog::path(dir.path(), "j1", 2)).expect("link");
    again.attempt = 2;
    let done = run(dir.path(), again, &stop).await;
    assert!(matches!(done.outcome, Outcome::Failed { .. }));
    assert_eq!(std::fs::read_to_string(&secret).expect("read"), "node key");
}

#[tokio::test]
async fn stop_kills_the_whole_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stop = std::sync::Arc::new(StopSignal::default());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let s = stop.clone();
    let path = dir.path().to_owned();
    let task = tokio::spawn(async move {
        let runtime = ProcessRuntime::new(&path);
        let log = joblog::path(&path, "j1", 1);
        // The shell's child sleeps too: both must go.
        supervise(
            &runtime,
            spec(&["sh", "-c", "sleep 60 & sleep 60"]),
            log,
            &s,
            Duration::from_secs(2),
            |started| {
                let _ = tx.send(started.pid);
            },
        )
        .await
    });
    let pid = rx.await.expect("started");
    stop.stop(StopReason::Cancelled);
    let done = task.await.expect("join");
    assert!(matches!(done.outcome, Outcome::Cancelled { .. }));
    // SIGKILL is delivered asynchronously: give the kernel a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while process_group_alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "process group {pid} survived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn job_ids_are_checked_before_files_are_named_after_them() {
    assert!(safe_name("0193a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b"));
    for bad in ["", "..", "a/b", "../x", "a b", "a\0b"] {
        assert!(!safe_name(bad), "{bad:?}");
    }
}
