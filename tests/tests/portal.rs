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
use allot_system_tests::{StatusCode, TestCluster, spawn_cluster_with};

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
    // A time limit people write is read as they mean it; one that is not is said so.
    b.fill("#time_limit", "ninety").await;
    b.click("form[data-kind=job] button[type=submit]").await;
    b.wait_for_text(".error[data-for=time_limit_secs]", "not a time limit")
        .await;
    b.fill("#time_limit", "1h30m").await;
    b.fill("#cpus", "0.5").await;
    b.fill("#memory", "1").await;
    b.fill("#env", "GREETING=hello\nSTEP=3").await;
    b.click("form[data-kind=job] button[type=submit]").await;
    b.wait_for_text("#job-state", "running").await;
    assert!(b.url().await.contains("/portal/jobs/"), "{}", b.url().await);
    let submitted = b.url().await;
    let id = submitted
        .rsplit('/')
        .next()
        .expect("the job's id")
        .to_owned();
    let (_, j) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(j["time_limit_secs"], 5400, "{j}");
    assert_eq!(j["cpu_milli"], 500, "{j}");
    assert_eq!(j["memory_bytes"], 1u64 << 30, "{j}");
    assert_eq!(j["env"]["STEP"], "3", "{j}");
    b.screenshot("05-job-running").await;
    b.wait_for_text("#job-state", "succeeded").await;
    let log = b.wait_for_text("#log", "hello from GPU-").await;
    assert!(log.contains("hello from GPU-"), "{log}");
    b.screenshot("06-job-succeeded").await;
    b.goto(&c.url("/portal")).await;
    b.wait_for_text("#latest-jobs", "succeeded").await;
    // One row per tenant: what it holds of each resource, and its jobs.
    let row = b.wait_for_text("table.quotas tr.quota", "ml").await;
    assert!(row.contains("0 waiting · 0 running"), "{row}");
    // The job's hour on the GPU, in a chart with axes: a bar for ml and a y axis in
    // GPU-hours; the period links sum it by week and by month too.
    let chart = b.wait_for_text("#usage-chart figcaption", "ml").await;
    assert!(chart.contains("GPU-hours per tenant and day"), "{chart}");
    assert!(
        b.execute("return document.querySelectorAll('#usage-chart rect.seg').length")
            .await
            .as_u64()
            .is_some_and(|n| n >= 1)
    );
    b.wait_for("#allocation-chart svg").await;
    b.screenshot("07-member-dashboard").await;
    b.goto(&c.url("/portal?period=month")).await;
    let monthly = b.wait_for_text("#usage-chart figcaption", "ml").await;
    assert!(monthly.contains("per tenant and month"), "{monthly}");
    // Another tenant's chart is one that does not exist; a period must be one offered.
    c.create_tenant("secret-lab", None).await;
    b.goto(&c.url("/portal?tenant=secret-lab")).await;
    b.wait_for_text("main", "tenant `secret-lab` does not exist")
        .await;
    b.goto(&c.url("/portal?period=year")).await;
    b.wait_for_text("main", "`year` is not day, week or month")
        .await;
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

    // An auditor: told who they are and as what, offered only what an auditor can use.
    sign_in(&b, &c, "audrey").await;
    let who = b.wait_for_text("#who", "auditor").await;
    assert!(who.contains("audrey"), "{who}");
    let nav = b.text("header nav").await;
    assert!(
        nav.contains("Audit") && !nav.contains("Submit a job") && !nav.contains("Cluster"),
        "{nav}"
    );
    let dashboard = b.text("main").await;
    assert!(
        dashboard.contains("You are an auditor of the platform")
            && !dashboard.contains("hold no role"),
        "{dashboard}"
    );
    // The logs, and an export that verifies offline.
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
    // ... and the refusal keeps the navigation.
    assert!(b.text("header nav").await.contains("Audit"));
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
    // Its GPU use over time, drawn with axes and units: busy from 0% to 100%, and the GPU
    // memory it held in GiB, against the time of day.
    // (The page draws what samples its heartbeats brought when it is loaded.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        b.goto(&c.url(&format!("/portal/jobs/{talker}"))).await;
        b.wait_for("#log").await;
        let drawn = b
            .execute("return document.querySelector('#gpu-use-charts svg') !== null")
            .await;
        if drawn == true {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no GPU use was drawn for a running job"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let charts = b
        .wait_for_text("#gpu-use-charts", "How busy the job kept its GPUs")
        .await;
    assert!(charts.contains("GPU memory the job held"), "{charts}");
    let ticks = b
        .execute(
            "return [...document.querySelectorAll('#gpu-use-charts svg')[0].querySelectorAll('.axis text')].map(t => t.textContent)",
        )
        .await;
    let ticks: Vec<&str> = ticks
        .as_array()
        .expect("ticks")
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    for wanted in ["0%", "50%", "100%", "busy (%)", "time (UTC)"] {
        assert!(ticks.contains(&wanted), "{wanted} in {ticks:?}");
    }
    b.screenshot("23-job-gpu-use").await;
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
    b.wait_for_text("section.node h2", "drain").await;
    let shown = badges().await;
    assert!(
        shown == serde_json::json!(["draining"]) || shown == serde_json::json!(["drained"]),
        "one state, a drain's: {shown}"
    );
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
    // Deleting a tenant asks first, saying what it revokes and what stays.
    b.click("button[data-post='/api/v1/tenants/ml']").await;
    let asked = b
        .wait_for_text("#confirm-text", "Delete the tenant ml?")
        .await;
    assert!(
        asked.contains("tokens and role bindings are revoked"),
        "{asked}"
    );
    b.click("#confirm-no").await;
    assert_eq!(
        c.get("/api/v1/tenants/ml").await.0,
        StatusCode::OK,
        "not deleted"
    );
    b.click("button[data-post^='/api/v1/role-bindings/']").await;
    let asked = b.wait_for_text("#confirm-text", "Revoke the role").await;
    assert_eq!(
        asked,
        "Revoke the role viewer of everyone with groups = ops in ml? They lose what it allows at once."
    );
    b.click("#confirm-no").await;
    b.goto(&c.url("/portal/admin")).await;
    assert!(
        b.find("button[data-post^='/api/v1/role-bindings/']")
            .await
            .is_some(),
        "still bound"
    );
    b.quit().await;
    c.shutdown().await;
}

