//! The entries of a bundle as CSV (for spreadsheets) and as OCSF 1.3 events (for SIEMs).
//! Both are derived from the hashed JSON lines alone, so a verifier re-derives them and
//! checks that the bundle's copies say the same as what the log signed.

use std::borrow::Cow;
use std::fmt::Write;

use serde::Deserialize;
use serde_json::value::RawValue;

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

/// The fields of an entry that the renderings show, borrowed from its line (rendering a
/// million entries must not allocate a JSON tree for each).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Entry<'a> {
    #[serde(borrow)]
    log: Option<Cow<'a, str>>,
    seq: Option<u64>,
    #[serde(borrow)]
    time: Option<Cow<'a, str>>,
    #[serde(borrow)]
    actor: Option<Actor<'a>>,
    #[serde(borrow)]
    action: Option<Cow<'a, str>>,
    #[serde(borrow)]
    target: Option<Cow<'a, str>>,
    #[serde(borrow)]
    outcome: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    request_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    before: Option<&'a RawValue>,
    #[serde(borrow)]
    after: Option<&'a RawValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Actor<'a> {
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tenant_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    auth_method: Option<Cow<'a, str>>,
    #[serde(borrow)]
    source: Option<Cow<'a, str>>,
}

static NO_ACTOR: Actor<'static> = Actor {
    kind: None,
    id: None,
    tenant_id: None,
    auth_method: None,
    source: None,
};

impl<'a> Entry<'a> {
    fn parse(body: &'a str) -> Result<Self, BundleError> {
        serde_json::from_str(body).map_err(|e| BundleError::Malformed(format!("entry: {e}")))
    }

    fn actor(&self) -> &Actor<'a> {
        self.actor.as_ref().unwrap_or(&NO_ACTOR)
    }
}

fn s<'b>(c: &'b Option<Cow<'_, str>>) -> Option<&'b str> {
    c.as_deref()
}

/// One CSV cell (RFC 4180 quoting). A text that a spreadsheet would run as a formula gets
/// a leading `'`, so an attacker-chosen name cannot execute in an auditor's spreadsheet.
fn push_cell(out: &mut String, text: Option<&str>) {
    let Some(text) = text else { return };
    let formula = text.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let quote = text.contains([',', '"', '\n', '\r']);
    if quote {
        out.push('"');
    }
    if formula {
        out.push('\'');
    }
    if quote {
        for (i, part) in text.split('"').enumerate() {
            if i > 0 {
                out.push_str("\"\"");
            }
            out.push_str(part);
        }
        out.push('"');
    } else {
        out.push_str(text);
    }
}

fn push_csv(out: &mut String, e: &Entry<'_>) {
    let seq = e.seq.map(|n| n.to_string());
    let cells = [
        s(&e.log),
        seq.as_deref(),
        s(&e.time),
        s(&e.actor().kind),
        s(&e.actor().id),
        s(&e.actor().tenant_id),
        s(&e.actor().auth_method),
        s(&e.actor().source),
        s(&e.action),
        s(&e.target),
        s(&e.outcome),
        s(&e.reason),
        s(&e.request_id),
        e.before.map(RawValue::get).filter(|v| *v != "null"),
        e.after.map(RawValue::get).filter(|v| *v != "null"),
    ];
    for (i, c) in cells.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_cell(out, c);
    }
    out.push_str("\r\n");
}

/// The entries as CSV (one row per entry, with a header row) and as OCSF events (one JSON
/// object per line), in one pass.
pub fn renderings<'a>(
    bodies: impl Iterator<Item = &'a str>,
) -> Result<(String, String), BundleError> {
    let bodies = bodies.into_iter();
    let n = bodies.size_hint().0;
    let mut csv = String::with_capacity(128 + n * 160);
    csv.push_str(&CSV_COLUMNS.join(","));
    csv.push_str("\r\n");
    let mut ocsf = String::with_capacity(n * 768);
    let mut times = TimeCache::default();
    for body in bodies {
        let e = Entry::parse(body)?;
        push_csv(&mut csv, &e);
        push_ocsf(&mut ocsf, &e, &mut times);
        ocsf.push('\n');
    }
    Ok((csv, ocsf))
}

