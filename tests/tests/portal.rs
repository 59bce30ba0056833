//! The portal in a real browser: headless Chromium over WebDriver, against a real control
//! plane with simulated GPU nodes and the real OpenID provider. An admin signs in and
//! creates a tenant with a quota; a member submits a job through the form (after seeing the
//! API's validation error next to the field), and watches it run and succeed; the pages
//! work at a phone's width; an auditor downloads an export that `allot audit verify`
//! accepts. Full-page screenshots of every page land in `target/screenshots/`.

use std::time::Duration;

use allot_store::testing::Backend;
use allot_system_tests::browser::Browser;
use allot_system_tests::oidc::start_provider;
use allot_system_tests::{TestCluster, spawn_cluster_with};

/// Signs `login` in through the provider's own sign-in and consent pages, from the portal's
/// sign-in page.
async fn sign_in(b: &Browser, c: &TestCluster, login: &str) {
    b.goto(&c.url("/portal")).await;
    b.click("a[href^='/auth/login']").await;
    b.fill("input[name=login]", login).await;
    b.fill("input[name=password]", "anything").await;
    b.click("button[type=submit]").await;
    // Consent, once its page is there.
    b.wait_for("input[name=prompt][value=consent]").await;
    b.click("button[type=submit]").await;
    b.wait_for("button[data-post='/auth/logout']").await;
    assert!(b.url().await.ends_with("/portal"), "{}", b.url().await);
}

