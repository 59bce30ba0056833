//! The entries of a bundle as CSV (for spreadsheets) and as OCSF 1.3 events (for SIEMs).
//! Both are derived from the hashed JSON lines alone, so a verifier re-derives them and
//! checks that the bundle's copies say the same as what the log signed.

use serde_json::{Value, json};

use super::BundleError;

const CSV_COLUMNS: [&str; 15] = [
    "log",
    "seq",
    "time",
    "actor_kind",
    "actor_id",
    "actor_tenant",
    "auth_method",
    "source",
    "action",
    "target",
    "outcome",
    "reason",
    "request_id",
    "before",
    "after",
];

fn parse(body: &str) -> Result<Value, BundleError> {
    serde_json::from_str(body).map_err(|e| BundleError::Malformed(format!("entry: {e}")))
}

/// One CSV cell (RFC 4180 quoting). A text that a spreadsheet would run as a formula gets
/// a leading `'`, so an attacker-chosen name cannot execute in an auditor's spreadsheet.
fn cell(v: Option<&Value>) -> String {
    let text = match v {
        None | Some(Value::Null) => return String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// The entries as CSV, one row per entry, with a header row.
pub fn csv<'a>(bodies: impl Iterator<Item = &'a str>) -> Result<String, BundleError> {
    let mut out = CSV_COLUMNS.join(",");
    out.push_str("\r\n");
    for body in bodies {
        let e = parse(body)?;
        let cells = [
            e.get("log"),
            e.get("seq"),
            e.get("time"),
            e.pointer("/actor/kind"),
            e.pointer("/actor/id"),
            e.pointer("/actor/tenant_id"),
            e.pointer("/actor/auth_method"),
            e.pointer("/actor/source"),
            e.get("action"),
            e.get("target"),
            e.get("outcome"),
            e.get("reason"),
            e.get("request_id"),
            e.get("before"),
            e.get("after"),
        ];
        out.push_str(&cells.map(cell).join(","));
        out.push_str("\r\n");
    }
    Ok(out)
}

/// OCSF class, activity and their names for an action.
fn classify(action: &str) -> (u32, &'static str, u32, &'static str, u32, &'static str) {
    let verb = action.rsplit('.').next().unwrap_or("");
    let (class, class_name, category, category_name) = if action.starts_with("auth.")
        || action.starts_with("session.")
        || action == "api.unauthenticated"
    {
        (3002, "Authentication", 3, "Identity & Access Management")
    } else if action.starts_with("token.")
        || action.starts_with("role.")
        || action.starts_with("user.")
    {
        (3001, "Account Change", 3, "Identity & Access Management")
    } else {
        (6003, "API Activity", 6, "Application Activity")
    };
    let (activity, activity_name) = match (class, verb) {
        (3002, "sign_in" | "login" | "unauthenticated") => (1, "Logon"),
        (3002, "sign_out" | "logout") => (2, "Logoff"),
        (3001, "create") => (1, "Create"),
        (3001, "revoke" | "delete") => (6, "Delete"),
        (3001, "bind" | "grant") => (7, "Attach Policy"),
        (3001, "unbind") => (8, "Detach Policy"),
        (6003, "create" | "submit" | "register" | "add") => (1, "Create"),
        (6003, "read" | "list" | "export" | "get") => (2, "Read"),
        (6003, "delete" | "remove" | "cancel" | "prune") => (4, "Delete"),
        (6003, _) if verb != "denied" => (3, "Update"),
        _ => (99, "Other"),
    };
    (
        class,
        class_name,
        category,
        category_name,
        activity,
        activity_name,
    )
}

/// Milliseconds since the epoch of an entry's RFC 3339 time.
fn epoch_ms(time: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(time)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// One entry as an OCSF 1.3 event.
pub fn ocsf(e: &Value) -> Value {
    let s = |p: &str| e.pointer(p).and_then(Value::as_str);
    let action = s("/action").unwrap_or("");
    let (class, class_name, category, category_name, activity, activity_name) = classify(action);
    let outcome = s("/outcome").unwrap_or("");
    let (status_id, status, severity_id, severity) = match outcome {
        "success" => (1, "Success", 1, "Informational"),
        "denied" => (2, "Failure", 3, "Medium"),
        _ => (2, "Failure", 2, "Low"),
    };
    let time = s("/time").unwrap_or("");
    let target = s("/target").unwrap_or("");
    let actor_user = json!({
        "uid": s("/actor/id"),
        "type": s("/actor/kind"),
        "org": { "uid": s("/actor/tenant_id") },
    });
    let mut event = json!({
        "class_uid": class,
        "class_name": class_name,
        "category_uid": category,
        "category_name": category_name,
        "activity_id": activity,
        "activity_name": activity_name,
        "type_uid": class * 100 + activity,
        "type_name": format!("{class_name}: {activity_name}"),
        "time": epoch_ms(time),
        "severity_id": severity_id,
        "severity": severity,
        "status_id": status_id,
        "status": status,
        "status_detail": e.get("reason"),
        "message": format!("{action} {target}: {outcome}"),
        "actor": { "user": actor_user },
        "src_endpoint": { "ip": s("/actor/source") },
        "api": {
            "operation": action,
            "request": { "uid": e.get("request_id") },
        },
        "resources": [{
            "uid": target,
            "type": target.split('/').next(),
        }],
        "metadata": {
            "version": "1.3.0",
            "product": { "name": "Allot", "vendor_name": "Allot" },
            "uid": format!("{}/{}", s("/log").unwrap_or(""), e.get("seq").and_then(Value::as_u64).unwrap_or(0)),
            "log_name": s("/log"),
            "original_time": time,
        },
        "unmapped": {
            "auth_method": s("/actor/auth_method"),
            "before": e.get("before"),
            "after": e.get("after"),
        },
    });
    // The classes' required `user`: the account changed, or the one authenticating.
    match class {
        3001 => event["user"] = json!({ "uid": target.rsplit('/').next() }),
        3002 => event["user"] = json!({ "uid": s("/actor/id") }),
        _ => {}
    }
    event
}

/// The entries as OCSF events, one JSON object per line.
pub fn ocsf_jsonl<'a>(bodies: impl Iterator<Item = &'a str>) -> Result<String, BundleError> {
    let mut out = String::new();
    for body in bodies {
        out.push_str(&ocsf(&parse(body)?).to_string());
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: &str = r#"{"log":"t1","seq":3,"time":"2026-11-29T12:00:00.000000Z","prev_root":"x","actor":{"kind":"token","id":"tok-1","tenant_id":"t1","auth_method":"api-token","source":"10.0.0.9"},"action":"token.revoke","target":"token/tok-2","outcome":"success","reason":null,"request_id":"req-1","before":{"name":"ci, \"nightly\""},"after":null}"#;

    #[test]
    fn csv_quotes_cells_and_defuses_formulas() {
        let hostile = ENTRY.replace("token/tok-2", "=HYPERLINK(\\\"http://x\\\")");
        let out = csv([ENTRY, hostile.as_str()].into_iter()).expect("csv");
        let rows: Vec<&str> = out.split("\r\n").collect();
        assert_eq!(rows[0], CSV_COLUMNS.join(","));
        assert!(
            rows[1].starts_with("t1,3,2026-11-29T12:00:00.000000Z,token,tok-1,t1,api-token,10.0.0.9,token.revoke,token/tok-2,success,,req-1,"),
            "{}",
            rows[1]
        );
        assert!(
            rows[1].ends_with(r#","{""name"":""ci, \""nightly\""""}","#),
            "{}",
            rows[1]
        );
        assert!(rows[2].contains(r#","'=HYPERLINK"#), "{}", rows[2]);
    }

    #[test]
    fn ocsf_events_carry_class_activity_and_status() {
        let e: Value = serde_json::from_str(ENTRY).expect("json");
        let o = ocsf(&e);
        assert_eq!(o["class_uid"], 3001);
        assert_eq!(o["activity_id"], 6);
        assert_eq!(o["type_uid"], 300106);
        assert_eq!(o["status_id"], 1);
        assert_eq!(o["time"], 1_795_953_600_000_i64);
        assert_eq!(o["user"]["uid"], "tok-2");
        assert_eq!(o["src_endpoint"]["ip"], "10.0.0.9");
        assert_eq!(o["metadata"]["uid"], "t1/3");
        for (action, outcome, class, activity, status) in [
            ("api.denied", "denied", 6003, 99, 2),
            ("api.unauthenticated", "denied", 3002, 1, 2),
            ("job.submit", "success", 6003, 1, 1),
            ("audit.export", "success", 6003, 2, 1),
            ("job.transition", "success", 6003, 3, 1),
            ("tenant.quota.set", "failed", 6003, 3, 2),
        ] {
            let mut e = e.clone();
            e["action"] = action.into();
            e["outcome"] = outcome.into();
            let o = ocsf(&e);
            assert_eq!(
                (
                    o["class_uid"].clone(),
                    o["activity_id"].clone(),
                    o["status_id"].clone()
                ),
                (class.into(), activity.into(), status.into()),
                "{action}"
            );
        }
    }
}