/// Compares `csv` and `ocsf` with what `bodies` render to, one entry at a time (no second
/// copy of a large bundle's renderings); returns the first differing line of each, 1-based.
pub(crate) fn first_differences<'a>(
    bodies: impl Iterator<Item = &'a str>,
    csv: &str,
    ocsf: &str,
) -> Result<(Option<usize>, Option<usize>), BundleError> {
    let mut header = CSV_COLUMNS.join(",");
    header.push_str("\r\n");
    let mut csv_at = header.len();
    let mut csv_diff = (!csv.starts_with(&header)).then_some(1);
    let (mut ocsf_at, mut ocsf_diff) = (0, None);
    let mut times = TimeCache::default();
    let mut buf = String::with_capacity(2048);
    for (i, body) in bodies.enumerate() {
        if csv_diff.is_some() && ocsf_diff.is_some() {
            break;
        }
        let e = Entry::parse(body)?;
        if csv_diff.is_none() {
            buf.clear();
            push_csv(&mut buf, &e);
            if csv.get(csv_at..csv_at + buf.len()) == Some(buf.as_str()) {
                csv_at += buf.len();
            } else {
                csv_diff = Some(i + 2);
            }
        }
        if ocsf_diff.is_none() {
            buf.clear();
            push_ocsf(&mut buf, &e, &mut times);
            buf.push('\n');
            if ocsf.get(ocsf_at..ocsf_at + buf.len()) == Some(buf.as_str()) {
                ocsf_at += buf.len();
            } else {
                ocsf_diff = Some(i + 1);
            }
        }
    }
    // Anything after the last entry's line is extra.
    let csv_lines = csv[..csv_at.min(csv.len())].matches("\r\n").count();
    let ocsf_lines = ocsf[..ocsf_at.min(ocsf.len())].matches('\n').count();
    if csv_diff.is_none() && csv_at != csv.len() {
        csv_diff = Some(csv_lines + 1);
    }
    if ocsf_diff.is_none() && ocsf_at != ocsf.len() {
        ocsf_diff = Some(ocsf_lines + 1);
    }
    Ok((csv_diff, ocsf_diff))
}

/// Entries appended together share a time; parse each distinct one once.
#[derive(Default)]
struct TimeCache {
    last: Option<(String, Option<i64>)>,
}

impl TimeCache {
    fn epoch_ms(&mut self, time: &str) -> Option<i64> {
        if let Some((t, ms)) = &self.last
            && t == time
        {
            return *ms;
        }
        let ms = chrono::DateTime::parse_from_rfc3339(time)
            .ok()
            .map(|t| t.timestamp_millis());
        self.last = Some((time.to_owned(), ms));
        ms
    }
}

/// OCSF class, activity and their names for an action.
fn classify(action: &str) -> (u32, &'static str, u32, u32, &'static str) {
    let verb = action.rsplit('.').next().unwrap_or("");
    let (class, class_name, category) = if action.starts_with("auth.")
        || action.starts_with("session.")
        || action == "api.unauthenticated"
    {
        (3002, "Authentication", 3)
    } else if action.starts_with("token.")
        || action.starts_with("role.")
        || action.starts_with("user.")
    {
        (3001, "Account Change", 3)
    } else {
        (6003, "API Activity", 6)
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
    (class, class_name, category, activity, activity_name)
}

/// Appends `v` as a JSON string.
fn push_json_str(out: &mut String, v: &str) {
    out.push('"');
    if v.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push_str(v);
    } else {
        for c in v.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => out.push(c),
            }
        }
    }
    out.push('"');
}

/// A small JSON object writer: keys are trusted literals, values are escaped.
struct Obj<'o> {
    out: &'o mut String,
    first: bool,
}

impl<'o> Obj<'o> {
    fn open(out: &'o mut String) -> Self {
        out.push('{');
        Self { out, first: true }
    }

    fn key(&mut self, k: &str) -> &mut String {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push('"');
        self.out.push_str(k);
        self.out.push_str("\":");
        self.out
    }

    /// A string member; absent values are left out, as OCSF consumers expect.
    fn str(&mut self, k: &str, v: Option<&str>) -> &mut Self {
        if let Some(v) = v {
            let out = self.key(k);
            push_json_str(out, v);
        }
        self
    }

    fn num(&mut self, k: &str, v: Option<i64>) -> &mut Self {
        if let Some(v) = v {
            // Writing to a String cannot fail.
            let _ = write!(self.key(k), "{v}");
        }
        self
    }

    fn raw(&mut self, k: &str, v: Option<&RawValue>) -> &mut Self {
        if let Some(v) = v.filter(|v| v.get() != "null") {
            let out = self.key(k);
            out.push_str(v.get());
        }
        self
    }