/// Signs out of Allot, then forgets the provider's session too (the next person signs in
/// on a fresh browser).
async fn sign_out(b: &Browser) {
    b.click("button[data-post='/auth/logout']").await;
    b.wait_for("a[href^='/auth/login']").await;
    b.delete_cookies().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_members_and_auditors_do_their_work_in_the_portal() {
    let idp = start_provider();
    let c = spawn_cluster_with(Backend::Sqlite, 1, "2xH200", |c| {
        let hour = Duration::from_secs(3600);
        idp.configure(
            c,
            &[
                "email=root@example.com:platform-admin",
                "groups=ml-team:member@ml",
                "groups=auditors:auditor",
            ],
            hour,
            hour,
        );
    })
    .await;
    let b = Browser::start("portal").await;

    // Signed out: the sign-in page.
    b.goto(&c.url("/")).await;
    b.wait_for("a[href^='/auth/login']").await;
    b.screenshot("01-sign-in").await;

    // A platform admin creates the tenant `ml` with a quota.
    sign_in(&b, &c, "root").await;
    b.screenshot("02-admin-dashboard").await;
    b.goto(&c.url("/portal/admin")).await;
    b.fill("#t-name", "ml").await;
    b.fill("#t-guaranteed", "1").await;
    b.fill("#t-limit", "2").await;
    b.click("form[data-kind=tenant] button[type=submit]").await;
    b.wait_for_text("main table", "ml").await;
    // ... and lets the `ops` group view it.
    b.fill("#b-value", "ops").await;
    b.execute("document.querySelector('#b-role').value = 'viewer'; return null")
        .await;
    b.fill("#b-tenant", "ml").await;
    b.click("form[data-kind=binding] button[type=submit]").await;
    b.wait_for_text("main", "everyone with groups = ops").await;
    // A quota the API refuses says why next to the field; a good one is set.
    b.execute("document.querySelector('#q-tenant').value = 'ml'; return null")
        .await;
    b.fill("#q-guaranteed", "1").await;
    b.fill("#q-weight", "0").await;
    b.click("form[data-kind=quota] button[type=submit]").await;
    b.wait_for_text(".error[data-for=weight]", "1 to").await;
    b.fill("#q-weight", "3").await;
    b.fill("#q-limit", "2").await;
    b.click("form[data-kind=quota] button[type=submit]").await;
    b.wait_for_text("main table", "3").await;
    b.screenshot("03-admin-tenants").await;
    sign_out(&b).await;

    // A member of ml: the quota, then the job form.
    sign_in(&b, &c, "alice").await;
    b.wait_for_text(".quota", "ml").await;
    b.goto(&c.url("/portal/jobs/new")).await;
    // No GPU is in MIG mode: no MIG profile is offered (it could never run).
    assert_eq!(
        b.execute("return document.querySelectorAll('#mig_profile option').length")
            .await,
        1,
        "only `none`"
    );
    assert!(
        b.text("form[data-kind=job]")
            .await
            .contains("no GPU is in MIG mode")
    );
    // No command: the API's error shows next to the field.
    b.fill("#command", "").await;
    b.click("form[data-kind=job] button[type=submit]").await;
    let error = b.wait_for_text(".error[data-for=command]", "").await;
    assert!(!error.trim().is_empty(), "a field error for the command");
    assert_eq!(
        b.execute("return document.querySelector('#command').getAttribute('aria-invalid')")
            .await,
        "true"
    );
    b.screenshot("04-submit-error").await;
    b.fill("#command", "echo hello from $CUDA_VISIBLE_DEVICES; sleep 3")
        .await;
    // One and a half GPUs: said next to the field, in words (it was "invalid type:
    // floating point `1.5`, expected u32").
    b.fill("#gpus", "1.5").await;
    b.click("form[data-kind=job] button[type=submit]").await;
    let error = b
        .wait_for_text(".error[data-for=gpus]", "cannot be held")
        .await;
    assert!(error.contains("a share of one GPU (e.g. 0.5)"), "{error}");
    b.fill("#gpus", "1").await;
    b.click("form[data-kind=job] button[type=submit]").await;
    b.wait_for_text("#job-state", "running").await;
    assert!(b.url().await.contains("/portal/jobs/"), "{}", b.url().await);
    b.screenshot("05-job-running").await;
    b.wait_for_text("#job-state", "succeeded").await;
    let log = b.wait_for_text("#log", "hello from GPU-").await;
    assert!(log.contains("hello from GPU-"), "{log}");
    b.screenshot("06-job-succeeded").await;
    b.goto(&c.url("/portal")).await;
    b.wait_for_text("main table", "succeeded").await;
    b.screenshot("07-member-dashboard").await;
    b.goto(&c.url("/portal/cluster")).await;
    b.wait_for_text("main", "node-1").await;
    b.screenshot("08-cluster").await;
    // A phone's width: nothing wider than the screen.
    b.resize(390, 844).await;
    b.goto(&c.url("/portal")).await;
    b.wait_for(".quota").await;
    let overflow = b
        .execute("return document.documentElement.scrollWidth - window.innerWidth")
        .await;
    assert!(overflow.as_i64().is_some_and(|o| o <= 0), "{overflow}");
    b.screenshot("09-phone-dashboard").await;
    b.resize(1280, 900).await;
    sign_out(&b).await;

    // An auditor: the logs, and an export that verifies offline.
    sign_in(&b, &c, "audrey").await;
    b.goto(&c.url("/portal/audit")).await;
    b.wait_for_text("main table", "system").await;
    b.screenshot("10-audit").await;
    b.fill("#action", "tenant.*").await;
    b.click("form.inline button[type=submit]").await;
    b.wait_for_text("main", "tenant.create").await;
    b.screenshot("11-audit-search").await;
    let href = b
        .execute(
            "return document.querySelector('a[download^=\"audit-system\"]').getAttribute('href')",
        )
        .await;
    let href = href.as_str().expect("an export link").to_owned();
    let session = b.cookie("allot_session").await.expect("a session cookie");
    let bundle = c
        .http
        .get(c.url(&href))
        .header("cookie", format!("allot_session={session}"))
        .send()
        .await
        .expect("download");
    assert!(bundle.status().is_success(), "{}", bundle.status());
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("export.json");
    std::fs::write(&file, bundle.bytes().await.expect("bytes")).expect("write");
    let (_, key) = c.get("/api/v1/audit/key").await;
    let keys = dir.path().join("keys.txt");
    std::fs::write(&keys, key["keys"].as_str().expect("keys")).expect("write");
    let out = std::process::Command::new(allot_system_tests::allot_bin())
        .args(["audit", "verify"])
        .arg(&file)
        .arg("--trusted-key")
        .arg(&keys)
        .output()
        .expect("verify runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // An auditor has no tenant administration.
    b.goto(&c.url("/portal/admin")).await;
    b.wait_for_text("h1", "Not allowed").await;
    assert!(b.find("form[data-kind=tenant]").await.is_none());
    b.screenshot("12-auditor-refused").await;
    sign_out(&b).await;
    b.quit().await;
    c.shutdown().await;
}

/// Drain, cordon, cancel and revoke ask first, saying what they stop, and do nothing when
/// the answer is no; a drained node shows one state, once. (They used to act on one click,
/// and a drained node showed both "ready" and "cordoned".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_that_stop_work_ask_first_and_a_node_shows_one_state() {
    let idp = start_provider();
    let c = spawn_cluster_with(Backend::Sqlite, 1, "2xH200", |c| {
        let hour = Duration::from_secs(3600);
        idp.configure(c, &["email=root@example.com:platform-admin"], hour, hour);
    })
    .await;
    c.create_tenant("ml", None).await;
    let train = c
        .submit_with(
            "ml",
            serde_json::json!({ "name": "train-resnet" }),
            &["sleep", "60"],
        )
        .await;
    c.wait_for_state(&train, "running").await;
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let node_id = nodes[0]["id"].as_str().expect("node id").to_owned();
    let b = Browser::start("portal-confirm").await;
    sign_in(&b, &c, "root").await;
    let talker = c
        .submit_with(
            "ml",
            serde_json::json!({ "name": "talker" }),
            &["sh", "-c", "echo line-1; sleep 6; echo line-2; sleep 120"],
        )
        .await;

    // A running job's log grows on its page as the job writes it; the page is not reloaded.
    c.wait_for_state(&talker, "running").await;
    b.goto(&c.url(&format!("/portal/jobs/{talker}"))).await;
    b.wait_for("#log").await;
    b.execute("window.sameDocument = true; return null").await;
    b.wait_for_text("#log", "line-1").await;
    let first = b.text("#log").await;
    assert!(!first.contains("line-2"), "{first}");
    let grown = b.wait_for_text("#log", "line-2").await;
    assert_eq!(grown.trim(), "line-1\nline-2", "each line once: {grown:?}");
    assert_eq!(
        b.execute("return window.sameDocument === true").await,
        true,
        "the log grew in place, without a reload"
    );
    b.screenshot("20-log-grows").await;
    let (status, body) = c
        .post(
            &format!("/api/v1/jobs/{talker}/cancel"),
            serde_json::json!({}),
        )
        .await;
    assert!(status.is_success(), "{body}");
    // Its end reloads the page once, showing how it ended.
    b.wait_for_text("#job-state", "cancelled").await;
    // A quota with no limit is drawn against what the fleet has, not full: 1 of 2 GPUs.
    b.goto(&c.url("/portal")).await;
    let legend = b.wait_for_text(".quota .legend", "limit none").await;
    assert!(legend.contains("limit none (the fleet has 2)"), "{legend}");
    assert_eq!(
        b.execute("return document.querySelector('.quota .bar .used').style.width")
            .await,
        "50%"
    );
    let dialog_open = || async {
        b.execute("return document.getElementById('confirm').open")
            .await
    };
    let badges = || async {
        b.execute("return [...document.querySelectorAll('section.node h2 .state')].map(s => s.textContent)")
            .await
    };

    b.goto(&c.url("/portal/cluster")).await;
    b.wait_for_text("main", "node-1").await;
    assert_eq!(badges().await, serde_json::json!(["ready"]));
    // Drain: asked, naming the job it stops; "keep" changes nothing.
    b.click(&format!(
        "button[data-post='/api/v1/nodes/{node_id}/drain']"
    ))
    .await;
    let asked = b.wait_for_text("#confirm-text", "train-resnet (ml)").await;
    assert!(
        asked.contains("stopped and requeued to run elsewhere"),
        "{asked}"
    );
    assert_eq!(dialog_open().await, true);
    b.screenshot("21-drain-asks").await;
    b.click("#confirm-no").await;
    assert_eq!(dialog_open().await, false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, node) = c.get(&format!("/api/v1/nodes/{node_id}")).await;
    assert_eq!(node["cordoned"], false, "not drained: {node}");
    let (_, job) = c.get(&format!("/api/v1/jobs/{train}")).await;
    assert_eq!(job["attempt"], 1, "{job}");
    // Confirmed, it drains: the job is requeued and the node shows one state.
    b.click(&format!(
        "button[data-post='/api/v1/nodes/{node_id}/drain']"
    ))
    .await;
    b.wait_for_text("#confirm-text", "train-resnet").await;
    b.click("#confirm-yes").await;
    b.wait_for_text("section.node h2", "cordoned").await;
    assert_eq!(badges().await, serde_json::json!(["cordoned"]));
    b.screenshot("22-drained-one-state").await;
    c.eventually("the drained job requeued", || async {
        let (_, j) = c.get(&format!("/api/v1/jobs/{train}")).await;
        (j["attempt"] == 2).then_some(())
    })
    .await;
    b.click(&format!(
        "button[data-post='/api/v1/nodes/{node_id}/uncordon']"
    ))
    .await;
    b.wait_for_text("section.node h2", "ready").await;
    c.wait_for_state(&train, "running").await;

    // Cancel: asked on the job's page (which stops reloading while it asks).
    b.goto(&c.url(&format!("/portal/jobs/{train}"))).await;
    b.click(&format!("button[data-post='/api/v1/jobs/{train}/cancel']"))
        .await;
    let asked = b
        .wait_for_text("#confirm-text", "Cancel train-resnet")
        .await;
    assert!(asked.contains("does not run again"), "{asked}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        dialog_open().await,
        true,
        "still asking after a refresh period"
    );
    b.click("#confirm-yes").await;
    b.wait_for_text("#job-state", "cancel").await;
    c.wait_for_state(&train, "cancelled").await;

    // Revoke: asked, naming the role and who holds it.
    let (status, body) = c
        .post(
            "/api/v1/role-bindings",
            serde_json::json!({ "claim": "groups", "value": "ops", "role": "viewer", "tenant": "ml" }),
        )
        .await;
    assert!(status.is_success(), "{body}");
    b.goto(&c.url("/portal/admin")).await;
    b.click("button[data-method=DELETE]").await;
    let asked = b.wait_for_text("#confirm-text", "Revoke the role").await;
    assert_eq!(
        asked,
        "Revoke the role viewer of everyone with groups = ops in ml? They lose what it allows at once."
    );
    b.click("#confirm-no").await;
    b.goto(&c.url("/portal/admin")).await;
    assert!(
        b.find("button[data-method=DELETE]").await.is_some(),
        "still bound"
    );
    b.quit().await;
    c.shutdown().await;
}
