//! The audit log from the outside: signed checkpoints that verify with the published key,
//! entries that rebuild the signed root, proofs that check, the external sink's copy, and
//! who may read what.

use allot_audit::merkle::{leaf_hash, root, verify_consistency, verify_inclusion};
use allot_audit::{Checkpoint, Hash, Verifier, note};
use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use reqwest::Method;
use serde_json::{Value, json};

fn b64hash(v: &Value) -> Hash {
    B64.decode(v.as_str().expect("base64 string"))
        .expect("base64")
        .try_into()
        .expect("32 bytes")
}

/// The `proof` hashes of a proof response.
fn proof_of(response: &Value) -> Vec<Hash> {
    response["proof"]
        .as_array()
        .expect("proof")
        .iter()
        .map(b64hash)
        .collect()
}

/// Waits for a verified checkpoint of `log` covering at least `min_size` entries.
async fn checkpoint(
    c: &TestCluster,
    verifier: &Verifier,
    log: &str,
    min_size: u64,
) -> (Checkpoint, String) {
    c.eventually("a checkpoint", || async {
        let res = c
            .http
            .get(c.url(&format!("/api/v1/audit/logs/{log}/checkpoint")))
            .bearer_auth(&c.admin_token)
            .send()
            .await
            .ok()?;
        if res.status() != StatusCode::OK {
            return None;
        }
        let text = res.text().await.ok()?;
        let opened =
            note::open(&text, std::slice::from_ref(verifier)).expect("checkpoint verifies");
        let cp = Checkpoint::parse(&opened.text).expect("checkpoint parses");
        (cp.size >= min_size).then_some((cp, text))
    })
    .await
}

