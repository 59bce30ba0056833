//! The tamper suite: a database superuser alters the audit log of a real PostgreSQL behind
//! the control plane's back (with triggers off: `session_replication_role = replica`), and
//! `allot audit verify` must catch every alteration, against the exported bundle and against
//! the external checkpoint sink, and name the first bad entry.

use std::path::Path;
use std::process::Command;

use allot_audit::{CompactRange, Signer};
use allot_domain::AuditEntry;
use allot_system_tests::{Backend, StatusCode, TestCluster, allot_bin, spawn_cluster};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use reqwest::Method;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};
use serde_json::json;

const ENTRIES: u32 = 12;

struct Scene {
    c: TestCluster,
    log: String,
    raw: DatabaseConnection,
    dir: tempfile::TempDir,
}

/// A tenant whose log holds 12 quota changes, checkpointed along the way.
async fn scene() -> Scene {
    let c = spawn_cluster(Backend::Postgres, 0, "").await;
    c.create_tenant("acme", None).await;
    let (_, t) = c.get("/api/v1/tenants/acme").await;
    let log = t["id"].as_str().expect("id").to_owned();
    for i in 1..=ENTRIES {
        let (s, _) = c
            .request(
                Method::PUT,
                "/api/v1/tenants/acme/quota",
                Some(&c.admin_token),
                Some(json!({ "limit": { "gpu_milli": u64::from(i) * 1000 } })),
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        if i % 4 == 0 {
            wait_for_checkpoint(&c, &log, u64::from(i)).await;
        }
    }
    let raw = Database::connect(c.db_url.as_str())
        .await
        .expect("superuser connection");
    let dir = tempfile::tempdir().expect("temp dir");
    Scene { c, log, raw, dir }
}

async fn wait_for_checkpoint(c: &TestCluster, log: &str, size: u64) {
    c.eventually("a checkpoint", || async {
        let (_, logs) = c.get("/api/v1/audit/logs").await;
        let cp = logs.as_array()?.iter().find(|l| l["log"] == log)?["checkpoint"]
            .as_str()?
            .to_owned();
        let signed: u64 = cp.lines().nth(1)?.parse().ok()?;
        (signed >= size).then_some(())
    })
    .await;
}

impl Scene {
    /// Runs SQL as the database superuser with triggers disabled.
    async fn tamper(&self, sql: &str) {
        let sql = sql.replace("$LOG", &self.log);
        self.raw
            .execute_unprepared(&format!("SET session_replication_role = replica; {sql}; SET session_replication_role = origin;"))
            .await
            .expect("tampering SQL");
    }

    /// Exports the log, then runs `allot audit verify` on it, with or without the sink.
    async fn verify(&self, with_sink: bool) -> (bool, String) {
        self.verify_export(with_sink, "").await
    }

    /// Like [`Scene::verify`] for an export with the filter `query`.
    async fn verify_export(&self, with_sink: bool, query: &str) -> (bool, String) {
        let res = self
            .c
            .http
            .get(
                self.c
                    .url(&format!("/api/v1/audit/logs/{}/export?{query}", self.log)),
            )
            .bearer_auth(&self.c.admin_token)
            .send()
            .await
            .expect("export");
        assert_eq!(res.status(), StatusCode::OK);
        let bundle = self.dir.path().join(format!("bundle-{with_sink}.tar"));
        std::fs::write(&bundle, res.bytes().await.expect("bytes")).expect("write bundle");
        let (_, key) = self.c.get("/api/v1/audit/key").await;
        let key_file = self.dir.path().join("trusted.vkey");
        std::fs::write(&key_file, key["keys"].as_str().expect("keys")).expect("write key");
        let mut cmd = Command::new(allot_bin());
        cmd.args(["audit", "verify"])
            .arg(&bundle)
            .arg("--trusted-key")
            .arg(&key_file);
        if with_sink {
            cmd.arg("--checkpoints").arg(self.c.checkpoints.path());
        }
        let out = cmd.output().expect("allot audit verify runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    async fn bodies(&self) -> Vec<(i64, String)> {
        self.raw
            .query_all_raw(Statement::from_string(
                self.raw.get_database_backend(),
                format!(
                    "SELECT seq, body FROM audit_entries WHERE log_id = '{}' ORDER BY seq",
                    self.log
                ),
            ))
            .await
            .expect("select")
            .iter()
            .map(|r| {
                (
                    r.try_get("", "seq").expect("seq"),
                    r.try_get("", "body").expect("body"),
                )
            })
            .collect()
    }
}

fn first_bad(out: &str) -> Option<u64> {
    out.lines()
        .find_map(|l| l.strip_prefix("first bad entry: "))
        .and_then(|n| n.trim().parse().ok())
}

/// Both verifications fail and name `expected` as the first bad entry.
async fn assert_caught(s: &Scene, expected: u64) {
    for with_sink in [false, true] {
        let (ok, out) = s.verify(with_sink).await;
        assert!(!ok, "undetected (sink: {with_sink}):\n{out}");
        assert_eq!(first_bad(&out), Some(expected), "sink: {with_sink}\n{out}");
    }
}

async fn assert_caught_with_sink(s: &Scene, expected: u64) {
    let (ok, out) = s.verify(true).await;
    assert!(!ok, "undetected:\n{out}");
    assert_eq!(first_bad(&out), Some(expected), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untouched_log_verifies() {
    let s = scene().await;
    for with_sink in [false, true] {
        let (ok, out) = s.verify(with_sink).await;
        assert!(ok, "{out}");
        assert!(
            out.contains(&format!("OK: log {} (whole log): {ENTRIES} entries", s.log)),
            "{out}"
        );
    }
    s.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modified_payload_is_named() {
    let s = scene().await;
    s.tamper("UPDATE audit_entries SET body = replace(body, 'tenant.quota.set', 'tenant.quota.sex') WHERE log_id = '$LOG' AND seq = 5").await;
    assert_caught(&s, 5).await;
    s.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_entry_is_named() {
    let s = scene().await;
    s.tamper("DELETE FROM audit_entries WHERE log_id = '$LOG' AND seq = 6")
        .await;
    assert_caught(&s, 6).await;
    s.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordered_entries_are_named() {
    let s = scene().await;
    s.tamper(
        "UPDATE audit_entries a SET body = b.body FROM audit_entries b \
         WHERE a.log_id = '$LOG' AND b.log_id = '$LOG' \
         AND ((a.seq = 3 AND b.seq = 4) OR (a.seq = 4 AND b.seq = 3))",
    )
    .await;
    assert_caught(&s, 3).await;
    s.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modified_payload_is_named_in_a_filtered_export() {
    let s = scene().await;
    let (ok, out) = s.verify_export(true, "action=tenant.quota.set").await;
    assert!(ok, "{out}");
    s.tamper("UPDATE audit_entries SET body = replace(body, '\"gpu_milli\":6000', '\"gpu_milli\":60000') WHERE log_id = '$LOG' AND seq = 5").await;
    for with_sink in [false, true] {
        let (ok, out) = s.verify_export(with_sink, "action=tenant.quota.set").await;
        assert!(!ok, "undetected (sink: {with_sink}):\n{out}");
        assert_eq!(first_bad(&out), Some(5), "{out}");
        assert!(out.contains("entry 5: is not in the log"), "{out}");
    }
    s.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inserted_forged_entry_is_named() {
    let s = scene().await;
    s.tamper(
        "UPDATE audit_entries SET seq = seq + 1000 WHERE log_id = '$LOG' AND seq >= 7; \
         UPDATE audit_entries SET seq = seq - 999 WHERE log_id = '$LOG' AND seq >= 1007; \
         INSERT INTO audit_entries (log_id, seq, at, leaf_hash, body, actor, action, target, outcome) \
         SELECT log_id, 7, at, leaf_hash, replace(replace(body, '\"seq\":6,', '\"seq\":7,'), 'tenant.quota.set', 'tenant.delete'), \
                actor, 'tenant.delete', target, outcome \
         FROM audit_entries WHERE log_id = '$LOG' AND seq = 6",
    )
    .await;
    assert_caught(&s, 7).await;
    s.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_tail_is_caught_by_the_sink() {
    let s = scene().await;
    s.tamper(
        "DELETE FROM audit_entries WHERE log_id = '$LOG' AND seq >= 9; \
         DELETE FROM audit_checkpoints WHERE log_id = '$LOG' AND size > 9",
    )
    .await;
    assert_caught_with_sink(&s, 9).await;
    s.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_superuser_rewrite_is_caught_by_the_sink() {
    let s = scene().await;
    // Rewrite entry 9 and recompute every later entry's history commitment and leaf hash,
    // as someone who knows the format would; signed checkpoints cannot be recomputed.
    let mut range = CompactRange::new();
    let mut updates = Vec::new();
    for (seq, body) in s.bodies().await {
        let mut entry: AuditEntry = serde_json::from_str(&body).expect("entry");
        if seq >= 9 {
            if seq == 9 {
                entry.action = "tenant.delete".into();
            }
            entry.prev_root = B64.encode(range.root());
        }
        let bytes = entry.canonical_bytes();
        let leaf = allot_audit::merkle::leaf_hash(&bytes);
        range.append(leaf);
        if seq >= 9 {
            let hex: String = leaf.iter().map(|b| format!("{b:02x}")).collect();
            let text = String::from_utf8(bytes).expect("utf8").replace('\'', "''");
            updates.push(format!(
                "UPDATE audit_entries SET body = '{text}', leaf_hash = '{hex}' WHERE log_id = '$LOG' AND seq = {seq}"
            ));
        }
    }
    updates.push("DELETE FROM audit_checkpoints WHERE log_id = '$LOG' AND size > 8".into());
    s.tamper(&updates.join("; ")).await;
    let (ok, out) = s.verify(true).await;
    assert!(!ok, "undetected:\n{out}");
    let named = first_bad(&out).expect("a first bad entry");
    assert!(
        (8..=9).contains(&named),
        "narrowed to the interval holding entry 9: {out}"
    );
    assert!(out.contains("root differs"), "{out}");
    s.c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_checkpoint_signature_is_named() {
    let s = scene().await;
    let row = s
        .raw
        .query_one_raw(Statement::from_string(
            s.raw.get_database_backend(),
            format!("SELECT size, note FROM audit_checkpoints WHERE log_id = '{}' ORDER BY size LIMIT 1", s.log),
        ))
        .await
        .expect("select")
        .expect("a checkpoint");
    let size: i64 = row.try_get("", "size").expect("size");
    let note: String = row.try_get("", "note").expect("note");
    let text = note.split("\n\n").next().expect("text").to_owned() + "\n";
    let forger = Signer::generate_system("allot.local").expect("key");
    let forged = forger.sign(&text).expect("sign");
    s.tamper(&format!(
        "UPDATE audit_checkpoints SET note = '{forged}' WHERE log_id = '$LOG' AND size = {size}"
    ))
    .await;
    let (ok, out) = s.verify(false).await;
    assert!(!ok, "undetected:\n{out}");
    assert!(
        out.lines().any(|l| l.starts_with(&format!(
            "checkpoint {size} (bundled): signature does not verify"
        ))),
        "{out}"
    );
    s.c.shutdown().await;
}

#[test]
fn verify_refuses_a_file_that_is_not_a_bundle() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("junk.tar");
    std::fs::write(&path, b"not a tar file").expect("write");
    let out = Command::new(allot_bin())
        .args(["audit", "verify"])
        .arg(Path::new(&path))
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an Allot audit bundle"));
}