/// The portal at a fleet's scale: 50 nodes of 8 H200 and 500 jobs. The jobs page pages and
/// filters on the server, the cluster page leads with a summary and a heatmap (details on
/// demand), the audit page reaches the newest entry, a drain asks first, and the quota form
/// sends back every field unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_holds_up_at_fifty_nodes_and_five_hundred_jobs() {
    let idp = start_provider();
    let c = spawn_cluster_with(Backend::Sqlite, 50, "8xH200", |c| {
        // Heartbeats as often as in production: 50 nodes beating every 300 ms (the tests'
        // usual pace) are 166 writes a second on one SQLite file.
        c.heartbeat_interval = Duration::from_secs(3);
        let hour = Duration::from_secs(3600);
        idp.configure(c, &["email=root@example.com:platform-admin"], hour, hour);
    })
    .await;
    c.create_tenant("ml", None).await;
    c.create_tenant("cv", Some(4)).await;
    // 250 training jobs that run, 250 evaluations of which all but 4 wait for cv's limit.
    for i in 0..250 {
        for (tenant, name) in [("ml", format!("train-{i}")), ("cv", format!("eval-{i}"))] {
            let (status, body) = c
                .post(
                    "/api/v1/jobs",
                    serde_json::json!({ "tenant": tenant, "name": name, "gpus": 1,
                                        "command": ["sleep", "600"] }),
                )
                .await;
            assert!(status.is_success(), "{body}");
        }
    }
    let running = c
        .eventually("254 jobs to run", || async {
            let (_, page) = c.get("/api/v1/jobs?state=running&limit=500").await;
            let n = page["items"].as_array().map_or(0, Vec::len);
            (n == 254).then_some(n)
        })
        .await;
    assert_eq!(running, 254);
    let b = Browser::start("portal-scale").await;
    sign_in(&b, &c, "root").await;
    let rows = || async {
        b.execute("return document.querySelectorAll('#jobs tbody tr').length")
            .await
    };
    let names = || async {
        b.execute("return [...document.querySelectorAll('#jobs tbody tr td:first-child a')].map(a => a.textContent)")
            .await
    };

    // The jobs page: 500 match, 50 a page, newest first; the next page goes on without a
    // repeat, and back again.
    b.goto(&c.url("/portal/jobs")).await;
    b.wait_for_text("#matching", "500 jobs match").await;
    assert_eq!(rows().await, 50);
    let first = names().await;
    assert_eq!(first[0], "eval-249", "newest first: {first}");
    // Who submitted each, how long it has waited or run, its limit and its queue place.
    let header = b.text("#jobs thead").await;
    for column in ["User", "Elapsed", "Limit", "Queue", "Est. start"] {
        assert!(header.contains(column), "{column} in {header}");
    }
    let newest = b
        .execute("const r = document.querySelector('#jobs tbody tr'); return [r.querySelector('.elapsed').textContent, r.querySelector('.queue').textContent]")
        .await;
    assert!(
        newest[0].as_str().is_some_and(|e| e.starts_with("00:")),
        "an elapsed time: {newest}"
    );
    assert!(
        newest[1].as_str().is_some_and(|q| q.ends_with("/246")),
        "the newest evaluation's place in cv's queue of 246: {newest}"
    );
    b.screenshot("30-jobs-at-scale").await;
    b.click("a[rel=next]").await;
    b.wait_for_text("#jobs", "eval-224").await;
    let second = names().await;
    // 25 of each before: the page goes on with the next older, none repeated.
    assert_eq!(second[0], "eval-224", "{second}");
    let seen = first.as_array().expect("names");
    assert!(
        !second
            .as_array()
            .expect("names")
            .iter()
            .any(|n| seen.contains(n))
    );
    b.click("a[rel=prev]").await;
    b.wait_for_text("#jobs", "eval-249").await;
    assert_eq!(names().await, first);
    // Filtered on the server: cv's waiting jobs, then a name search.
    b.goto(&c.url("/portal/jobs?tenant=cv&state=pending")).await;
    b.wait_for_text("#matching", "246 jobs match").await;
    let states = b
        .execute("return [...new Set([...document.querySelectorAll('#jobs tbody .state')].map(s => s.textContent))]")
        .await;
    assert_eq!(states, serde_json::json!(["pending"]));
    b.screenshot("31-jobs-filtered").await;
    b.goto(&c.url("/portal/jobs?name=EVAL-12&sort=oldest"))
        .await;
    b.wait_for_text("#matching", "11 jobs match").await;
    let found = names().await;
    assert_eq!(found[0], "eval-12", "oldest first: {found}");
    assert_eq!(found[10], "eval-129", "{found}");

    // The cluster page: the summary first, every GPU in the heatmap, details closed.
    b.goto(&c.url("/portal/cluster")).await;
    let states = b.wait_for_text("#node-states", "50 nodes in all").await;
    assert!(states.starts_with("50 ready"), "{states}");
    let model = b.text("#models tbody tr").await;
    assert!(model.contains("H200") && model.contains("400"), "{model}");
    assert!(model.contains("254 (63%)"), "held: {model}");
    assert_eq!(
        b.execute("return document.querySelectorAll('.heatmap .heat').length")
            .await,
        400
    );
    assert_eq!(
        b.execute("return document.querySelectorAll('details.node[open]').length")
            .await,
        0
    );
    let height = b
        .execute("return document.documentElement.scrollHeight")
        .await
        .as_u64()
        .expect("height");
    assert!(height < 4000, "the cluster page is {height} px tall");
    // It carries no node's chart until that node is opened: at 50 nodes, under 150 KB.
    let weight = b
        .execute("return new TextEncoder().encode(document.documentElement.outerHTML).length")
        .await
        .as_u64()
        .expect("bytes");
    eprintln!("the cluster page at 50 nodes: {weight} bytes");
    assert!(weight < 150_000, "the cluster page is {weight} bytes");
    assert_eq!(
        b.execute("return document.querySelectorAll('.chart-slot svg').length")
            .await,
        0
    );
    let held = b
        .execute("return [...document.querySelectorAll('.heatmap .heat.l4')].map(h => h.title).find(t => t.includes('train-'))")
        .await;
    assert!(
        held.as_str().is_some_and(|t| t.contains("of ml: 1")),
        "who holds a GPU: {held}"
    );
    b.screenshot("32-cluster-summary").await;
    // A node's details open from the heatmap; its drain asks first, naming its jobs.
    let busy = b
        .execute("const a = [...document.querySelectorAll('.heatrow')].find(r => r.querySelector('.heat.l4')).querySelector('.heatname'); a.click(); return a.textContent")
        .await;
    let busy = busy.as_str().expect("a node with a GPU held").to_owned();
    // Opened, it loads its chart.
    b.wait_for("details.node[open] .chart-slot svg").await;
    b.wait_for("details.node[open] button[data-post$='/drain']")
        .await;
    b.click("details.node[open] button[data-post$='/drain']")
        .await;
    let asked = b
        .wait_for_text("#confirm-text", "stopped and requeued")
        .await;
    assert!(asked.contains(&busy), "{busy}: {asked}");
    b.screenshot("33-drain-asks-at-scale").await;
    b.click("#confirm-no").await;

    // The audit page shows the newest entry first: the tenant made just before (the
    // search the API is asked next records itself first, and shows it above).
    c.create_tenant("newest", None).await;
    b.goto(&c.url("/portal/audit")).await;
    b.wait_for("#search-results").await;
    let top = b
        .execute("const r = document.querySelector('#search-results tbody tr'); return [r.dataset.entry, r.cells[2].textContent]")
        .await;
    assert_eq!(top[1], "tenant.create", "{top}");
    let (_, newest) = c.get("/api/v1/audit/entries?limit=2").await;
    let newest = &newest["entries"];
    assert_eq!(newest[0]["action"], "audit.read", "{newest}");
    let key = format!(
        "{}:{}",
        newest[1]["log"].as_str().expect("log"),
        newest[1]["seq"]
    );
    assert_eq!(top[0], key.as_str(), "newest first");
    b.screenshot("34-audit-newest").await;
    // The auditor's own reads are left out unless asked for: root reads the log through
    // the API with its session, and the search shows it only with "my own reads".
    let read = b
        .execute("return fetch('/api/v1/audit/entries?limit=1', { credentials: 'same-origin' }).then(r => r.status)")
        .await;
    assert_eq!(read, 200);
    let top_action = || async {
        b.execute("const r = document.querySelector('#search-results tbody tr'); return r ? r.cells[2].textContent : null")
            .await
    };
    b.goto(&c.url("/portal/audit?action=audit.*")).await;
    b.wait_for("form").await;
    let hidden = b
        .execute("return [...document.querySelectorAll('#search-results tbody tr')].filter(r => r.cells[3].textContent.includes('root')).length")
        .await;
    assert_eq!(hidden, 0, "root's own reads left out");
    b.goto(&c.url("/portal/audit?action=audit.*&mine=1")).await;
    b.wait_for("#search-results").await;
    let shown = b
        .execute("return [...document.querySelectorAll('#search-results tbody tr')].filter(r => r.cells[3].textContent.includes('root')).length")
        .await;
    assert!(shown.as_u64().is_some_and(|n| n >= 1), "with mine: {shown}");
    // By time range: a window in the past holds nothing, one around now the newest.
    b.goto(&c.url("/portal/audit?from=2020-01-01T00:00&to=2020-01-02T00:00"))
        .await;
    b.wait_for_text("main", "No entries match").await;
    let now = chrono::Utc::now();
    let around = format!(
        "/portal/audit?from={}&to={}&outcome=success",
        (now - chrono::Duration::hours(1)).format("%Y-%m-%dT%H:%M"),
        (now + chrono::Duration::hours(1)).format("%Y-%m-%dT%H:%M")
    );
    b.goto(&c.url(&around)).await;
    b.wait_for("#search-results").await;
    assert!(top_action().await.is_string());
    let outcomes = b
        .execute("return [...new Set([...document.querySelectorAll('#search-results tbody tr')].map(r => r.cells[5].textContent))]")
        .await;
    assert_eq!(outcomes, serde_json::json!(["success"]));
    b.screenshot("35-audit-by-time").await;

    // The quota form sends back every field as it was.
    let patch = serde_json::json!({
        "guaranteed": { "gpu_milli": 2500, "cpu_milli": 16000, "memory_bytes": 68719476736u64,
                        "gpu_memory_bytes": 150323855360u64 },
        "limit": { "gpu_milli": 6000, "cpu_milli": 64000, "memory_bytes": 274877906944u64,
                   "gpu_memory_bytes": 601295421440u64 },
        "weight": 7, "min_isolation": "dedicated", "mig_limits": { "1g.18gb": 3 },
        "gpu_hour_budget": 1234.5,
    });
    let token = c.admin_token.clone();
    let (status, body) = c
        .request(
            reqwest::Method::PATCH,
            "/api/v1/tenants/cv/quota",
            Some(&token),
            Some(patch),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let (_, before) = c.get("/api/v1/tenants/cv/quota").await;
    b.goto(&c.url("/portal/admin")).await;
    b.execute("const s = document.querySelector('#q-tenant'); s.value = 'cv'; s.dispatchEvent(new Event('change', { bubbles: true })); return null")
        .await;
    assert_eq!(
        b.execute("return document.querySelector('#q-guaranteed').value")
            .await,
        "2.5"
    );
    b.screenshot("35-quota-form").await;
    let quota_sets = || async {
        let (_, found) = c
            .get("/api/v1/audit/entries?action=tenant.quota.set&limit=100")
            .await;
        found["entries"].as_array().map_or(0, Vec::len)
    };
    let sets = quota_sets().await;
    b.click("form[data-kind=quota] button[type=submit]").await;
    c.eventually("the form's change to land", || async {
        (quota_sets().await > sets).then_some(())
    })
    .await;
    let (_, after) = c.get("/api/v1/tenants/cv/quota").await;
    assert_eq!(
        after, before,
        "the quota form changed what it did not mean to"
    );

    // A parent's figures include its team's, its own told apart; a gang reads replicas ×
    // each = all, on the jobs page, on its own page and on the dashboard's latest jobs.
    c.create_tenant_in("lab", None, serde_json::json!({})).await;
    c.create_tenant_in("lab-team", Some("lab"), serde_json::json!({}))
        .await;
    let (status, gang) = c
        .post(
            "/api/v1/jobs",
            serde_json::json!({ "tenant": "lab-team", "name": "gang-3x2", "gpus": 2,
                                "replicas": 3, "command": ["sleep", "600"] }),
        )
        .await;
    assert!(status.is_success(), "{gang}");
    let gang = gang["id"].as_str().expect("id").to_owned();
    let own = c.submit("lab", 1, &["sleep", "600"]).await;
    for id in [&gang, &own] {
        c.wait_for_state(id, "running").await;
    }
    b.goto(&c.url("/portal")).await;
    let lab = b
        .execute("return [...document.querySelectorAll('tr.quota')].find(r => r.querySelector('th a').textContent === 'lab').textContent")
        .await;
    let lab = lab.as_str().expect("lab's row").to_owned();
    assert!(
        lab.contains("7 ·"),
        "6 of the team's and 1 of its own: {lab}"
    );
    assert!(
        lab.contains("2 running") && lab.contains("its own: 0 waiting · 1 running"),
        "{lab}"
    );
    let latest = b.text("#latest-jobs").await;
    assert!(latest.contains("3 × 2 = 6"), "{latest}");
    b.goto(&c.url("/portal/jobs?tenant=lab")).await;
    b.wait_for_text("#matching", "2 jobs match").await;
    let row = b
        .execute("return [...document.querySelectorAll('#jobs tbody tr')].find(r => r.textContent.includes('gang-3x2')).textContent")
        .await;
    assert!(
        row.as_str().is_some_and(|r| r.contains("3 × 2 = 6")),
        "the parent's filter shows its team's gang: {row}"
    );
    b.goto(&c.url(&format!("/portal/jobs/{gang}"))).await;
    let asked = b.text("#job").await;
    assert!(asked.contains("3 × 2 = 6"), "{asked}");
    b.screenshot("36-parent-and-gang-at-scale").await;

    // The tokens in force, and one revoked from the page: what used it is refused.
    let secret = c.token_for("ml", "member").await;
    b.goto(&c.url("/portal/admin")).await;
    let tokens = b.wait_for_text("#tokens", "ml-member").await;
    assert!(
        tokens.contains("member") && tokens.contains("ml"),
        "{tokens}"
    );
    let (_, list) = c.get("/api/v1/tokens").await;
    let id = list
        .as_array()
        .or_else(|| list["items"].as_array())
        .expect("tokens")
        .iter()
        .find(|t| t["name"] == "ml-member")
        .and_then(|t| t["id"].as_str())
        .expect("ml's token")
        .to_owned();
    b.click(&format!(
        "#tokens tr[data-token='{id}'] button[data-method=DELETE]"
    ))
    .await;
    let asked = b.wait_for_text("#confirm-text", "Revoke the token").await;
    assert!(asked.contains("refused from now on"), "{asked}");
    b.screenshot("37-token-revoke-asks").await;
    b.click("#confirm-yes").await;
    c.eventually("the token is refused", || async {
        let (s, _) = c
            .request(reqwest::Method::GET, "/api/v1/jobs", Some(&secret), None)
            .await;
        (s == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    b.quit().await;
}

/// Two replicas behind what a load balancer would do: the sign-in starts on replica B,
/// the provider sends the browser back to replica A's callback, which completes it; the
/// session then works on both, since sign-ins in progress and sessions are in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_started_on_one_replica_completes_on_another_in_the_browser() {
    let idp = start_provider();
    let mut shared = None;
    let a = spawn_cluster_with(Backend::Sqlite, 0, "", |c| {
        let hour = Duration::from_secs(3600);
        idp.configure(c, &["email=root@example.com:platform-admin"], hour, hour);
        // Replicas share the secrets key, as they share the database.
        c.secrets_key = allot_store::SecretKeys::generate_line("replicas").expect("key");
        shared = Some(c.clone());
    })
    .await;
    let mut config = shared.expect("A's configuration");
    config.http_listen = "127.0.0.1:0".parse().expect("address");
    config.grpc_listen = "127.0.0.1:0".parse().expect("address");
    config.replica_name = "b".into();
    let checkpoints = tempfile::tempdir().expect("temp dir");
    config.checkpoint_dir = Some(checkpoints.path().to_owned());
    if let Some(w) = config.web_sign_in.as_mut() {
        w.redirect_url = Some(a.url("/auth/callback"));
    }
    let b_server = allot_server::start(config, std::sync::Arc::new(allot_domain::SystemClock))
        .await
        .expect("replica B starts");
    assert!(!b_server.leadership.leads(), "A leads; B follows");
    let b_url = b_server.http_url();

    let b = Browser::start("replicas").await;
    b.goto(&format!("{b_url}/portal")).await;
    b.click("a[href^='/auth/login']").await;
    b.fill("input[name=login]", "root").await;
    b.fill("input[name=password]", "anything").await;
    b.click("button[type=submit]").await;
    b.wait_for("input[name=prompt][value=consent]").await;
    b.click("button[type=submit]").await;
    // A's callback completed it: the portal, signed in, on A.
    b.wait_for("button[data-post='/auth/logout']").await;
    let at = b.url().await;
    assert!(at.starts_with(&a.url("/portal")), "{at}");
    // The same session on B.
    b.goto(&format!("{b_url}/portal")).await;
    b.wait_for("button[data-post='/auth/logout']").await;
    b.screenshot("replica-b-signed-in").await;
    b_server.shutdown().await;
    a.shutdown().await;
}
