//! Searching the audit logs the caller may read, by time, actor, action, resource, tenant
//! and outcome, newest first (or oldest first), a page at a time in either direction.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::Action;
use allot_domain::{Outcome, SYSTEM_LOG};
use allot_store::{AuditRepo, AuditSearch, StoreError, TenantRepo};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{AuditEntryView, MAX_ENTRIES, readable_logs, record_read};
use crate::auth::Principal;
use crate::extract::Query;
use crate::problem::Problem;
use crate::{ApiError, AppState, json};

/// The filters shared by search and export.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditFilter {
    /// Entries recorded at or after this time (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// Entries recorded before this time (RFC 3339).
    pub until: Option<DateTime<Utc>>,
    /// The actor as `<kind>:<id>` (`token:…`, `node:…`, `system:scheduler`) or a bare id.
    #[param(min_length = 1, max_length = 500)]
    pub actor: Option<String>,
    /// An action (`token.revoke`), or a prefix ending in `.*` (`token.*`).
    #[param(min_length = 1, max_length = 500)]
    pub action: Option<String>,
    /// The resource acted on, e.g. `job/01…`.
    #[param(min_length = 1, max_length = 500)]
    pub target: Option<String>,
    /// `success`, `denied` or `failed`.
    #[param(value_type = Option<String>, pattern = "^(success|denied|failed)$")]
    pub outcome: Option<Outcome>,
}

