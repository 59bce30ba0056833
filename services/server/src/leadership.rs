//! Which replica leads. Every replica serves the API and the portal; exactly one, the
//! leader, runs what must run once (the scheduling loop with its lease lapses, requeues,
//! time limits, gangs, elastic plan and budgets; the audit checkpointer and retention) and
//! serves the agents, whose assignment streams it alone feeds. Leadership is the lease in
//! the database (`allot_store::LeadershipRepo`): taken once it has expired, renewed every
//! third of it, given up on a clean stop. What the leader writes as leader goes through a
//! store handle fenced by its term, so a leader that was paused past its lease writes
//! nothing after it wakes; it then stops its leader work, closes its agents' streams and
//! follows.

use std::sync::Arc;
use std::time::Duration;

use allot_store::{Fenced, LeadershipRepo, Store, Term};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;

/// This replica's part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Another replica leads, reached by agents at `leader` under that epoch, when known.
    Follower { leader: Option<(String, i64)> },
    /// This replica leads under `epoch`.
    Leader { epoch: i64 },
}

/// This replica's part as it stands, for the gRPC service and the API.
#[derive(Debug)]
pub struct Leadership {
    role: watch::Sender<Role>,
    /// Why this replica may not lead (another live process holds the lease under its
    /// name), when it may not: what `/readyz` says.
    conflict: std::sync::Mutex<Option<String>>,
    /// The leader's handle while this replica leads: what its node-driven writes and
    /// resizes go through.
    fenced: std::sync::Mutex<Option<Fenced>>,
}

impl Default for Leadership {
    fn default() -> Self {
        Self {
            role: watch::Sender::new(Role::Follower { leader: None }),
            conflict: std::sync::Mutex::new(None),
            fenced: std::sync::Mutex::new(None),
        }
    }
}

impl Leadership {
    pub fn role(&self) -> Role {
        self.role.borrow().clone()
    }

    pub fn leads(&self) -> bool {
        matches!(*self.role.borrow(), Role::Leader { .. })
    }

    /// The leader's handle of the term this replica leads under, if it leads: writes
    /// through it commit only while that term holds.
    pub fn fenced(&self) -> Option<Fenced> {
        self.fenced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_fenced(&self, handle: Option<Fenced>) {
        *self.fenced.lock().unwrap_or_else(|e| e.into_inner()) = handle;
    }

    /// Why this replica may not lead, if another live process holds the lease under its
    /// name.
    pub fn conflict(&self) -> Option<String> {
        self.conflict
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_conflict(&self, why: Option<String>) {
        *self.conflict.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    fn set(&self, role: Role) {
        self.role.send_if_modified(|r| {
            let changed = *r != role;
            *r = role;
            changed
        });
    }
}

/// Tries once to take the lease for `replica`'s process `instance` (reached by agents at
/// `address`) for `ttl`: the term, if taken.
pub async fn acquire(
    store: &Store,
    replica: &str,
    instance: &str,
    address: &str,
    ttl: Duration,
) -> Option<Term> {
    match store
        .acquire(replica, instance, address, lease_ttl(ttl))
        .await
    {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot campaign for the leader lease");
            None
        }
    }
}

/// `ttl` as the store takes it (a lease too long for it is five seconds).
fn lease_ttl(ttl: Duration) -> chrono::Duration {
    chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::seconds(5))
}

/// What runs while this replica leads: started with the term's fenced store, it ends when
/// the token is cancelled.
pub type LeaderWork = Box<dyn Fn(Fenced, CancellationToken) -> Vec<JoinHandle<()>> + Send + Sync>;

/// The environment variable that, in a build with the `unfenced-for-testing` feature (the
/// workspace's, for tests and benchmarks; never `cargo build -p allot` alone), makes leader
/// work write without the fence: the negative control of the fencing tests and `allot
/// bench failover --unfenced`.
pub const UNFENCED_ENV: &str = "ALLOT_UNFENCED_LEADER_FOR_TESTING";

/// Whether leader work writes through the fence of its term: always, unless this build
/// has the `unfenced-for-testing` feature and [`UNFENCED_ENV`] is set.
pub fn fencing() -> bool {
    #[cfg(feature = "unfenced-for-testing")]
    {
        std::env::var_os(UNFENCED_ENV).is_none()
    }
    #[cfg(not(feature = "unfenced-for-testing"))]
    {
        true
    }
}

/// The leader's handle for `term`: fenced, but in the negative control.
fn leader_handle(store: &Store, term: &Term, fencing: bool) -> Fenced {
    #[cfg(feature = "unfenced-for-testing")]
    if !fencing {
        tracing::error!("leader writes are NOT fenced (a test of what fencing prevents)");
        return store.unfenced_for_testing(term);
    }
    debug_assert!(fencing, "only a testing build writes unfenced");
    store.fenced(term)
}

/// The replica's campaign for the lease, and its leader work while it holds it.
pub struct Campaign {
    pub store: Store,
    /// This replica's name (the lease's holder).
    pub replica: String,
    /// This process of it (drawn at start).
    pub instance: String,
    /// When this process started campaigning (the store's clock).
    pub started: chrono::DateTime<chrono::Utc>,
    /// Where agents reach this replica's gRPC endpoint.
    pub address: String,
    /// How long a lease lasts unrenewed.
    pub ttl: Duration,
    pub hub: Arc<Hub>,
    pub leadership: Arc<Leadership>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub work: LeaderWork,
    /// The heartbeat pace, counted afresh before the term serves anyone.
    pub pacing: Arc<crate::pacing::Pacing>,
    /// How long stopping leader work may take before its tasks are aborted.
    pub grace: Duration,
    /// Whether leader work writes through the fence: always, but in the negative control
    /// ([`fencing`]).
    pub fencing: bool,
}

/// Leader work running under a term.
struct Running {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Campaign {
    async fn try_acquire(&self) -> Option<Term> {
        acquire(
            &self.store,
            &self.replica,
            &self.instance,
            &self.address,
            self.ttl,
        )
        .await
    }