    fn obj(&mut self, k: &str, f: impl FnOnce(&mut Obj<'_>)) -> &mut Self {
        let out = self.key(k);
        let mut inner = Obj::open(out);
        f(&mut inner);
        inner.close();
        self
    }

    fn close(self) {
        self.out.push('}');
    }
}

/// One entry (its JSON line) as an OCSF 1.3 event (a JSON object).
pub fn ocsf(body: &str) -> Result<String, BundleError> {
    let mut out = String::with_capacity(1024);
    push_ocsf(&mut out, &Entry::parse(body)?, &mut TimeCache::default());
    Ok(out)
}

fn push_ocsf(out: &mut String, e: &Entry<'_>, times: &mut TimeCache) {
    let action = s(&e.action).unwrap_or("");
    let (class, class_name, category, activity, activity_name) = classify(action);
    let outcome = s(&e.outcome).unwrap_or("");
    let (status_id, status, severity_id, severity) = match outcome {
        "success" => (1, "Success", 1, "Informational"),
        "denied" => (2, "Failure", 3, "Medium"),
        _ => (2, "Failure", 2, "Low"),
    };
    let time = s(&e.time).unwrap_or("");
    let target = s(&e.target).unwrap_or("");
    let actor_id = s(&e.actor().id);
    let mut o = Obj::open(out);
    o.num("class_uid", Some(class.into()))
        .str("class_name", Some(class_name))
        .num("category_uid", Some(category.into()))
        .num("activity_id", Some(activity.into()))
        .str("activity_name", Some(activity_name))
        .num(
            "type_uid",
            Some(i64::from(class) * 100 + i64::from(activity)),
        )
        .num("time", times.epoch_ms(time))
        .num("severity_id", Some(severity_id))
        .str("severity", Some(severity))
        .num("status_id", Some(status_id))
        .str("status", Some(status))
        .str("status_detail", s(&e.reason))
        .str(
            "message",
            Some(&[action, " ", target, ": ", outcome].concat()),
        )
        .obj("actor", |a| {
            a.obj("user", |u| {
                u.str("uid", actor_id)
                    .str("type", s(&e.actor().kind))
                    .obj("org", |org| {
                        org.str("uid", s(&e.actor().tenant_id));
                    });
            });
        })
        .obj("src_endpoint", |src| {
            src.str("ip", s(&e.actor().source));
        })
        .obj("api", |api| {
            api.str("operation", Some(action)).obj("request", |r| {
                r.str("uid", s(&e.request_id));
            });
        });
    o.key("resources").push('[');
    let mut res = Obj::open(o.out);
    res.str("uid", Some(target))
        .str("type", target.split('/').next());
    res.close();
    o.out.push(']');
    let uid = format!("{}/{}", s(&e.log).unwrap_or(""), e.seq.unwrap_or(0));
    o.obj("metadata", |m| {
        m.str("version", Some("1.3.0"))
            .obj("product", |p| {
                p.str("name", Some("Allot"))
                    .str("vendor_name", Some("Allot"));
            })
            .str("uid", Some(&uid))
            .str("log_name", s(&e.log))
            .str("original_time", Some(time));
    })
    .obj("unmapped", |u| {
        u.str("auth_method", s(&e.actor().auth_method))
            .raw("before", e.before)
            .raw("after", e.after);
    });
    // The classes' required `user`: the account changed, or the one authenticating.
    match class {
        3001 => {
            o.obj("user", |u| {
                u.str("uid", target.rsplit('/').next());
            });
        }
        3002 => {
            o.obj("user", |u| {
                u.str("uid", actor_id);
            });
        }
        _ => {}
    }
    o.close();
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const ENTRY: &str = r#"{"log":"t1","seq":3,"time":"2026-11-29T12:00:00.000000Z","prev_root":"x","actor":{"kind":"token","id":"tok-1","tenant_id":"t1","auth_method":"api-token","source":"10.0.0.9"},"action":"token.revoke","target":"token/tok-2","outcome":"success","reason":null,"request_id":"req-1","before":{"name":"ci, \"nightly\""},"after":null}"#;

    #[test]
    fn csv_quotes_cells_and_defuses_formulas() {
        let hostile = ENTRY.replace("token/tok-2", "=HYPERLINK(\\\"http://x\\\")");
        let (out, _) = renderings([ENTRY, hostile.as_str()].into_iter()).expect("csv");
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

    fn ocsf_of(body: &str) -> Value {
        serde_json::from_str(&ocsf(body).expect("renders")).expect("valid JSON")
    }

    #[test]
    fn ocsf_events_carry_class_activity_and_status() {
        let e: Value = serde_json::from_str(ENTRY).expect("json");
        let o = ocsf_of(ENTRY);
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
            let o = ocsf_of(&e.to_string());
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
