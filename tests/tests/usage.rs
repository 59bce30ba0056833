//! Usage accounting through the API: GPU-hours from the time jobs really ran, per tenant,
//! job and day, as JSON and CSV, and only of the tenants the caller may see.

use allot_system_tests::{Backend, StatusCode, spawn_cluster};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_hours_follow_what_jobs_held_while_they_ran() {
    let c = spawn_cluster(Backend::Sqlite, 1, "4xH200").await;
    c.create_tenant("a", None).await;
    c.create_tenant("b", None).await;
    // Two whole GPUs for about two seconds, and a quarter GPU for about as long.
    let whole = c.submit("a", 2, &["sleep", "2"]).await;
    let part = c
        .submit_with("a", json!({ "gpus": 1, "gpu_milli": 250 }), &["sleep", "2"])
        .await;
    let other = c.submit("b", 1, &["sleep", "1"]).await;
    let mut ran = 0.0;
    for id in [&whole, &part] {
        let j = c.wait_for_state(id, "succeeded").await;
        let secs = |k: &str| {
            chrono::DateTime::parse_from_rfc3339(j[k].as_str().expect("time")).expect("time")
        };
        let held = j["gpus"].as_f64().unwrap_or(0.0)
            * j["held_gpu_milli"].as_f64().unwrap_or(1000.0)
            / 1000.0;
        ran += held * (secs("finished_at") - secs("started_at")).num_milliseconds() as f64 / 3.6e6;
    }
    c.wait_for_state(&other, "succeeded").await;

    let (s, r) = c.get("/api/v1/usage?tenant=a").await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{r}");
    let hours = rows[0]["gpu_hours"].as_f64().expect("gpu hours");
    assert!((hours - ran).abs() < 1e-6, "reported {hours}, ran {ran}");
    assert!(hours > 2.0 * 1.5 / 3600.0, "{hours}");

    let (_, by_job) = c.get("/api/v1/usage?by=job").await;
    let jobs: Vec<&str> = by_job["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["job_id"].as_str())
        .collect();
    for id in [&whole, &part, &other] {
        assert!(jobs.contains(&id.as_str()), "{by_job}");
    }
    // As sacct shows them: names, states, submitters and elapsed times.
    let row = by_job["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["job_id"] == whole.as_str())
        .expect("the whole-GPU job's row");
    assert_eq!(row["name"], "sleep", "{row}");
    assert_eq!(row["state"], "succeeded", "{row}");
    assert!(row["user"].is_string(), "{row}");
    assert!(
        row["elapsed_secs"]
            .as_i64()
            .is_some_and(|s| (1..=10).contains(&s)),
        "{row}"
    );
    let table = c.cli(&["usage", "--by", "job"]);
    assert!(
        table.contains("ELAPSED") && table.contains("succeeded") && table.contains("00:00:0"),
        "{table}"
    );
    let (_, by_day) = c.get("/api/v1/usage?by=day").await;
    assert!(by_day["rows"][0]["day"].is_string(), "{by_day}");

    let csv = c
        .http
        .get(c.url("/api/v1/usage?format=csv&by=tenant"))
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("csv");
    assert!(
        csv.headers()["content-type"]
            .to_str()
            .is_ok_and(|t| t.starts_with("text/csv"))
    );
    let text = csv.text().await.expect("text");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            "tenant,job_id,name,state,user,elapsed_secs,day,gpu_hours,gpu_memory_gib_hours,mig_slice_hours"
        )
    );
    assert_eq!(
        lines
            .filter(|l| l.starts_with("a,") || l.starts_with("b,"))
            .count(),
        2,
        "{text}"
    );

    // A member of b sees b's usage only.
    let (_, token) = c
        .post(
            "/api/v1/tokens",
            json!({ "name": "b", "role": "member", "tenant": "b" }),
        )
        .await;
    let b_token = token["secret"].as_str().expect("secret").to_owned();
    let (s, mine) = c
        .request(reqwest::Method::GET, "/api/v1/usage", Some(&b_token), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let tenants: Vec<&str> = mine["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["tenant"].as_str())
        .collect();
    assert_eq!(tenants, vec!["b"], "{mine}");
    let (s, _) = c
        .request(
            reqwest::Method::GET,
            "/api/v1/usage?tenant=a",
            Some(&b_token),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    for (bad, status) in [
        ("by=week", StatusCode::BAD_REQUEST),
        ("format=xml", StatusCode::BAD_REQUEST),
        // Well-formed, but `from` after `to`.
        (
            "from=2026-12-01&to=2026-11-01",
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        ("from=yesterday", StatusCode::BAD_REQUEST),
    ] {
        let (s, p) = c.get(&format!("/api/v1/usage?{bad}")).await;
        assert_eq!(s, status, "{bad}: {p}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_monthly_budget_holds_back_new_work_until_it_is_raised() {
    let c = spawn_cluster(Backend::Sqlite, 1, "2xH200").await;
    // 0.001 GPU-hours: 3.6 GPU-seconds this month.
    let (s, body) = c
        .post(
            "/api/v1/tenants",
            json!({ "name": "capped", "quota": { "gpu_hour_budget": 0.001 } }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert_eq!(body["quota"]["gpu_hour_budget"], 0.001, "{body}");
    let first = c.submit("capped", 1, &["sleep", "5"]).await;
    c.wait_for_state(&first, "succeeded").await;
    let second = c.submit("capped", 1, &["true"]).await;
    let waiting = c.wait_for_reason(&second).await;
    assert_eq!(
        waiting["pending_reason"]["code"], "BudgetExhausted",
        "{waiting}"
    );
    assert!(
        waiting["pending_reason"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("capped used") && m.contains("of its 0.001 GPU-hours")),
        "{waiting}"
    );
    let (s, body) = c
        .request(
            reqwest::Method::PUT,
            "/api/v1/tenants/capped/quota",
            Some(&c.admin_token),
            Some(json!({ "gpu_hour_budget": 10.0 })),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    c.wait_for_state(&second, "succeeded").await;
    let (s, problem) = c
        .request(
            reqwest::Method::PUT,
            "/api/v1/tenants/capped/quota",
            Some(&c.admin_token),
            Some(json!({ "gpu_hour_budget": -1.0 })),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    c.shutdown().await;
}