    /// Campaigns until `stop`, leading whenever it holds the lease; `first` is a term taken
    /// already (at start-up). On `stop` a leader stops its work and gives the lease up.
    pub async fn run(self, first: Option<Term>, stop: CancellationToken) {
        let mut term = None;
        let mut running = None;
        if let Some(t) = first {
            running = Some(self.lead(&t).await);
            term = Some(t);
        }
        loop {
            let wait = if term.is_some() {
                self.ttl / 3
            } else {
                self.ttl / 5
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
            match term.take() {
                Some(t) => match self.store.renew(&t, lease_ttl(self.ttl)).await {
                    Ok(Some(renewed)) => term = Some(renewed),
                    Ok(None) => {
                        tracing::warn!(
                            epoch = t.epoch,
                            "leadership lost: the lease expired or was taken over"
                        );
                        self.follow(running.take()).await;
                    }
                    Err(e) if self.store.clock().now() < t.expires_at => {
                        tracing::warn!(error = %e, epoch = t.epoch, "leader lease not renewed; retrying");
                        term = Some(t);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, epoch = t.epoch, "leader lease expired unrenewed; following");
                        self.follow(running.take()).await;
                    }
                },
                None => match self.try_acquire().await {
                    Some(t) => {
                        running = Some(self.lead(&t).await);
                        term = Some(t);
                    }
                    None => self.note_leader().await,
                },
            }
        }
        if let Some(t) = term {
            self.follow(running.take()).await;
            if let Err(e) = self.store.resign(&t).await {
                tracing::warn!(error = %e, "leader lease not given up; it lapses instead");
            }
        }
    }

    /// Starts leader work under `term`.
    async fn lead(&self, term: &Term) -> Running {
        tracing::info!(replica = %self.replica, epoch = term.epoch, "leading the control plane");
        // Nothing of an earlier term (launches awaiting confirmation, GPUs held back) holds.
        self.hub.reset();
        let stop = CancellationToken::new();
        let store = leader_handle(&self.store, term, self.fencing);
        self.pacing.recount(&store).await;
        self.leadership.set_fenced(Some(store.clone()));
        let tasks = (self.work)(store, stop.clone());
        self.leadership.set(Role::Leader { epoch: term.epoch });
        self.metrics.leading(Some(term.epoch));
        Running { stop, tasks }
    }

    /// Stops leader work, closes the agents' streams (they find the new leader), follows.
    /// What the hub remembers of the term is forgotten when the next one starts (`lead`).
    async fn follow(&self, running: Option<Running>) {
        self.leadership.set_fenced(None);
        self.leadership.set(Role::Follower { leader: None });
        self.metrics.leading(None);
        if let Some(Running { stop, tasks }) = running {
            stop.cancel();
            for mut t in tasks {
                if tokio::time::timeout(self.grace, &mut t).await.is_err() {
                    tracing::warn!("leader work did not stop in time; aborting it");
                    t.abort();
                }
            }
        }
        self.hub.close_all();
    }

    /// Records where the leader is, for agents that reach this follower; and whether
    /// another live process holds the lease under this replica's name (renewed since this
    /// one started: no earlier run of it could have), which it then says.
    async fn note_leader(&self) {
        match self.store.leader().await {
            Ok(l) => {
                let now = self.store.clock().now();
                let taken = l.holder == self.replica
                    && l.instance != self.instance
                    && l.holds_at(now)
                    && l.expires_at > self.started + lease_ttl(self.ttl);
                let conflict = taken.then(|| {
                    format!(
                        "replica name {} is in use by another running replica (process {}, \
                         leading under epoch {}): this one will not lead; give each replica \
                         its own --replica-name",
                        self.replica, l.instance, l.epoch
                    )
                });
                if conflict.is_some() && self.leadership.conflict().is_none() {
                    tracing::error!(
                        replica = %self.replica,
                        other = %l.instance,
                        "another running replica has this replica's name: not leading"
                    );
                }
                self.leadership.set_conflict(conflict);
                let leader = l.holds_at(now).then_some((l.address, l.epoch));
                self.leadership.set(Role::Follower { leader });
            }
            Err(e) => tracing::debug!(error = %e, "leader lease unreadable"),
        }
    }
}
