//! A job's log: what its node shipped of each attempt's output, read from an offset or
//! followed as it is written (`allot job logs -f`, the portal's job page).

use std::time::Duration;

use actix_web::http::header::HeaderValue;
use actix_web::{HttpResponse, web};
use allot_authz::Action;
use allot_domain::Job;
use allot_domain::joblog::{LogOrigin, read_from, read_stamped_from};
use allot_store::{JobRepo, LogRepo, NodeRepo, TenantScope};

use crate::auth::Principal;
use crate::extract::Query;
use crate::problem::Problem;
use crate::views::LogQuery;
use crate::{ApiError, AppState};

use super::jobs::visible_job;

/// The most one read returns (a follower gets the rest in the next).
const READ_MAX_BYTES: u64 = 1024 * 1024;

/// How often a follower looks for output shipped to another replica, and for the job's
/// end.
const POLL: Duration = Duration::from_secs(1);

/// The header saying where the next read of the log starts.
pub const LOG_END_HEADER: &str = "allot-log-end";
/// The header naming the attempt read.
pub const LOG_ATTEMPT_HEADER: &str = "allot-log-attempt";

/// A job's combined stdout and stderr as its node shipped it while it ran (the first MiB and
/// the last 4 MiB of each attempt are kept; where output is missing, a note says how much,
/// to the byte, and where more of it is). `follow=true` keeps the answer open and sends output as it is written, until the
/// job ends; following the latest attempt follows the next one when the job is requeued.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/log", tag = "jobs",
    params(("id" = String, Path), LogQuery), security(("bearer" = [])),
    responses((status = 200, content_type = "text/plain", body = String,
            headers(("allot-log-end" = u64, description = "The offset the next read starts at"),
                ("allot-log-attempt" = u32, description = "The attempt read"))),
        (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn log(
    state: web::Data<AppState>,
    who: Principal,
    id: web::Path<String>,
    Query(q): Query<LogQuery>,
) -> Result<HttpResponse, ApiError> {
    let job = visible_job(&state, &who, &id, Action::JobLog).await?;
    if let Some(a) = q.attempt
        && (a == 0 || a > job.attempt)
    {
        return Err(allot_domain::ValidationError::single(
            "attempt",
            format!("job {} has attempts 1 to {}", job.id, job.attempt),
        )
        .into());
    }
    if q.since.is_some() && q.offset.is_some() {
        return Err(ApiError::malformed(
            "since",
            "give `since` or `offset`, not both",
        ));
    }
    let offset = match q.since {
        Some(since) => {
            let attempt = q.attempt.unwrap_or(job.attempt);
            match state
                .store
                .job_log_offset_since(&job.id, attempt, since)
                .await?
            {
                Some(o) => o,
                // Nothing since: from the end (a follower gets what comes next).
                None => state.store.job_log_end(&job.id, attempt).await?,
            }
        }
        None => q.offset.unwrap_or(0),
    };
    let mut reader = Reader::new(state.into_inner(), job, q.attempt, offset).await;
    reader.stamped = q.timestamps == Some(true);
    let first = if q.follow == Some(true) {
        reader.read().await?
    } else {
        reader.read_all().await?
    };
    let mut res = HttpResponse::Ok();
    res.content_type("text/plain; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .insert_header(("x-content-type-options", "nosniff"))
        .insert_header((LOG_ATTEMPT_HEADER, HeaderValue::from(reader.attempt)));
    if q.follow != Some(true) {
        res.insert_header((LOG_END_HEADER, HeaderValue::from(reader.cursor)));
        return Ok(res.body(first));
    }
    let stream =
        futures_util::stream::unfold((reader, Some(first)), |(mut reader, first)| async move {
            if let Some(first) = first.filter(|b| !b.is_empty()) {
                return Some((Ok(web::Bytes::from(first)), (reader, None)));
            }
            match reader.next().await {
                Ok(Some(b)) => Some((Ok(web::Bytes::from(b)), (reader, None))),
                Ok(None) => None,
                Err(e) => Some((Err(actix_web::Error::from(e)), (reader, None))),
            }
        });
    // Not buffered by a proxy on the way.
    res.insert_header(("x-accel-buffering", "no"));
    Ok(res.streaming(stream))
}

/// The end of a job's latest attempt's log, as a page shows it.
#[derive(Debug, Clone)]
pub struct LogTail {
    pub text: String,
    pub attempt: u32,
    /// Where the text starts in the attempt's log (0: it is all there).
    pub start: u64,
    /// Where a follower goes on from.
    pub end: u64,
}

/// About the last `max_bytes` of a job's latest attempt's log.
pub async fn log_tail(
    state: std::sync::Arc<AppState>,
    job: Job,
    max_bytes: u64,
) -> Result<LogTail, ApiError> {
    let end = state.store.job_log_end(&job.id, job.attempt).await?;
    let start = end.saturating_sub(max_bytes);
    let mut reader = Reader::new(state, job, None, start).await;
    let bytes = reader.read().await?;
    Ok(LogTail {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        attempt: reader.attempt,
        start,
        end: reader.cursor,
    })
}

/// One reader of a job's log.
struct Reader {
    state: std::sync::Arc<AppState>,
    job: Job,
    /// The node's name, once placed.
    node: Option<String>,
    attempt: u32,
    /// Stays on the attempt asked for (else follows the job's latest).
    pinned: bool,
    cursor: u64,
    /// Whether the tail kept with the job's end was given instead of shipped output.
    gave_tail: bool,
    /// Whether each line starts with when it was received.
    stamped: bool,
    /// Whether the cursor is at the start of a line.
    line_start: bool,
}

impl Reader {
    async fn new(
        state: std::sync::Arc<AppState>,
        job: Job,
        attempt: Option<u32>,
        from: u64,
    ) -> Self {
        let node = node_name(&state, &job).await;
        Self {
            attempt: attempt.unwrap_or(job.attempt),
            pinned: attempt.is_some(),
            state,
            job,
            node,
            cursor: from,
            gave_tail: false,
            stamped: false,
            line_start: true,
        }
    }

    /// What was shipped from the cursor on (at most [`READ_MAX_BYTES`] and a note).
    async fn read(&mut self) -> Result<Vec<u8>, ApiError> {
        let chunks = self
            .state
            .store
            .job_log(&self.job.id, self.attempt, self.cursor, READ_MAX_BYTES)
            .await?;
        let origin = LogOrigin {
            job_id: &self.job.id,
            attempt: self.attempt,
            node: self.node.as_deref(),
        };
        let (bytes, end) = if self.stamped {
            read_stamped_from(&chunks, self.cursor, &origin, &mut self.line_start)
        } else {
            read_from(&chunks, self.cursor, &origin)
        };
        self.cursor = end;
        // A job that ended before its node shipped logs (an agent of an earlier release, or
        // output that never made it) still has the tail reported with its end.
        if bytes.is_empty()
            && self.cursor == 0
            && !self.gave_tail
            && self.attempt == self.job.attempt
            && self.job.state.is_terminal()
            && let Some(tail) = self.job.log_tail.as_deref().filter(|t| !t.is_empty())
        {
            self.gave_tail = true;
            return Ok(tail.as_bytes().to_vec());
        }
        Ok(bytes)
    }

    /// Everything shipped from the cursor on (what is kept of an attempt is bounded).
    async fn read_all(&mut self) -> Result<Vec<u8>, ApiError> {
        let mut all = Vec::new();
        loop {
            let bytes = self.read().await?;
            if bytes.is_empty() {
                return Ok(all);
            }
            all.extend_from_slice(&bytes);
        }
    }

    /// The next output of a followed log, waiting for it; `None` once the job ended and its
    /// output was read. Nodes ship an attempt's last output before they report its end, so
    /// once the end is stored, so is the output.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, ApiError> {
        loop {
            // Subscribed before reading, so what is told meanwhile still wakes this.
            let mut bell = self.state.events.job_logs();
            let bytes = self.read().await?;
            if !bytes.is_empty() {
                return Ok(Some(bytes));
            }
            let job = self
                .state
                .store
                .job(&TenantScope::All, &self.job.id)
                .await?;
            if job.node_id != self.job.node_id {
                self.node = node_name(&self.state, &job).await;
            }
            if !self.pinned && job.attempt > self.attempt {
                // What the ended attempt wrote last (shipped as it was requeued) comes first.
                let rest = self.read_all().await?;
                if !rest.is_empty() {
                    return Ok(Some(rest));
                }
                let note = format!(
                    "\n[allot: attempt {} ended; attempt {} follows]\n",
                    self.attempt, job.attempt
                );
                self.attempt = job.attempt;
                self.cursor = 0;
                self.line_start = true;
                self.job = job;
                return Ok(Some(note.into_bytes()));
            }
            let over = job.state.is_terminal() || job.attempt != self.attempt;
            self.job = job;
            if over {
                // What it wrote since the last read came before its end.
                let bytes = self.read().await?;
                return Ok((!bytes.is_empty()).then_some(bytes));
            }
            self.wait(&mut bell).await;
        }
    }

    /// Until this job's log grows or it ends, or a second passes.
    async fn wait(&self, bell: &mut tokio::sync::broadcast::Receiver<String>) {
        use tokio::sync::broadcast::error::RecvError;
        let until = tokio::time::Instant::now() + POLL;
        loop {
            match tokio::time::timeout_at(until, bell.recv()).await {
                Ok(Ok(id)) if id != self.job.id => {}
                Ok(Ok(_) | Err(RecvError::Lagged(_))) | Err(_) => return,
                Ok(Err(RecvError::Closed)) => {
                    // Nothing rings any more (the server is stopping).
                    tokio::time::sleep_until(until).await;
                    return;
                }
            }
        }
    }
}

async fn node_name(state: &AppState, job: &Job) -> Option<String> {
    let id = job.node_id.as_deref()?;
    Some(
        state
            .store
            .node(id)
            .await
            .map_or_else(|_| id.to_owned(), |n| n.name),
    )
}
