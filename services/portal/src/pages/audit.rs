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
    // Newest first, a page at a time both ways.
    let search = AuditSearch {
        logs: visible,
        action: (!query.action.trim().is_empty()).then(|| query.action.trim().to_owned()),
        actor: (!query.actor.trim().is_empty()).then(|| query.actor.trim().to_owned()),
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
