//! Fault injection against real agent processes (`allot bench chaos`, small): agents killed
//! with SIGKILL and restarted, partitions longer than a lease, short blips and XIDs. No job is
//! lost, none is ever seen running twice, and faults really moved jobs: with jobs as
//! processes (a quarter of them gangs of two replicas, none ever seen running two attempts
//! at once), and with jobs as runc containers.

use std::process::Command;

use allot_system_tests::allot_bin;

/// `allot bench chaos`, small, with jobs run by `runtime` and `extra` arguments.
fn run(runtime: &str, extra: &[&str]) -> std::process::Output {
    Command::new(allot_bin())
        .args([
            "bench",
            "chaos",
            "--nodes",
            "3",
            "--jobs",
            "24",
            "--faults",
            "12",
            "--seed",
            "7",
            "--lease-ms",
            "1500",
            // Counts are asserted here; how fast it recovers is the benchmark's to measure.
            "--recovery-target-leases",
            "0",
            "--job-secs",
            "1-3",
            "--runtime",
            runtime,
            "--json",
        ])
        .args(extra)
        .env("ALLOT_LOG", "error")
        .output()
        .expect("allot bench chaos runs")
}

fn chaos(runtime: &str, gangs: bool) {
    let out = run(runtime, if gangs { &["--gangs"] } else { &[] });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["runtime"], runtime, "{r}");
    assert_eq!(r["targets_missed"], serde_json::json!([]), "{r}");
    assert_eq!(r["lost"], 0, "{r}");
    assert_eq!(r["double_running"], 0, "{r}");
    assert_eq!(r["gang_attempts_side_by_side"], 0, "{r}");
    assert_eq!(r["gangs"], if gangs { 6 } else { 0 }, "{r}");
    assert_eq!(r["succeeded"], 24, "{r}");
    // The observer that looks for doubles saw the jobs (it is not looking elsewhere).
    assert_eq!(r["jobs_seen_running_by_the_observer"], 24, "{r}");
    let faults: u64 = [
        "agent_kill9_and_restart",
        "partition_longer_than_lease",
        "blip_shorter_than_lease",
        "xid",
    ]
    .iter()
    .map(|k| r["faults"][k].as_u64().unwrap_or(0))
    .sum();
    assert_eq!(faults, 12, "{r}");
    assert!(
        r["requeued_attempts"].as_u64().unwrap_or(0) > 0,
        "the faults moved jobs: {r}"
    );
}

#[test]
fn no_job_is_lost_or_doubled_under_faults() {
    chaos("process", true);
}

#[test]
fn no_container_is_lost_or_doubled_under_faults() {
    if !allot_system_tests::oci::require_container_support() {
        return;
    }
    chaos("oci", false);
}

/// The checks can fail: with a violation put in on purpose (`control`), the run counts it
/// (`counted`) and fails.
fn fails_with(control: &str, counted: &str) {
    let out = run("process", &["--negative-control", control]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "passed with {control}: {stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["negative_control"], control, "{r}");
    assert!(r[counted].as_u64().unwrap_or(0) >= 1, "{counted}: {r}");
    assert!(stderr.contains("chaos missed"), "{control}: {stderr}");
}

#[test]
fn the_chaos_bench_fails_on_a_job_cancelled_behind_its_back() {
    fails_with("lose", "lost");
}

#[test]
fn the_chaos_bench_fails_on_a_job_run_twice() {
    fails_with("double", "double_running");
}
