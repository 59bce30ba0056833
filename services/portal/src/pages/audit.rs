//! The audit page (`/portal/audit`): logs, checkpoints, exports and search.

use super::super::*;

pub(crate) struct LogRow {
    id: String,
    name: String,
    size: u64,
    checkpoint: String,
}

pub(crate) struct EntryRow {
    /// `<log>:<seq>`.
    key: String,
    at: String,
    log: String,
    action: String,
    /// The actor by name where it still has one (`token: ci-pipeline`), and as recorded.
    actor: String,
    actor_id: String,
    target: String,
    target_id: String,
    outcome: String,
}

#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct AuditQuery {
    #[serde(default)]
    action: String,
    #[serde(default)]
    actor: String,
    /// An exact target (`job/<id>`, `tenant/<id>`).
    #[serde(default)]
    target: String,
    /// `success`, `denied` or `failed`; empty: any.
    #[serde(default)]
    outcome: String,
    /// A log by name (`system` or a tenant's); empty: every log the caller reads.
    #[serde(default)]
    log: String,
    /// From and until (UTC, as a `datetime-local` input sends it: `2026-12-05T09:30`).
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    /// Show the caller's own reads of the audit log too (left out by default).
    #[serde(default)]
    mine: String,
    /// A page's cursors, as the search API gives them.
    after: Option<String>,
    before: Option<String>,
}

impl AuditQuery {
    /// This search's page `after` or `before` a cursor, as a link.
    fn link(&self, dir: &str, cursor: &str) -> String {
        page_link(
            "/portal/audit",
            &[
                ("action", &self.action),
                ("actor", &self.actor),
                ("target", &self.target),
                ("outcome", &self.outcome),
                ("log", &self.log),
                ("from", &self.from),
                ("to", &self.to),
                ("mine", &self.mine),
                (dir, cursor),
            ],
        )
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "audit.html")]
pub(crate) struct AuditPage {
    page: Page,
    logs: Vec<LogRow>,
    query: AuditQuery,
    entries: Vec<EntryRow>,
    /// Links to the newer and the older page; empty where there is none.
    newer: String,
    older: String,
}

pub(crate) async fn audit_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
    q: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Ok(to_sign_in());
    };
    let visible = allot_api::readable_logs(&who)?;
    let tenants = state.store.list_tenants().await?;
    let name_of = |log: &str| {
        tenants
            .iter()
            .find(|t| t.id == log)
            .map_or_else(|| log.to_owned(), |t| t.name.to_string())
    };
    let mut logs = Vec::new();
    for head in state.store.audit_heads().await? {
        if visible.as_ref().is_some_and(|v| !v.contains(&head.log)) {
            continue;
        }
        let checkpoint = state.store.latest_checkpoint(&head.log).await?.map_or_else(
            || "none yet".to_owned(),
            |c| format!("signed at size {}", c.size),
        );
        logs.push(LogRow {
            name: name_of(&head.log),
            id: head.log,
            size: head.size,
            checkpoint,
        });
    }
    let query = q.into_inner();
    let when = |field: &str, v: &str| -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
        let v = v.trim();
        if v.is_empty() {
            return Ok(None);
        }
        chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M")
            .or_else(|_| chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M:%S"))
            .map(|t| Some(t.and_utc()))
            .map_err(|_| ApiError::malformed(field, "a UTC time as YYYY-MM-DDTHH:MM"))
    };
    let outcome = match query.outcome.trim() {
        "" => None,
        o => Some(
            o.parse::<allot_domain::Outcome>()
                .map_err(|e| ApiError::malformed("outcome", e))?,
        ),
    };
    // A log by name: only among those the caller reads (another is none at all).
    let searched = match query.log.trim() {
        "" => visible,
        name => {
            let id = if name == allot_domain::SYSTEM_LOG {
                name.to_owned()
            } else {
                tenants
                    .iter()
                    .find(|t| t.name.as_str() == name)
                    .map_or_else(|| format!("unknown:{name}"), |t| t.id.clone())
            };
            let readable = visible.as_ref().is_none_or(|v| v.contains(&id));
            Some(if readable { vec![id] } else { Vec::new() })
        }
    };
    let me = who.audit().actor.key();
    // Newest first, a page at a time both ways.
    let search = AuditSearch {
        logs: searched,
        action: (!query.action.trim().is_empty()).then(|| query.action.trim().to_owned()),
        actor: (!query.actor.trim().is_empty()).then(|| query.actor.trim().to_owned()),
        target: (!query.target.trim().is_empty()).then(|| query.target.trim().to_owned()),
        outcome,
        since: when("from", &query.from)?,
        until: when("to", &query.to)?,
        hide_audit_reads_by: query.mine.is_empty().then_some(me),
        newest_first: true,
        limit: 100,
        ..AuditSearch::default()
    };
    let found = allot_api::search_page(
        &state,
        &who,
        search,
        query.after.as_deref(),
        query.before.as_deref(),
    )
    .await?;
    let entries = found
        .entries
        .into_iter()
        .map(|e| {
            let body: serde_json::Value = e
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str(b).ok())
                .unwrap_or_default();
            let kind = body["actor"]["kind"].as_str().unwrap_or("?");
            let actor_id = format!("{kind}:{}", body["actor"]["id"].as_str().unwrap_or("?"));
            let target_id = body["target"].as_str().unwrap_or("").to_owned();
            EntryRow {
                key: format!("{}:{}", e.log, e.seq),
                at: e.time.get(..19).unwrap_or(&e.time).replace('T', " "),
                log: name_of(&e.log),
                action: e.action,
                actor: e
                    .actor_name
                    .map_or_else(|| actor_id.clone(), |n| format!("{kind}: {n}")),
                actor_id,
                target: e.target_name.map_or_else(
                    || target_id.clone(),
                    |n| format!("{}/{n}", target_id.split('/').next().unwrap_or_default()),
                ),
                target_id,
                outcome: e.outcome,
            }
        })
        .collect();
    let newer = found
        .prev
        .map_or_else(String::new, |c| query.link("before", &c));
    let older = found
        .next
        .map_or_else(String::new, |c| query.link("after", &c));
    Ok(render(AuditPage {
        page: Page::new(&req, &state, &who, "Audit", "audit").await,
        logs,
        query,
        entries,
        newer,
        older,
    }))
}
