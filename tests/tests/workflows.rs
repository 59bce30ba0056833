//! The workflows people bring from Slurm, on a real control plane and agents: an array of
//! 200 tasks capped at 16 never has more than 16 holding capacity (and without a cap, it
//! has: the negative control), each task told its index; a dependency chain whose head
//! fails ends its dependents saying why, while `after-any` and `after-not-ok` ones run; an
//! `#SBATCH` script submitted unchanged takes its resources, name, array and time limit
//! from its header; a bulk cancel by name glob takes exactly what matches, and asks first;
//! every job names who submitted it; `job logs --tail` prints the last lines, `--timestamps` when each arrived.

use std::time::{Duration, Instant};

use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster};
use serde_json::{Value, json};

async fn tasks(c: &TestCluster, array: &str) -> Vec<Value> {
    let (s, list) = c
        .get(&format!("/api/v1/jobs?array={array}&limit=500"))
        .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    list["items"].as_array().expect("items").clone()
}

fn count(tasks: &[Value], states: &[&str]) -> usize {
    tasks
        .iter()
        .filter(|t| states.contains(&t["state"].as_str().unwrap_or_default()))
        .count()
}

/// Submits an array of CPU-only tasks and watches it to the end: the most tasks seen
/// holding capacity at once, and the tasks at the end.
async fn run_array(c: &TestCluster, spec: &str) -> (usize, Vec<Value>) {
    let id = c
        .submit_with(
            "t",
            json!({ "gpus": 0, "cpu_milli": 10, "memory_bytes": 16 << 20, "array": spec,
                "name": "sweep" }),
            &[
                "sh",
                "-c",
                "echo task $ALLOT_ARRAY_TASK_ID slurm $SLURM_ARRAY_TASK_ID; sleep 0.3",
            ],
        )
        .await;
    let mut most = 0;
    let start = Instant::now();
    loop {
        let all = tasks(c, &id).await;
        most = most.max(count(&all, &["scheduled", "running"]));
        let ended = count(&all, &["succeeded", "failed", "cancelled", "timed_out"]);
        if ended == all.len() {
            return (most, all);
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the array ends: {ended} of {} ended",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_array_never_runs_more_tasks_than_its_cap_and_each_knows_its_index() {
    let c = spawn_cluster(Backend::Sqlite, 2, "1xH200").await;
    c.create_tenant("t", None).await;
    let (most, all) = run_array(&c, "0-199%16").await;
    assert_eq!(all.len(), 200);
    assert_eq!(count(&all, &["succeeded"]), 200, "every task ran");
    assert!(most <= 16, "at most 16 at once, saw {most}");
    assert!(
        most >= 4,
        "tasks ran side by side, up to the cap: saw {most}"
    );
    // Each task was told its index, under both names.
    for t in all
        .iter()
        .filter(|t| t["array_index"].as_u64().is_some_and(|i| i % 50 == 7))
    {
        let i = t["array_index"].as_u64().expect("index");
        let log = c.log_of(t["id"].as_str().expect("id")).await;
        assert_eq!(log.trim(), format!("task {i} slurm {i}"));
    }
    // Listed whole, the array is one job with its tasks' counts.
    let (_, whole) = c.get("/api/v1/jobs?arrays=whole").await;
    let items = whole["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{whole}");
    assert_eq!(items[0]["array_tasks"]["succeeded"], 200);
    assert_eq!(items[0]["array"], "0-199%16");
    let table = c.cli(&["job", "list"]);
    assert!(table.contains("sweep[0-199%16]"), "{table}");
    assert!(table.contains("tasks: 200 succeeded"), "{table}");
    // Expanded, each task is itself, in index order; `job get` of the array says where its
    // tasks stand.
    let array = items[0]["id"].as_str().expect("id");
    let names = c.cli(&["job", "list", "--array", array, "--format", "name", "--all"]);
    let names: Vec<&str> = names.lines().filter(|l| l.starts_with("sweep[")).collect();
    assert_eq!(names.len(), 200);
    assert_eq!(
        names[..3],
        ["sweep[0]", "sweep[1]", "sweep[2]"],
        "{names:?}"
    );
    assert_eq!(names[199], "sweep[199]");
    let got = c.cli(&["job", "get", array]);
    assert!(got.contains("tasks: 200 succeeded"), "{got}");

    // A task is found as lists show it (`sweep[7]`) and as Slurm writes it (`ID_7`); the
    // array's name names the array.
    let seventh = all.iter().find(|t| t["array_index"] == 7).expect("task 7");
    for key in ["sweep[7]".to_owned(), format!("{array}_7")] {
        let (s, got) = c.get(&format!("/api/v1/jobs/{key}")).await;
        assert_eq!(s, StatusCode::OK, "{key}: {got}");
        assert_eq!(got["id"], seventh["id"], "{key}");
    }
    let (_, by_name) = c.get("/api/v1/jobs/sweep").await;
    assert_eq!(by_name["id"], array, "{by_name}");
    let (s, _) = c.get("/api/v1/jobs/sweep[200]").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "no such task");

    // Cancelling an array's id cancels all its unfinished tasks, as scancel does.
    let mut body = json!({ "tenant": "t", "gpus": 0, "cpu_milli": 10,
        "memory_bytes": 16 << 20, "array": "0-5%2", "command": ["sleep", "600"] });
    body["name"] = json!("doomed");
    let (s, doomed) = c.post("/api/v1/jobs", body).await;
    assert_eq!(s, StatusCode::CREATED, "{doomed}");
    let doomed = doomed["id"].as_str().expect("id").to_owned();
    let said = c.cli(&["job", "cancel", &doomed]);
    assert!(said.contains("every unfinished task cancelled"), "{said}");
    for t in tasks(&c, &doomed).await {
        let j = c.wait_for_end(t["id"].as_str().expect("id")).await;
        assert_eq!(j["state"], "cancelled", "{j}");
    }

    // The negative control: without a cap, more than 16 hold capacity at once.
    let (most, all) = run_array(&c, "0-59").await;
    assert_eq!(count(&all, &["succeeded"]), 60);
    assert!(
        most > 16,
        "uncapped, the check sees more than 16: saw {most}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dependency_chain_whose_head_fails_ends_its_dependents_saying_why() {
    let c = spawn_cluster(Backend::Sqlite, 1, "2xH200").await;
    c.create_tenant("t", None).await;
    let cpu = json!({ "gpus": 0, "cpu_milli": 10, "memory_bytes": 16 << 20 });
    let after = |kind: &str, id: &str| {
        let mut f = cpu.clone();
        f["dependencies"] = json!([{ "kind": kind, "job": id }]);
        f
    };
    let head = c
        .submit_with("t", cpu.clone(), &["sh", "-c", "sleep 1; exit 3"])
        .await;
    let next = c
        .submit_with("t", after("after-ok", &head), &["true"])
        .await;
    let last = c
        .submit_with("t", after("after-ok", &next), &["true"])
        .await;
    let cleanup = c
        .submit_with("t", after("after-any", &head), &["true"])
        .await;
    let on_failure = c
        .submit_with("t", after("after-not-ok", &head), &["true"])
        .await;
    let on_success = c
        .submit_with("t", after("after-ok", &head), &["true"])
        .await;
    // While the head runs, its dependents wait saying for what.
    let waiting = c.wait_for_reason(&next).await;
    assert_eq!(waiting["pending_reason"]["code"], "Dependency", "{waiting}");
    assert!(
        waiting["pending_reason"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("to succeed")),
        "{waiting}"
    );
    assert_eq!(c.wait_for_end(&head).await["state"], "failed");
    for id in [&next, &last, &on_success] {
        let j = c.wait_for_end(id).await;
        assert_eq!(j["state"], "cancelled", "{j}");
        assert!(
            j["message"]
                .as_str()
                .is_some_and(|m| m.contains("dependency never satisfied")),
            "{j}"
        );
        assert!(j["started_at"].is_null(), "never ran: {j}");
    }
    assert_eq!(c.wait_for_end(&cleanup).await["state"], "succeeded");
    assert_eq!(c.wait_for_end(&on_failure).await["state"], "succeeded");
    // Once the head has failed, a new job waiting for it to succeed is refused at submit,
    // saying why; one waiting for it to end is taken.
    let mut late = after("after-ok", &head);
    late["tenant"] = json!("t");
    late["command"] = json!(["true"]);
    let (s, problem) = c.post("/api/v1/jobs", late.clone()).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    let said = problem.to_string();
    assert!(
        said.contains("dependencies[0].job") && said.contains("ended failed"),
        "{problem}"
    );
    late["dependencies"][0]["kind"] = json!("after-any");
    let (s, taken) = c.post("/api/v1/jobs", late).await;
    assert_eq!(s, StatusCode::CREATED, "{taken}");

    // A dependency on a job nobody can see is refused at submit, naming the field.
    let mut body = after("after-ok", "0123456789ab");
    body["tenant"] = json!("t");
    body["command"] = json!(["true"]);
    let (s, problem) = c.post("/api/v1/jobs", body).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert!(
        problem.to_string().contains("dependencies[0].job"),
        "{problem}"
    );
    // Another tenant's job is one this tenant cannot see: the same answer.
    c.create_tenant("other", None).await;
    let theirs = c.submit_with("other", cpu.clone(), &["true"]).await;
    let member = c.token_for("t", "member").await;
    let res = c
        .http
        .post(c.url("/api/v1/jobs"))
        .bearer_auth(&member)
        .json(&json!({ "gpus": 0, "command": ["true"],
            "dependencies": [{ "kind": "after-ok", "job": theirs }] }))
        .send()
        .await
        .expect("submit");
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_sbatch_script_is_submitted_unchanged() {
    let c = spawn_cluster(Backend::Sqlite, 1, "2xH200").await;
    c.create_tenant("t", None).await;
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("sweep.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         #SBATCH --job-name=sweep\n\
         #SBATCH --gres=gpu:1\n\
         #SBATCH -c 2\n\
         #SBATCH --mem=1G\n\
         #SBATCH -t 00:10:00\n\
         #SBATCH --array=0-3%2\n\
         #SBATCH -o sweep-%A_%a.out\n\
         echo \"task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT args $*\"\n\
         echo \"$0\"\n\
         echo \"$SLURM_JOB_ID $SLURM_JOB_NAME $SLURM_SUBMIT_DIR\"\n\
         exit 3\n",
    )
    .expect("script");
    let path = script.to_str().expect("path");
    let out = c.cli(&[
        "job", "submit", "--tenant", "t", "-o", "json", path, "--", "a", "b",
    ]);
    let first: Value = serde_json::from_str(&out).expect("json");
    let array = first["array_id"].as_str().expect("an array").to_owned();
    let all = tasks(&c, &array).await;
    assert_eq!(all.len(), 4);
    for t in &all {
        assert_eq!(t["name"], "sweep");
        assert_eq!(t["gpus"], 1);
        assert_eq!(t["cpu_milli"], 2000);
        assert_eq!(t["memory_bytes"], 1u64 << 30);
        assert_eq!(t["time_limit_secs"], 600);
        assert_eq!(t["array"], "0-3%2");
        let j = c.wait_for_end(t["id"].as_str().expect("id")).await;
        assert_eq!(j["state"], "failed", "{j}");
        assert_eq!(j["exit_code"], 3, "the script's own status: {j}");
        let i = t["array_index"].as_u64().expect("index");
        let log = c.log_of(t["id"].as_str().expect("id")).await;
        let lines: Vec<&str> = log.lines().collect();
        let [said, file, slurm] = lines[..] else {
            panic!("three lines: {log}")
        };
        assert_eq!(said, format!("task {i} of 4 args a b"));
        let here = std::env::current_dir().expect("cwd");
        assert_eq!(
            slurm,
            format!("{} sweep {}", t["id"].as_str().expect("id"), here.display()),
            "Slurm's names for the job and where it was submitted from"
        );
        // The script ran from a file of its own, removed when it ended.
        assert!(file.contains("allot-batch-"), "{file}");
        assert!(
            !std::path::Path::new(file).exists(),
            "{file} is left behind"
        );
    }
    // Flags on the command line win over the script's directives.
    let out = c.cli(&[
        "job", "submit", "--tenant", "t", "--name", "mine", "--array", "0-1", "-o", "json", path,
    ]);
    let first: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(first["name"], "mine");
    assert_eq!(first["array"], "0-1");
    assert_eq!(
        first["cpu_milli"], 2000,
        "what the flags leave, the script gives"
    );
    // A script that ignores SIGTERM is killed when cancelled, and its file goes with the
    // attempt's own temporary directory.
    let stubborn = dir.path().join("stubborn.sh");
    std::fs::write(
        &stubborn,
        "#!/bin/sh\ntrap '' TERM\necho \"$0\"\nsleep 600\n",
    )
    .expect("script");
    let out = c.cli(&[
        "job",
        "submit",
        "--tenant",
        "t",
        "--gpus",
        "0",
        "-o",
        "json",
        stubborn.to_str().expect("path"),
    ]);
    let job: Value = serde_json::from_str(&out).expect("json");
    let id = job["id"].as_str().expect("id").to_owned();
    let file = c
        .eventually("the script says where it runs from", || async {
            let log = c.log_of(&id).await;
            log.lines().next().map(str::to_owned)
        })
        .await;
    assert!(std::path::Path::new(&file).exists(), "{file} while it runs");
    c.cli(&["job", "cancel", &id]);
    assert_eq!(c.wait_for_end(&id).await["state"], "cancelled");
    assert!(
        !std::path::Path::new(&file).exists(),
        "{file} is left behind"
    );
    // A directive Allot does not read is an error naming its line, unless told to skip it.
    let odd = dir.path().join("odd.sh");
    std::fs::write(&odd, "#!/bin/sh\n#SBATCH --partition=gpu\ntrue\n").expect("script");
    let refused = c.cli_output(&[
        "job",
        "submit",
        "--tenant",
        "t",
        odd.to_str().expect("path"),
    ]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("line 2") && err.contains("--partition"),
        "{err}"
    );
    c.cli(&[
        "job",
        "submit",
        "--tenant",
        "t",
        "--ignore-unknown-directives",
        odd.to_str().expect("path"),
    ]);
    // A script never says where the request goes or whose token it carries.
    let stealing = dir.path().join("steal.sh");
    std::fs::write(
        &stealing,
        "#!/bin/sh\n#ALLOT --server http://127.0.0.1:9\ntrue\n",
    )
    .expect("script");
    let refused = c.cli_output(&[
        "job",
        "submit",
        "--tenant",
        "t",
        stealing.to_str().expect("path"),
    ]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("line 2") && err.contains("--server"), "{err}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bulk_cancel_takes_what_its_glob_matches_and_asks_first() {
    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("t", None).await;
    let mut sweep = Vec::new();
    for i in 0..5 {
        sweep.push(
            c.submit_with(
                "t",
                json!({ "name": format!("sweep-{i}"), "gpus": 1 }),
                &["sleep", "600"],
            )
            .await,
        );
    }
    let keep = c
        .submit_with(
            "t",
            json!({ "name": "keep-sweep", "gpus": 1 }),
            &["sleep", "600"],
        )
        .await;
    c.wait_for_state(&sweep[0], "running").await;
    // Without --yes and without a terminal, nothing is cancelled.
    let asked = c.cli_output(&["job", "cancel", "--name", "sweep-*"]);
    assert!(!asked.status.success());
    assert!(
        String::from_utf8_lossy(&asked.stderr).contains("5 jobs match"),
        "{}",
        String::from_utf8_lossy(&asked.stderr)
    );
    let (_, j) = c.get(&format!("/api/v1/jobs/{}", sweep[0])).await;
    assert!(j["state"] != "cancelled" && j["cancel_requested"] == false);
    let listed = c.cli(&["job", "list", "--name", "sweep-*", "--format", "name"]);
    assert_eq!(
        listed.lines().filter(|l| l.starts_with("sweep-")).count(),
        5,
        "{listed}"
    );
    let out = c.cli_output(&["job", "cancel", "--name", "sweep-*", "--yes"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("5 of 5 jobs cancelled"));
    for id in &sweep {
        assert_eq!(c.wait_for_end(id).await["state"], "cancelled");
    }
    // Each says who cancelled it: the running one in its events, a waiting one in its
    // message.
    let (_, me) = c.get("/auth/session").await;
    let name = me["name"].as_str().expect("the caller's name");
    let (_, ran) = c.get(&format!("/api/v1/jobs/{}", sweep[0])).await;
    assert!(
        ran["events"].as_array().is_some_and(|es| es
            .iter()
            .any(|e| e["message"] == format!("cancel requested by {name}").as_str())),
        "{ran}"
    );
    let (_, waited) = c.get(&format!("/api/v1/jobs/{}", sweep[1])).await;
    assert_eq!(
        waited["message"],
        format!("cancelled by {name} before it was scheduled").as_str(),
        "{waited}"
    );
    let (_, k) = c.get(&format!("/api/v1/jobs/{keep}")).await;
    assert_ne!(k["state"], "cancelled", "{k}");
    assert_eq!(k["cancel_requested"], false);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_name_who_submitted_them_and_logs_have_a_tail_and_times() {
    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("t", None).await;
    let member = c.token_for("t", "member").await;
    let res = c
        .http
        .post(c.url("/api/v1/jobs"))
        .bearer_auth(&member)
        .json(&json!({ "gpus": 0, "command": ["seq", "1", "10"] }))
        .send()
        .await
        .expect("submit");
    assert_eq!(res.status(), StatusCode::CREATED);
    let job: Value = res.json().await.expect("job");
    assert_eq!(job["user"], "t-member", "the token's name: {job}");
    let id = job["id"].as_str().expect("id").to_owned();
    // A job named like another's short id hides nothing: the id wins.
    let short = job["short_id"].as_str().expect("short id").to_owned();
    c.submit_with("t", json!({ "gpus": 0, "name": short }), &["true"])
        .await;
    let (s, got) = c.get(&format!("/api/v1/jobs/{short}")).await;
    assert_eq!(s, StatusCode::OK, "{got}");
    assert_eq!(got["id"], id.as_str(), "{got}");
    let admins = c.submit_with("t", json!({ "gpus": 0 }), &["true"]).await;
    let (_, a) = c.get(&format!("/api/v1/jobs/{admins}")).await;
    assert!(a["user"].is_string() && a["user"] != "t-member", "{a}");
    // Filtered by submitter.
    let (_, mine) = c.get("/api/v1/jobs?user=t-member").await;
    let items = mine["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], id.as_str());
    let sorted = c.cli(&["job", "list", "--sort", "-priority,submitted"]);
    assert!(sorted.contains("USER"), "{sorted}");
    let table = c.cli(&["job", "list", "--user", "t-member"]);
    assert!(
        table.contains("USER") && table.contains("t-member"),
        "{table}"
    );
    assert_eq!(c.wait_for_end(&id).await["state"], "succeeded");
    let tail = c.cli(&["job", "logs", &id, "--tail", "3"]);
    assert_eq!(tail, "8\n9\n10\n");
    // What it wrote in the last hour is all of it; since a minute from now, nothing.
    assert_eq!(
        c.cli(&["job", "logs", &id, "--since", "1h"])
            .lines()
            .count(),
        10
    );
    let later = c
        .http
        .get(c.url(&format!("/api/v1/jobs/{id}/log")))
        .query(&[(
            "since",
            (chrono::Utc::now() + chrono::Duration::minutes(1))
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )])
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("log")
        .text()
        .await
        .expect("text");
    assert_eq!(later, "", "nothing written since then");
    // Since a time, as RFC 3339 writes it.
    let an_hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(
        c.cli(&["job", "logs", &id, "--since", &an_hour_ago])
            .lines()
            .count(),
        10
    );
    // Slow output, each line stamped with when it arrived: the second line's time is about
    // two seconds after the first's; unstamped, the same log has the lines alone.
    let slow = c
        .submit_with(
            "t",
            json!({ "gpus": 0 }),
            &["sh", "-c", "echo a; sleep 2; echo b"],
        )
        .await;
    assert_eq!(c.wait_for_end(&slow).await["state"], "succeeded");
    let stamped = c.cli(&["job", "logs", &slow, "--timestamps"]);
    let times: Vec<chrono::DateTime<chrono::Utc>> = stamped
        .lines()
        .zip(["a", "b"])
        .map(|(line, text)| {
            let (time, rest) = line.split_once(' ').expect("a stamp, then the line");
            assert_eq!(rest, text, "{stamped}");
            time.parse().expect("RFC 3339")
        })
        .collect();
    assert_eq!(times.len(), 2, "{stamped}");
    let apart = (times[1] - times[0]).num_milliseconds();
    assert!(
        (1000..=6000).contains(&apart),
        "{apart} ms apart: {stamped}"
    );
    assert_eq!(c.cli(&["job", "logs", &slow]), "a\nb\n");
    let last = c.cli(&["job", "logs", &slow, "--timestamps", "--tail", "1"]);
    assert!(
        last.ends_with(" b\n") && last.lines().count() == 1,
        "{last}"
    );
    // Who the caller is, and the tenants of their roles, by name.
    let me: Value = c
        .http
        .get(c.url("/auth/session"))
        .bearer_auth(&member)
        .send()
        .await
        .expect("whoami")
        .json()
        .await
        .expect("json");
    assert_eq!(me["name"], "t-member", "{me}");
    assert_eq!(me["roles"][0]["tenant"], "t", "{me}");
    // A refusal names the tenant, not its id.
    let refused = c
        .http
        .put(c.url("/api/v1/tenants/t/quota"))
        .bearer_auth(&member)
        .json(&json!({ "limit": { "gpu_milli": 1000 } }))
        .send()
        .await
        .expect("put");
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let problem: Value = refused.json().await.expect("problem");
    let detail = problem["detail"].as_str().unwrap_or_default();
    let (_, tenant) = c.get("/api/v1/tenants/t").await;
    let tenant_id = tenant["id"].as_str().expect("id");
    assert!(
        detail.contains("member@t") && !detail.contains(tenant_id),
        "{detail}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_with_a_grace_lets_jobs_run_then_moves_them_and_says_why() {
    let c = spawn_cluster(Backend::Sqlite, 2, "1xH200").await;
    c.create_tenant("t", None).await;
    let job = c.submit("t", 1, &["sleep", "600"]).await;
    let running = c.wait_for_state(&job, "running").await;
    let node = running["node_name"].as_str().expect("node").to_owned();
    let started = std::time::Instant::now();
    let said = c.cli(&[
        "node",
        "drain",
        &node,
        "--reason",
        "swap a fan",
        "--grace",
        "4s",
    ]);
    assert!(said.contains("draining (swap a fan)"), "{said}");
    let list = c.cli(&["node", "list"]);
    let line = list
        .lines()
        .find(|l| l.starts_with(&node))
        .expect("the node");
    assert!(
        line.contains("draining") && line.contains("swap a fan"),
        "{list}"
    );
    // Within the grace the job runs on, on its first attempt.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, j) = c.get(&format!("/api/v1/jobs/{job}")).await;
    if started.elapsed() < Duration::from_secs(4) {
        assert_eq!(j["state"], "running", "{j}");
        assert_eq!(j["attempt"], 1, "{j}");
    }
    // After it, the job is requeued and runs on the other node.
    let moved = c
        .eventually("the job runs elsewhere", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{job}")).await;
            (j["state"] == "running" && j["node_name"] != node.as_str()).then_some(j)
        })
        .await;
    assert_eq!(moved["attempt"], 2, "{moved}");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "not before the grace ended"
    );
    let list = c
        .eventually("the node is drained", || async {
            let list = c.cli(&["node", "list"]);
            list.lines()
                .find(|l| l.starts_with(&node))
                .is_some_and(|l| l.contains("drained"))
                .then_some(list)
        })
        .await;
    assert!(list.contains("swap a fan"), "{list}");
    // Returned to service, it says nothing of the drain any more.
    c.cli(&["node", "return", &node]);
    let list = c.cli(&["node", "list"]);
    let line = list
        .lines()
        .find(|l| l.starts_with(&node))
        .expect("the node");
    assert!(
        line.contains("ready") && !line.contains("swap a fan"),
        "{list}"
    );
    // A drained GPU is drained, not unhealthy.
    let (_, n) = c.get(&format!("/api/v1/nodes/{node}")).await;
    let gpu = n["gpus"][0]["uuid"].as_str().expect("gpu").to_owned();
    c.cli(&["node", "drain", &node, "--gpu", &gpu]);
    let wide = c.cli(&["node", "list", "-o", "wide"]);
    let header: Vec<&str> = wide
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    let line: Vec<&str> = wide
        .lines()
        .find(|l| l.starts_with(&node))
        .expect("the node")
        .split_whitespace()
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect("column");
    assert_eq!(line[col("UNHEALTHY")], "0", "{wide}");
    assert_eq!(line[col("DRAINED")], "1", "{wide}");
    // A reason with control characters, or a grace beyond a week, is refused naming the
    // flag; a grace of 0 is "at once".
    let escaped = c.cli_output(&["node", "drain", &node, "--reason", "fan\u{1b}[2J"]);
    assert!(!escaped.status.success());
    assert!(String::from_utf8_lossy(&escaped.stderr).contains("--reason"));
    let reversed = c.cli_output(&["node", "drain", &node, "--reason", "fan\u{202e}ok"]);
    assert!(!reversed.status.success(), "a text-direction override too");
    // The error naming it does not carry the escape to the terminal either.
    assert!(
        !String::from_utf8_lossy(&escaped.stderr).contains('\u{1b}'),
        "{}",
        String::from_utf8_lossy(&escaped.stderr)
    );
    // Nor may a token's name, which is who its jobs were submitted by.
    let (s, p) = c
        .post(
            "/api/v1/tokens",
            json!({ "name": "ev\u{1b}[2Jil", "tenant": "t", "role": "member" }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(p.to_string().contains("name"), "{p}");
    c.cli(&["node", "undrain", &node]);
    let long = c.cli_output(&["node", "drain", &node, "--grace", "30d"]);
    assert!(!long.status.success());
    assert!(
        String::from_utf8_lossy(&long.stderr).contains("--grace"),
        "{}",
        String::from_utf8_lossy(&long.stderr)
    );
    c.cli(&["node", "drain", &node, "--grace", "0s"]);
    c.cli(&["node", "return", &node]);
    let (s, p) = c
        .post(
            &format!("/api/v1/nodes/{node}/drain?grace_secs=9999999"),
            json!(null),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(p.to_string().contains("grace_secs"), "{p}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_arrays_failed_tasks_are_submitted_again_as_one_array() {
    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("t", None).await;
    let array = c
        .submit_with(
            "t",
            json!({ "gpus": 0, "cpu_milli": 10, "memory_bytes": 16 << 20, "array": "0-5%3" }),
            &["sh", "-c", "exit $((ALLOT_ARRAY_TASK_ID % 2))"],
        )
        .await;
    c.eventually("the array ends", || async {
        let all = tasks(&c, &array).await;
        (count(&all, &["succeeded", "failed"]) == 6).then_some(())
    })
    .await;
    let out = c.cli(&["job", "resubmit", &array, "--failed", "-o", "json"]);
    let again: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(again["array"], "1,3,5%3", "{again}");
    let new = again["array_id"].as_str().expect("an array");
    let indices: Vec<u64> = tasks(&c, new)
        .await
        .iter()
        .filter_map(|t| t["array_index"].as_u64())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(indices, [1, 3, 5]);
    // One task named by its own id is submitted again alone, keeping its index.
    let third = tasks(&c, &array)
        .await
        .into_iter()
        .find(|t| t["array_index"] == 3)
        .expect("task 3");
    let out = c.cli(&[
        "job",
        "resubmit",
        third["id"].as_str().expect("id"),
        "-o",
        "json",
    ]);
    let alone: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(alone["array"], "3", "{alone}");
    let new = alone["array_id"].as_str().expect("an array of one");
    assert_eq!(tasks(&c, new).await.len(), 1);
    // A job that is not an array's task has no failed tasks to submit again.
    let single = c.submit_with("t", json!({ "gpus": 0 }), &["true"]).await;
    let refused = c.cli_output(&["job", "resubmit", &single, "--failed"]);
    assert!(!refused.status.success());
    c.shutdown().await;
}