async fn all_entries(c: &TestCluster, log: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let (s, page) = c
            .get(&format!(
                "/api/v1/audit/logs/{log}/entries?from={from}&limit=7"
            ))
            .await;
        assert_eq!(s, StatusCode::OK, "{page}");
        out.extend(page["entries"].as_array().expect("entries").iter().cloned());
        match page["next_from"].as_u64() {
            Some(n) => from = n,
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_entries_and_proofs_verify_offline() {
    let c = spawn_cluster(Backend::Postgres, 1, "2xH200").await;
    c.create_tenant("audited", None).await;
    let (_, t) = c.get("/api/v1/tenants/audited").await;
    let log = t["id"].as_str().expect("id").to_owned();
    let id = c.submit("audited", 1, &["true"]).await;
    c.wait_for_state(&id, "succeeded").await;

    let (_, key) = c.get("/api/v1/audit/key").await;
    let verifier = Verifier::from_vkey(key["vkey"].as_str().expect("vkey")).expect("vkey parses");
    // submit + 3 transitions.
    let (first, first_note) = checkpoint(&c, &verifier, &log, 4).await;
    assert_eq!(first.origin, format!("allot.local/{log}"));

    // The entries rebuild the signed root, byte for byte.
    let entries = all_entries(&c, &log).await;
    let leaves: Vec<Hash> = entries
        .iter()
        .map(|e| leaf_hash(e["body"].as_str().expect("body").as_bytes()))
        .collect();
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["seq"], i as u64);
        let hex: String = leaves[i].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(e["leaf_hash"], hex);
    }
    let size = usize::try_from(first.size).expect("size");
    assert_eq!(root(&leaves[..size]), first.root);

    // Each entry's inclusion proof at the checkpoint's size checks against its root.
    for seq in 0..first.size {
        let (s, p) = c
            .get(&format!(
                "/api/v1/audit/logs/{log}/proof/inclusion?seq={seq}&size={}",
                first.size
            ))
            .await;
        assert_eq!(s, StatusCode::OK, "{p}");
        verify_inclusion(
            &leaves[seq as usize],
            seq,
            first.size,
            &proof_of(&p),
            &first.root,
        )
        .expect("inclusion");
    }

    // More activity, a later checkpoint, and a consistency proof between the two.
    let more = c.submit("audited", 1, &["true"]).await;
    c.wait_for_state(&more, "succeeded").await;
    let (second, _) = checkpoint(&c, &verifier, &log, first.size + 4).await;
    let (s, p) = c
        .get(&format!(
            "/api/v1/audit/logs/{log}/proof/consistency?from={}&to={}",
            first.size, second.size
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    verify_consistency(
        first.size,
        second.size,
        &first.root,
        &second.root,
        &proof_of(&p),
    )
    .expect("consistency");

    // The external sink holds the same signed note.
    let copy = std::fs::read_to_string(
        c.checkpoints
            .path()
            .join(&log)
            .join(format!("{:020}.checkpoint", first.size)),
    )
    .expect("checkpoint copy outside the database");
    assert_eq!(copy, first_note);

    // The system log records tenant checkpoints and these reads.
    let system = all_entries(&c, "system").await;
    let actions: Vec<String> = system
        .iter()
        .map(|e| {
            let body: Value =
                serde_json::from_str(e["body"].as_str().expect("body")).expect("json");
            body["action"].as_str().expect("action").to_owned()
        })
        .collect();
    assert!(actions.contains(&"tenant.create".to_owned()));
    assert!(actions.contains(&"audit.checkpoint".to_owned()));
    assert!(actions.contains(&"audit.read".to_owned()));

    // Bad proof requests are clear 400s.
    let (s, p) = c
        .get(&format!(
            "/api/v1/audit/logs/{log}/proof/inclusion?seq=999999"
        ))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(p["errors"][0]["field"], "seq");
    let (s, p) = c
        .get(&format!(
            "/api/v1/audit/logs/{log}/proof/consistency?from=5&to=2"
        ))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(p["errors"][0]["field"], "from");
    let (s, p) = c
        .get(&format!("/api/v1/audit/logs/{log}/entries?limit=0"))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(p["errors"][0]["field"], "limit");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_read_only_their_own_audit_log() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("red", None).await;
    c.create_tenant("blue", None).await;
    let id_of = |v: &Value| v["id"].as_str().expect("id").to_owned();
    let (_, red) = c.get("/api/v1/tenants/red").await;
    let (_, blue) = c.get("/api/v1/tenants/blue").await;
    let (red, blue) = (id_of(&red), id_of(&blue));
    let mint = |role: &str| json!({"name": format!("red-{role}"), "tenant": "red", "role": role});
    let (_, admin) = c.post("/api/v1/tokens", mint("tenant-admin")).await;
    let (_, member) = c.post("/api/v1/tokens", mint("member")).await;
    let admin = admin["secret"].as_str().expect("secret").to_owned();
    let member = member["secret"].as_str().expect("secret").to_owned();

    let get = |token: String, path: String| {
        let c = &c;
        async move { c.request(Method::GET, &path, Some(&token), None).await }
    };
    let (s, logs) = get(admin.clone(), "/api/v1/audit/logs".into()).await;
    assert_eq!(s, StatusCode::OK);
    let visible: Vec<&str> = logs
        .as_array()
        .expect("logs")
        .iter()
        .map(|l| l["log"].as_str().expect("log"))
        .collect();
    assert_eq!(
        visible,
        [red.as_str()],
        "a tenant admin sees only its tenant's log"
    );
    assert_eq!(logs[0]["tenant"], "red");
    let (s, _) = get(admin.clone(), format!("/api/v1/audit/logs/{red}/entries")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = get(admin.clone(), format!("/api/v1/audit/logs/{blue}/entries")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = get(admin.clone(), "/api/v1/audit/logs/system/entries".into()).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = get(member.clone(), "/api/v1/audit/logs".into()).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = get(member, format!("/api/v1/audit/logs/{red}/entries")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = get(admin, "/api/v1/audit/logs/no-such-log/entries".into()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = get("allot_forged".into(), "/api/v1/jobs".into()).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // Every refusal is in the system log: who, from where, what, and why.
    let (_, page) = c.get("/api/v1/audit/logs/system/entries?limit=1000").await;
    let denials: Vec<Value> = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| serde_json::from_str::<Value>(e["body"].as_str().expect("body")).expect("json"))
        .filter(|e| e["outcome"] == "denied")
        .collect();
    let forbidden = denials
        .iter()
        .find(|e| {
            e["action"] == "api.denied"
                && e["target"] == format!("GET /api/v1/audit/logs/{red}/entries")
        })
        .expect("the member's refused read is recorded");
    assert_eq!(forbidden["actor"]["tenant_id"], red.as_str());
    assert_eq!(forbidden["actor"]["source"], "127.0.0.1");
    assert!(
        forbidden["reason"]
            .as_str()
            .is_some_and(|r| r.contains("tenant-admin")),
        "{forbidden}"
    );
    let unauthenticated = denials
        .iter()
        .find(|e| e["action"] == "api.unauthenticated")
        .expect("the forged token is recorded");
    assert_eq!(unauthenticated["target"], "GET /api/v1/jobs");
    assert_eq!(unauthenticated["reason"], "the token is not valid");
    c.shutdown().await;
}
