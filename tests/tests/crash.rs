//! Crash consistency (`allot bench crash`, small): `allot server` killed with SIGKILL at
//! random moments under submits, cancels and agents' reports, and restarted, on PostgreSQL
//! and on SQLite. Every acknowledged submit exists and is audited, no job is lost, ran
//! twice or moved backwards, and every audit log verifies offline against the checkpoints
//! kept outside the database.

use std::process::Command;

use allot_store::testing::{Backend, TestDb};
use allot_system_tests::allot_bin;

/// `allot bench crash` on `database` with `kills` kills and `extra` arguments: whether it
/// passed, its figures and what it said.
fn run(
    database: &str,
    url: Option<&str>,
    kills: &str,
    extra: &[&str],
) -> (bool, serde_json::Value, String) {
    let mut cmd = Command::new(allot_bin());
    cmd.args([
        "bench",
        "crash",
        "--database",
        database,
        "--kills",
        kills,
        "--nodes",
        "2",
        "--rate",
        "4",
        "--up-ms",
        "700-2500",
        "--down-ms",
        "1-800",
        "--seed",
        "7",
        "--json",
    ]);
    cmd.args(extra);
    if let Some(url) = url {
        cmd.args(["--database-url", url]);
    }
    let out = cmd
        .env("ALLOT_LOG", "error")
        .output()
        .expect("allot bench crash runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let r: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("JSON ({e}): {stderr}"));
    (out.status.success(), r, stderr)
}

fn crash(database: &str, url: Option<&str>) {
    let (ok, r, stderr) = run(database, url, "4", &[]);
    assert!(ok, "{r}\n{stderr}");
    assert_eq!(r["database"], database, "{r}");
    assert_eq!(r["kills"], 4, "{r}");
    for zero in [
        "acknowledged_submits_missing",
        "acknowledged_submits_without_audit_entry",
        "lost",
        "doubled",
        "succeeded_without_a_run",
        "backwards_moves",
        "audit_history_mismatches",
        "unfinished",
    ] {
        assert_eq!(r[zero], 0, "{zero}: {r}");
    }
    assert_eq!(r["audit_verify_ok"], true, "{r}");
    assert_eq!(r["submits_refused_by_status"], serde_json::json!({}), "{r}");
    // It checked something: submits were acknowledged and their jobs ran to the end, and
    // each log was verified against checkpoints kept outside the database.
    let acked = r["submits_acknowledged"].as_u64().unwrap_or(0);
    assert!(acked > 10, "{r}");
    assert!(r["jobs_checked"].as_u64().unwrap_or(0) >= acked, "{r}");
    assert!(r["succeeded"].as_u64().unwrap_or(0) > 0, "{r}");
    for log in r["audit_logs"].as_array().expect("logs") {
        assert!(log["external_checkpoints"].as_u64().unwrap_or(0) > 0, "{r}");
        assert!(log["checkpoints_verified"].as_u64().unwrap_or(0) > 0, "{r}");
    }
}

#[test]
fn a_killed_server_on_sqlite_loses_and_repeats_nothing() {
    crash("sqlite", None);
}

#[tokio::test]
async fn a_killed_server_on_postgres_loses_and_repeats_nothing() {
    let db = TestDb::new(Backend::Postgres)
        .await
        .expect("a test database");
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || crash("postgres", Some(&url)))
        .await
        .expect("the run");
}

/// The checks can fail: with a violation put in on purpose (`control`), the run counts it
/// (`counted`) and fails, where it otherwise passes (the tests above).
fn fails_with(control: &str, counted: &str) {
    let (ok, r, stderr) = run("sqlite", None, "1", &["--negative-control", control]);
    assert!(
        !ok,
        "the run passed with {control} on purpose: {r}\n{stderr}"
    );
    assert_eq!(r["negative_control"], control, "{r}");
    assert!(r[counted].as_u64().unwrap_or(0) >= 1, "{counted}: {r}");
    assert!(
        stderr.contains("crash consistency does not hold"),
        "{control}: {stderr}"
    );
}

#[test]
fn the_crash_bench_fails_on_a_job_cancelled_behind_its_back() {
    fails_with("lose", "lost");
}

#[test]
fn the_crash_bench_fails_on_a_job_run_twice() {
    fails_with("double", "doubled");
}
