//! What a client did wrong is not the server's error. The HTTP server (actix-http) logs a
//! request it cannot parse — a malformed header, a TLS hello on the plain-HTTP port — at
//! ERROR; an operator paged for every scanner on the internet stops reading errors. This
//! layer says each such event again at WARN, under `allot::http` (from a thread of its own:
//! an event cannot be dispatched from inside the dispatch of another), and
//! [`is_client_error`] keeps the original out of the log.

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Where actix-http logs a connection's parse errors.
const DISPATCHER: &str = "actix_http::h1::dispatcher";

/// Whether `meta` is an event of a client's malformed request, logged at ERROR by the HTTP
/// server (filter it out of the log where [`ClientErrors`] says it again).
pub fn is_client_error(meta: &Metadata<'_>) -> bool {
    meta.is_event() && *meta.level() == Level::ERROR && meta.target() == DISPATCHER
}

/// Says the HTTP server's errors about clients' requests again as warnings.
#[derive(Debug, Clone)]
pub struct ClientErrors {
    said: std::sync::mpsc::SyncSender<String>,
}

/// How many such errors may wait to be said; past it (a flood) they are dropped.
const BACKLOG: usize = 1024;

impl ClientErrors {
    /// The layer, and the thread that says its events again through the global
    /// subscriber.
    pub fn new() -> Self {
        let (said, heard) = std::sync::mpsc::sync_channel::<String>(BACKLOG);
        let started = std::thread::Builder::new()
            .name("client-errors".into())
            .spawn(move || {
                for error in heard {
                    tracing::warn!(
                        target: "allot::http",
                        %error,
                        "a client sent a request the HTTP server could not read"
                    );
                }
            });
        // Without the thread they are only kept out of the log.
        drop(started);
        Self { said }
    }
}

impl Default for ClientErrors {
    fn default() -> Self {
        Self::new()
    }
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for ClientErrors {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !is_client_error(event.metadata()) {
            return;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let _ = self.said.try_send(message.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Records each event's level and target.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<(Level, String)>>>);

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
            let m = event.metadata();
            if let Ok(mut seen) = self.0.lock() {
                seen.push((*m.level(), m.target().to_owned()));
            }
        }
    }

    #[test]
    fn a_clients_bad_request_is_a_warning_and_the_servers_errors_stay_errors() {
        let seen = Seen::default();
        let shown = tracing_subscriber::filter::filter_fn(|m| !is_client_error(m));
        let subscriber = tracing_subscriber::registry()
            .with(ClientErrors::new())
            .with(seen.clone().with_filter(shown));
        // Global, as the binary sets it: the warning is said from another thread.
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        tracing::error!(
            target: "actix_http::h1::dispatcher",
            "stream error: request parse error: invalid Header provided"
        );
        // The server's own error, and another target's: kept as they are.
        tracing::error!(target: "allot_server", "HTTP server stopped");
        tracing::warn!(target: "actix_http::h1::dispatcher", "something else");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let seen = loop {
            let now = seen.0.lock().map(|s| s.clone()).unwrap_or_default();
            if now.len() >= 3 || std::time::Instant::now() > deadline {
                break now;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(
            seen,
            [
                (Level::ERROR, "allot_server".to_owned()),
                (Level::WARN, "actix_http::h1::dispatcher".to_owned()),
                (Level::WARN, "allot::http".to_owned()),
            ]
        );
    }
}
