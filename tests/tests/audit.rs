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

    // Proofs beyond the log are refused naming the field (422: well-formed, but beyond
    // what exists).
    let (s, p) = c
        .get(&format!(
            "/api/v1/audit/logs/{log}/proof/inclusion?seq=999999"
        ))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(p["errors"][0]["field"], "seq");
    let (s, p) = c
        .get(&format!(
            "/api/v1/audit/logs/{log}/proof/consistency?from=5&to=2"
        ))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
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
            .is_some_and(|r| r.contains("audit.read") && r.contains("member@")),
        "the refusal names the action and the caller's role: {forbidden}"
    );
    let unauthenticated = denials
        .iter()
        .find(|e| e["action"] == "api.unauthenticated")
        .expect("the forged token is recorded");
    assert_eq!(unauthenticated["target"], "GET /api/v1/jobs");
    assert_eq!(unauthenticated["reason"], "the token is not valid");
    c.shutdown().await;
}

/// Mints a token and returns (id, secret).
async fn mint(c: &TestCluster, body: Value) -> (String, String) {
    let (s, t) = c.post("/api/v1/tokens", body).await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    (
        t["token"]["id"].as_str().expect("id").to_owned(),
        t["secret"].as_str().expect("secret").to_owned(),
    )
}

async fn set_quota(c: &TestCluster, tenant: &str, gpus: u32) {
    let (s, body) = c
        .request(
            Method::PUT,
            &format!("/api/v1/tenants/{tenant}/quota"),
            Some(&c.admin_token),
            Some(json!({ "limit": { "gpu_milli": u64::from(gpus) * 1000 } })),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auditor_reads_every_log_and_nothing_else() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("red", None).await;
    let (auditor_id, auditor) = mint(&c, json!({"name": "soc2", "role": "auditor"})).await;
    let (s, p) = c
        .post(
            "/api/v1/tokens",
            json!({"name": "x", "role": "auditor", "tenant": "red"}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["errors"][0]["field"], "tenant");
    let (_, red_admin) = mint(
        &c,
        json!({"name": "ra", "role": "tenant-admin", "tenant": "red"}),
    )
    .await;
    let (s, _) = c
        .request(
            Method::POST,
            "/api/v1/tokens",
            Some(&red_admin),
            Some(json!({"name": "y", "role": "auditor"})),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "a tenant admin cannot mint auditors"
    );

    let as_auditor = |method: Method, path: &str, body: Option<Value>| {
        let (c, token, path) = (&c, auditor.clone(), path.to_owned());
        async move { c.request(method, &path, Some(&token), body).await }
    };
    let (s, logs) = as_auditor(Method::GET, "/api/v1/audit/logs", None).await;
    assert_eq!(s, StatusCode::OK);
    let mut visible: Vec<&str> = logs
        .as_array()
        .expect("logs")
        .iter()
        .filter_map(|l| l["tenant"].as_str().or(l["log"].as_str()))
        .collect();
    visible.sort_unstable();
    assert_eq!(visible, ["red", "system"]);
    for path in [
        "/api/v1/audit/logs/system/entries",
        "/api/v1/audit/logs/red/export",
        "/api/v1/audit/entries?log=red",
        "/api/v1/audit/holds",
        "/api/v1/audit/key",
    ] {
        let (s, body) = as_auditor(Method::GET, path, None).await;
        assert_eq!(s, StatusCode::OK, "{path}: {body}");
    }
    for (method, path, body) in [
        (Method::GET, "/api/v1/tenants", None),
        (Method::GET, "/api/v1/jobs", None),
        (Method::GET, "/api/v1/nodes", None),
        (Method::GET, "/api/v1/tokens", None),
        (
            Method::POST,
            "/api/v1/tenants",
            Some(json!({"name": "evil"})),
        ),
        (
            Method::PUT,
            "/api/v1/audit/logs/red/hold",
            Some(json!({"reason": "r"})),
        ),
        (
            Method::POST,
            "/api/v1/audit/logs/red/prune",
            Some(json!({"before": "2020-01-01T00:00:00Z"})),
        ),
    ] {
        let (s, p) = as_auditor(method.clone(), path, body).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path}: {p}");
    }
    let (_, tenants) = c.get("/api/v1/tenants").await;
    assert_eq!(
        tenants.as_array().map(Vec::len),
        Some(1),
        "nothing was created"
    );

    // The auditor's reads and refusals are themselves on record, under its token.
    let (_, page) = c
        .get(&format!(
            "/api/v1/audit/entries?log=system&actor=token:{auditor_id}&limit=1000"
        ))
        .await;
    let actions: Vec<&str> = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["action"].as_str().expect("action"))
        .collect();
    assert!(actions.contains(&"audit.read"), "{actions:?}");
    assert!(actions.contains(&"audit.export"), "{actions:?}");
    assert_eq!(
        actions.iter().filter(|a| **a == "api.denied").count(),
        7,
        "{actions:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_filters_and_pages_through_every_match() {
    let c = spawn_cluster(Backend::Postgres, 0, "").await;
    c.create_tenant("red", None).await;
    c.create_tenant("blue", None).await;
    for g in 1..=5 {
        set_quota(&c, "red", g).await;
        set_quota(&c, "blue", g).await;
    }
    let q = |query: &str| {
        let c = &c;
        let path = format!("/api/v1/audit/entries?{query}");
        async move { c.get(&path).await }
    };
    let (s, all) = q("action=tenant.quota.set&limit=1000&order=oldest").await;
    assert_eq!(s, StatusCode::OK, "{all}");
    let all = all["entries"].as_array().expect("entries").clone();
    assert_eq!(all.len(), 10, "both tenants' quota changes");
    // Newest first unless asked otherwise.
    let (_, newest) = q("action=tenant.quota.set&limit=1").await;
    assert_eq!(newest["entries"][0]["seq"], all[9]["seq"], "{newest}");
    assert_eq!(newest["entries"][0]["log"], all[9]["log"], "{newest}");
    let (_, red) = q("action=tenant.quota.*&log=red").await;
    assert_eq!(red["entries"].as_array().map(Vec::len), Some(5));
    let (_, none) = q("action=tenant.quota.set&outcome=denied").await;
    assert_eq!(none["entries"].as_array().map(Vec::len), Some(0));

    // Pages of 3 cover every match once, in order, either order; and back again with
    // `before` from the last page, page by page.
    let expected: Vec<_> = all
        .iter()
        .map(|e| (e["log"].clone(), e["seq"].clone()))
        .collect();
    for order in ["oldest", "newest"] {
        let mut pages: Vec<Vec<(Value, Value)>> = Vec::new();
        let mut after: Option<String> = None;
        let last_prev = loop {
            let cursor = after
                .as_ref()
                .map(|a| format!("&after={a}"))
                .unwrap_or_default();
            let (s, page) = q(&format!(
                "action=tenant.quota.set&limit=3&order={order}{cursor}"
            ))
            .await;
            assert_eq!(s, StatusCode::OK, "{page}");
            assert_eq!(page["prev"].is_null(), pages.is_empty(), "{page}");
            pages.push(
                page["entries"]
                    .as_array()
                    .expect("entries")
                    .iter()
                    .map(|e| (e["log"].clone(), e["seq"].clone()))
                    .collect(),
            );
            match page["next"].as_str() {
                Some(n) => after = Some(n.to_owned()),
                None => break page["prev"].as_str().map(str::to_owned),
            }
        };
        let seen: Vec<_> = pages.iter().flatten().cloned().collect();
        let mut wanted = expected.clone();
        if order == "newest" {
            wanted.reverse();
        }
        assert_eq!(seen, wanted, "{order} first");
        assert_eq!(pages.len(), 4, "10 in pages of 3");
        let mut back = Vec::new();
        let mut before = last_prev;
        while let Some(b) = before {
            let (s, page) = q(&format!(
                "action=tenant.quota.set&limit=3&order={order}&before={b}"
            ))
            .await;
            assert_eq!(s, StatusCode::OK, "{page}");
            assert!(page["next"].is_string(), "a way forward again: {page}");
            back.push(
                page["entries"]
                    .as_array()
                    .expect("entries")
                    .iter()
                    .map(|e| (e["log"].clone(), e["seq"].clone()))
                    .collect::<Vec<_>>(),
            );
            before = page["prev"].as_str().map(str::to_owned);
        }
        back.reverse();
        assert_eq!(
            back,
            pages[..3].to_vec(),
            "{order}: the same pages going back"
        );
    }

    // A time window: since the sixth match, until the ninth.
    let since = all[5]["time"].as_str().expect("time");
    let until = all[8]["time"].as_str().expect("time");
    let (_, window) = q(&format!(
        "action=tenant.quota.set&since={}&until={}",
        since.replace('+', "%2B"),
        until.replace('+', "%2B")
    ))
    .await;
    let window = window["entries"].as_array().expect("entries");
    assert!(!window.is_empty() && window.len() <= 3, "{window:?}");
    assert!(window.iter().all(|e| e["time"].as_str() >= Some(since)));

    // A tenant admin searches its own log only.
    let (_, red_admin) = mint(
        &c,
        json!({"name": "ra", "role": "tenant-admin", "tenant": "red"}),
    )
    .await;
    let (_, mine) = c
        .request(
            Method::GET,
            "/api/v1/audit/entries?action=tenant.quota.set",
            Some(&red_admin),
            None,
        )
        .await;
    let mine = mine["entries"].as_array().expect("entries");
    assert_eq!(mine.len(), 5);
    let (s, _) = c
        .request(
            Method::GET,
            "/api/v1/audit/entries?log=blue",
            Some(&red_admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Malformed is 400; well-formed but contradictory, or a cursor this API never made,
    // is 422.
    for (query, field, status) in [
        ("outcome=maybe", "outcome", StatusCode::BAD_REQUEST),
        ("since=yesterday", "since", StatusCode::BAD_REQUEST),
        (
            "since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z",
            "until",
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        ("after=bm9wZQ", "after", StatusCode::UNPROCESSABLE_ENTITY),
        ("before=bm9wZQ", "before", StatusCode::UNPROCESSABLE_ENTITY),
        ("order=sideways", "order", StatusCode::BAD_REQUEST),
        ("limit=0", "limit", StatusCode::BAD_REQUEST),
    ] {
        let (s, p) = q(query).await;
        assert_eq!(s, status, "{query}: {p}");
        assert_eq!(p["errors"][0]["field"], field, "{query}: {p}");
    }
    c.shutdown().await;
}

/// Exports `log` with `query` and runs `allot audit verify` on it with the published keys.
async fn export_and_verify(c: &TestCluster, log: &str, query: &str) -> (bool, String, Vec<u8>) {
    let res = c
        .http
        .get(c.url(&format!("/api/v1/audit/logs/{log}/export?{query}")))
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("export");
    assert_eq!(res.status(), StatusCode::OK);
    let bytes = res.bytes().await.expect("bytes").to_vec();
    let dir = tempfile::tempdir().expect("dir");
    let bundle = dir.path().join("bundle.tar");
    std::fs::write(&bundle, &bytes).expect("write");
    let (_, key) = c.get("/api/v1/audit/key").await;
    let keys = dir.path().join("keys.txt");
    std::fs::write(&keys, key["keys"].as_str().expect("keys")).expect("write");
    let out = std::process::Command::new(allot_system_tests::allot_bin())
        .args(["audit", "verify"])
        .arg(&bundle)
        .arg("--trusted-key")
        .arg(&keys)
        .arg("--checkpoints")
        .arg(c.checkpoints.path())
        .output()
        .expect("verify runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        bytes,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtered_exports_prove_entries_and_pruning_respects_legal_holds() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("red", None).await;
    for g in 1..=6 {
        set_quota(&c, "red", g).await;
    }
    let (_, t) = c.get("/api/v1/tenants/red").await;
    let red = t["id"].as_str().expect("id").to_owned();
    let (_, key) = c.get("/api/v1/audit/key").await;
    let verifier = Verifier::from_vkey(key["vkey"].as_str().expect("vkey")).expect("vkey");
    checkpoint(&c, &verifier, &red, 6).await;

    // A filtered export: each matching entry with its proof, plus CSV and OCSF renderings.
    let (ok, out, bytes) = export_and_verify(&c, "red", "action=tenant.quota.set").await;
    assert!(ok, "{out}");
    assert!(out.contains("filtered export"), "{out}");
    let bundle = allot_audit::bundle::Bundle::from_tar(&bytes).expect("bundle");
    assert_eq!(bundle.entries_jsonl.lines().count(), 6);
    assert_eq!(bundle.csv.lines().count(), 1 + 6);
    let ocsf: Value =
        serde_json::from_str(bundle.ocsf_jsonl.lines().next().expect("event")).expect("json");
    assert_eq!(ocsf["class_uid"], 6003);
    assert_eq!(ocsf["api"]["operation"], "tenant.quota.set");

    // A legal hold blocks pruning until released; all three are on record.
    let hold = |method: Method, body: Option<Value>| {
        let c = &c;
        async move {
            c.request(
                method,
                "/api/v1/audit/logs/red/hold",
                Some(&c.admin_token),
                body,
            )
            .await
        }
    };
    let prune = || {
        let c = &c;
        async move {
            c.post(
                "/api/v1/audit/logs/red/prune",
                json!({"before": chrono::Utc::now().to_rfc3339()}),
            )
            .await
        }
    };
    let (s, h) = hold(Method::PUT, Some(json!({"reason": "matter 42"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{h}");
    let (s, _) = hold(Method::PUT, Some(json!({"reason": "again"}))).await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, p) = prune().await;
    assert_eq!(s, StatusCode::CONFLICT, "{p}");
    assert!(
        p["detail"]
            .as_str()
            .is_some_and(|d| d.contains("legal hold")),
        "{p}"
    );
    let (_, holds) = c.get("/api/v1/audit/holds").await;
    assert_eq!(holds[0]["reason"], "matter 42");
    let (s, _) = hold(Method::DELETE, None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, p) = prune().await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(p["pruned"], 6);

    // Pruned entries keep their place and hash: the whole log still verifies.
    let entries = all_entries(&c, &red).await;
    assert!(
        entries
            .iter()
            .all(|e| e["pruned"] == true && e["body"].is_null())
    );
    assert_eq!(entries[0]["action"], "tenant.quota.set");
    let (ok, out, _) = export_and_verify(&c, "red", "").await;
    assert!(ok, "{out}");
    assert!(out.contains("6 pruned"), "{out}");

    let (_, page) = c
        .get("/api/v1/audit/entries?log=system&action=audit.*&limit=1000")
        .await;
    let actions: Vec<&str> = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["action"].as_str().expect("action"))
        .collect();
    for want in [
        "audit.hold.set",
        "audit.hold.release",
        "audit.prune",
        "audit.export",
    ] {
        assert!(actions.contains(&want), "{want} missing from {actions:?}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evidence_bundle_holds_the_controls_policies_and_checkpoints() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("acme", None).await;
    let auditor = {
        let (s, body) = c
            .post(
                "/api/v1/tokens",
                json!({ "name": "aud", "role": "auditor" }),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        body["secret"].as_str().expect("secret").to_owned()
    };
    let member = c.token_for("acme", "tenant-admin").await;
    // Every log gets a checkpoint.
    c.eventually("checkpoints of both logs", || async {
        let (_, logs) = c.get("/api/v1/audit/logs").await;
        let logs = logs.as_array().cloned().unwrap_or_default();
        (logs.len() == 2 && logs.iter().all(|l| l["checkpoint"].is_string())).then_some(())
    })
    .await;
    let (s, _) = c
        .request(Method::GET, "/api/v1/audit/evidence", Some(&member), None)
        .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "a tenant admin gets no evidence bundle"
    );

    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().join("evidence");
    let evidence = || {
        std::process::Command::new(allot_system_tests::allot_bin())
            .args(["audit", "evidence", "--out"])
            .arg(&out)
            .env("ALLOT_SERVER", c.server.http_url())
            .env("ALLOT_TOKEN", &auditor)
            .output()
            .expect("the CLI runs")
    };
    let run = evidence();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let read =
        |p: &str| std::fs::read_to_string(out.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    // The matrices as shipped, the policies in force as shipped (the default ones).
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    for f in ["soc2-controls.md", "iso27001-controls.md"] {
        assert_eq!(
            read(&format!("controls/{f}")),
            std::fs::read_to_string(root.join(f)).expect("matrix")
        );
    }
    for f in ["allot.cedarschema", "allot.cedar"] {
        assert_eq!(
            read(&format!("policies/{f}")),
            std::fs::read_to_string(root.join(f)).expect("policy")
        );
    }
    // Every log's checkpoint, and the keys that verify it.
    let index: Value = serde_json::from_str(&read("evidence.json")).expect("index");
    let logs = index["logs"].as_array().expect("logs");
    assert_eq!(logs.len(), 2, "{index}");
    let (_, key) = c.get("/api/v1/audit/key").await;
    assert_eq!(
        read("verifier-keys.txt"),
        key["keys"].as_str().expect("keys")
    );
    for l in logs {
        let log = l["log"].as_str().expect("log");
        let note = read(&format!("checkpoints/{log}.checkpoint"));
        assert!(note.starts_with(&format!("allot.local/{log}\n")), "{note}");
    }
    // SHA256SUMS covers every file and checks.
    let sums = read("SHA256SUMS");
    assert_eq!(sums.lines().count(), 2 + 2 + 1 + 2 + 1, "{sums}");
    let check = std::process::Command::new("sha256sum")
        .args(["-c", "--quiet", "SHA256SUMS"])
        .current_dir(&out)
        .output()
        .expect("sha256sum");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    // A second run does not overwrite it.
    let again = evidence();
    assert!(!again.status.success());
    // The request is on record, with the policies' hashes.
    let entry = c
        .eventually("the request is recorded", || async {
            c.audit_log("system")
                .await
                .into_iter()
                .find(|e| e.action == "audit.evidence")
        })
        .await;
    let hashes = &entry.after.expect("after")["policies"];
    assert!(
        hashes["allot.cedar"]
            .as_str()
            .is_some_and(|h| h.len() == 64),
        "{hashes}"
    );
    c.shutdown().await;
}

/// The portal's audit page lists the newest entries first and pages both ways: with more
/// matches than a page holds, the newest submit is on the first page and the oldest is
/// reached with "Older entries" (the page used to show the oldest 100 and nothing more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_page_shows_the_newest_first_and_pages_both_ways() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("busy", None).await;
    let mut ids = Vec::new();
    for _ in 0..230 {
        ids.push(c.submit("busy", 0, &["true"]).await);
    }
    let page = |path: String| {
        let c = &c;
        async move {
            let r = c
                .http
                .get(c.url(&path))
                .bearer_auth(&c.admin_token)
                .send()
                .await
                .expect("page");
            assert!(r.status().is_success(), "{path}: {}", r.status());
            r.text().await.expect("html")
        }
    };
    let link = |html: &str, id: &str| -> Option<String> {
        let at = html.find(&format!("id=\"{id}\" href=\""))? + id.len() + 12;
        let end = html[at..].find('"')? + at;
        // As a browser reads the attribute.
        Some(html[at..end].replace("&#38;", "&").replace("&amp;", "&"))
    };
    let jobs_on = |html: &str| ids.iter().filter(|id| html.contains(id.as_str())).count();
    let first = page("/portal/audit?action=job.submit".into()).await;
    assert!(
        first.contains(&ids[229]),
        "the newest submit is on the first page"
    );
    assert!(!first.contains(&ids[0]), "the oldest is not");
    assert_eq!(jobs_on(&first), 100);
    assert_eq!(link(&first, "newer"), None);
    let second = page(link(&first, "older").expect("older entries")).await;
    assert!(second.contains(&ids[129]) && second.contains(&ids[30]));
    let third = page(link(&second, "older").expect("older entries")).await;
    assert!(third.contains(&ids[0]), "the oldest submit is reached");
    assert_eq!(jobs_on(&third), 30);
    assert_eq!(link(&third, "older"), None, "nothing older");
    let back = page(link(&third, "newer").expect("newer entries")).await;
    assert_eq!(jobs_on(&back), 100);
    assert!(
        back.contains(&ids[129]) && back.contains(&ids[30]),
        "the second page again"
    );
    let top = page(link(&back, "newer").expect("newer entries")).await;
    assert!(top.contains(&ids[229]));
    assert_eq!(link(&top, "newer"), None, "nothing newer");
    c.shutdown().await;
}
