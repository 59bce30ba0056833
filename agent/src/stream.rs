//! Following the assignment stream, and the gRPC client helpers it and the rest use.

use super::*;

/// Why following the assignment stream ended.
pub(crate) enum StreamEnd {
    /// The agent is shutting down.
    Stopped,
    /// The stream was open and broke (or the control plane closed it).
    Broke,
    /// It could not be opened.
    Unreachable,
    /// The control plane refused the node's credentials: register again.
    Unauthenticated,
}

impl Agent {
    /// Follows the assignment stream until it breaks or the agent stops.
    pub(crate) async fn follow(
        self: &Arc<Self>,
        stop: &CancellationToken,
        tasks: &mut JoinSet<()>,
    ) -> StreamEnd {
        let seen = self.link.moved();
        let mut moves = self.link.moves();
        // Opening it, not following it: a stalled replica is not waited out.
        let mut rpc = client(&self.link);
        let opened = self.link.within(
            Duration::from_secs(2),
            rpc.watch_assignments(WatchAssignmentsRequest {}),
        );
        let mut stream = match opened.await {
            Ok(s) => {
                // A leader places nothing here until it has heard what runs here (a new
                // leader knows nothing of ended jobs still stopping): tell it at once.
                self.heartbeat_now.notify_one();
                s.into_inner()
            }
            Err(s) => {
                tracing::warn!(error = %s.message(), "cannot watch assignments");
                self.link.failed(seen, &s);
                return if s.code() == Code::Unauthenticated {
                    StreamEnd::Unauthenticated
                } else {
                    StreamEnd::Unreachable
                };
            }
        };
        loop {
            let msg = tokio::select! {
                () = stop.cancelled() => return StreamEnd::Stopped,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
                // Calls moved to another replica: the stream follows them.
                Ok(()) = moves.changed() => {
                    tracing::info!(to = %self.link.server(), "assignment stream moving to another replica");
                    return StreamEnd::Broke;
                }
                msg = stream.message() => msg,
            };
            match msg {
                Ok(Some(a)) => match a.kind {
                    Some(Kind::Launch(l)) => self.launch(l, tasks),
                    Some(Kind::Cancel(c)) => self.cancel(c),
                    Some(Kind::Partition(p)) => self.partition(p),
                    Some(Kind::Resize(r)) => self.resize(r),
                    None => tracing::warn!("empty assignment ignored"),
                },
                Ok(None) => {
                    tracing::warn!("assignment stream closed by the control plane");
                    return StreamEnd::Broke;
                }
                Err(s) => {
                    tracing::warn!(error = %s.message(), "assignment stream broke");
                    self.link.failed(seen, &s);
                    return StreamEnd::Broke;
                }
            }
        }
    }
}

/// A client on the channel that presents the node certificate.
pub(crate) fn client(link: &Link) -> NodeServiceClient<Channel> {
    NodeServiceClient::new(link.channel())
}

/// Errors worth retrying: the control plane is away or restarting, or holds this node to
/// its rate for a moment (`RESOURCE_EXHAUSTED`).
pub(crate) fn transient(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unauthenticated
            | Code::ResourceExhausted
    )
}

/// How long to wait before retry `attempt` (100 ms doubling, at most 3 s).
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((100u64 << attempt.min(5)).min(3_000))
}