impl AuditFilter {
    pub fn check(&self) -> Result<(), ApiError> {
        if let (Some(s), Some(u)) = (self.since, self.until)
            && u <= s
        {
            return Err(ApiError::invalid("until", "must be later than `since`"));
        }
        for (field, value) in [
            ("actor", &self.actor),
            ("action", &self.action),
            ("target", &self.target),
        ] {
            if value
                .as_ref()
                .is_some_and(|v| v.is_empty() || v.len() > 500)
            {
                return Err(ApiError::malformed(field, "must be 1–500 characters"));
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.since.is_none()
            && self.until.is_none()
            && self.actor.is_none()
            && self.action.is_none()
            && self.target.is_none()
            && self.outcome.is_none()
    }

    pub fn search(&self, logs: Option<Vec<String>>, limit: u64) -> AuditSearch {
        AuditSearch {
            logs,
            since: self.since,
            until: self.until,
            actor: self.actor.clone(),
            action: self.action.clone(),
            target: self.target.clone(),
            outcome: self.outcome,
            hide_audit_reads_by: None,
            newest_first: false,
            after: None,
            limit,
        }
    }

    /// The same filter as it appears in a bundle's manifest.
    pub fn bundle_query(&self) -> allot_audit::bundle::Query {
        let time = |t: Option<DateTime<Utc>>| t.map(allot_domain::AuditEntry::format_time);
        allot_audit::bundle::Query {
            since: time(self.since),
            until: time(self.until),
            actor: self.actor.clone(),
            action: self.action.clone(),
            target: self.target.clone(),
            outcome: self.outcome.map(|o| o.as_str().to_owned()),
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// Only this log: `system` or a tenant's name or id. Default: every log you may read.
    pub log: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    #[param(min_length = 1, max_length = 500)]
    pub actor: Option<String>,
    #[param(min_length = 1, max_length = 500)]
    pub action: Option<String>,
    #[param(min_length = 1, max_length = 500)]
    pub target: Option<String>,
    /// `success`, `denied` or `failed`.
    #[param(value_type = Option<String>, pattern = "^(success|denied|failed)$")]
    pub outcome: Option<Outcome>,
    /// `newest` first (the default) or `oldest` first.
    #[param(value_type = Option<String>, pattern = "^(newest|oldest)$")]
    pub order: Option<AuditOrder>,
    /// At most this many entries, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u64>,
    /// A page's `next`: the page after it.
    pub after: Option<String>,
    /// A page's `prev`: the page before it.
    pub before: Option<String>,
}

/// Which entries a search lists first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditOrder {
    #[default]
    Newest,
    Oldest,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditSearchPage {
    pub entries: Vec<AuditEntryView>,
    /// Pass as `after` for the next page (further in the search's order); absent on the
    /// last page.
    pub next: Option<String>,
    /// Pass as `before` for the previous page; absent on the first page.
    pub prev: Option<String>,
}

/// A page of `search` (its filters, order and `limit`): the first, the one after cursor
/// `after`, or the one before cursor `before`, with the cursors of its neighbours, and
/// the names `who` may be told of its entries' ids.
pub async fn search_page(
    state: &AppState,
    who: &Principal,
    mut search: AuditSearch,
    after: Option<&str>,
    before: Option<&str>,
) -> Result<AuditSearchPage, ApiError> {
    if after.is_some() && before.is_some() {
        return Err(ApiError::invalid(
            "before",
            "cannot be given with `after`: a page is after one cursor or before another",
        ));
    }
    let limit = search.limit;
    search.limit = limit + 1;
    let backwards = before.is_some();
    search.after = match (after, before) {
        (Some(c), _) => Some(parse_cursor("after", c)?),
        (_, Some(c)) => Some(parse_cursor("before", c)?),
        _ => None,
    };
    // Backwards: the entries just before the cursor, read in the other order, then turned.
    search.newest_first ^= backwards;
    let mut entries: Vec<AuditEntryView> = state
        .store
        .search_audit(&search)
        .await?
        .into_iter()
        .map(AuditEntryView::from)
        .collect();
    let more = entries.len() as u64 > limit;
    entries.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let names = super::Names::load(state, who).await?;
    for e in &mut entries {
        names.name(e);
    }
    if backwards {
        entries.reverse();
        Ok(AuditSearchPage {
            prev: entries.first().filter(|_| more).map(cursor),
            next: entries.last().map(cursor),
            entries,
        })
    } else {
        Ok(AuditSearchPage {
            prev: entries.first().filter(|_| after.is_some()).map(cursor),
            next: entries.last().filter(|_| more).map(cursor),
            entries,
        })
    }
}

fn cursor(e: &AuditEntryView) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}|{}|{}", e.time, e.log, e.seq))
}

fn parse_cursor(field: &str, s: &str) -> Result<(DateTime<Utc>, String, u64), ApiError> {
    let bad = || ApiError::invalid(field, "is not a cursor this API returned");
    let text =
        String::from_utf8(URL_SAFE_NO_PAD.decode(s).map_err(|_| bad())?).map_err(|_| bad())?;
    let mut parts = text.splitn(3, '|');
    let (Some(at), Some(log), Some(seq)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let at = DateTime::parse_from_rfc3339(at)
        .map_err(|_| bad())?
        .with_timezone(&Utc);
    // A position the store can hold (a signed 64-bit number).
    let seq: i64 = seq.parse().map_err(|_| bad())?;
    Ok((at, log.to_owned(), u64::try_from(seq).map_err(|_| bad())?))
}

/// An audit log as the caller named it: its id, and how answers name it (by the name the
/// caller gave, so that a refusal never tells a tenant's name to its id).
pub(super) struct NamedLog {
    pub id: String,
    pub what: String,
}

impl NamedLog {
    /// Whether the caller may do `action` on this log (404 to those who may not see it).
    pub fn authorize(&self, who: &Principal, action: Action) -> Result<(), ApiError> {
        who.authorize(action, super::log_resource(&self.id), &self.what)
    }
}

/// Resolves a log named by tenant name or id (or `system`) to its id.
pub(super) async fn resolve_log(state: &AppState, log: &str) -> Result<NamedLog, ApiError> {
    let what = format!("audit log `{log}`");
    if log == SYSTEM_LOG {
        return Ok(NamedLog {
            id: log.to_owned(),
            what,
        });
    }
    let id = match state.store.tenant_by_id(log).await {
        Ok(t) => t.id,
        Err(StoreError::NotFound(_)) => state
            .store
            .tenant_by_name(log)
            .await
            .map(|t| t.id)
            .map_err(|e| {
                ApiError::unless_not_found(e, || {
                    ApiError::NotFound(format!("{what} does not exist"))
                })
            })?,
        Err(e) => return Err(e.into()),
    };
    Ok(NamedLog { id, what })
}

/// Search the audit logs you may read, newest first (or `order=oldest`), a page at a time
/// in either direction (`after` a page's `next`, `before` its `prev`).
#[utoipa::path(get, path = "/api/v1/audit/entries", tag = "audit",
    params(SearchQuery), security(("bearer" = [])),
    responses((status = 200, body = AuditSearchPage), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn search(
    state: web::Data<AppState>,
    who: Principal,
    Query(q): Query<SearchQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_ENTRIES).contains(&limit) {
        return Err(ApiError::malformed(
            "limit",
            format!("must be between 1 and {MAX_ENTRIES}"),
        ));
    }
    let filter = AuditFilter {
        since: q.since,
        until: q.until,
        actor: q.actor,
        action: q.action,
        target: q.target,
        outcome: q.outcome,
    };
    filter.check()?;
    let visible = readable_logs(&who)?;
    let logs = match q.log {
        None => visible,
        Some(log) => {
            let log = resolve_log(&state, &log).await?;
            log.authorize(&who, Action::AuditRead)?;
            Some(vec![log.id])
        }
    };
    let mut search = filter.search(logs, limit);
    search.newest_first = q.order.unwrap_or_default() == AuditOrder::Newest;
    record_read(&state, &who, "*", "search").await?;
    let page = search_page(
        &state,
        &who,
        search,
        q.after.as_deref(),
        q.before.as_deref(),
    )
    .await?;
    Ok(json(StatusCode::OK, &page))
}
