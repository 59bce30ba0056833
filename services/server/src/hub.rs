//! Per-node assignment streams: the scheduler and the API push launches and cancels here, and
//! the node's open `WatchAssignments` stream carries them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use allot_domain::Job;
use allot_proto::v1::{Assignment, Cancel, Launch, assignment::Kind};
use tokio::sync::mpsc;

pub type AssignmentTx = mpsc::UnboundedSender<Result<Assignment, tonic::Status>>;
pub type AssignmentRx = mpsc::UnboundedReceiver<Result<Assignment, tonic::Status>>;

#[derive(Debug, Default)]
pub struct Hub {
    streams: Mutex<HashMap<String, AssignmentTx>>,
    /// Nodes that opened a stream in this term: another one of theirs is a re-subscription.
    subscribed: Mutex<std::collections::HashSet<String>>,
    /// Launches sent but not yet confirmed by any report, per node: (job id, attempt) and
    /// when last sent. A stream can die without the sender noticing, so these are sent
    /// again when the node's heartbeat shows it does not run them.
    unconfirmed: Mutex<HashMap<String, Unconfirmed>>,
    /// The MIG layout last sent for each GPU, and when.
    partitions: Mutex<HashMap<String, SentLayout>>,
    /// Per node, the stops sent on its heartbeats for jobs it still runs while they are
    /// being stopped, and when: a cancel or drain asked through another replica reaches the
    /// node this way.
    stops: Mutex<HashMap<String, Unconfirmed>>,
    /// Per node, jobs that ended (or that the control plane never gave it) whose GPUs are
    /// held back from placement until the node's heartbeat no longer shows the job: a
    /// job's capacity ends when its node has seen its processes gone.
    withheld: Mutex<HashMap<String, NodeWithheld>>,
    /// Nodes whose heartbeat reached this term: only they can take new work, since only
    /// then are the GPUs held back on them (`withheld`) rebuilt from what they run.
    heard: Mutex<std::collections::HashSet<String>>,
}

/// A node's held-back jobs by (job id, attempt; 0 for whichever attempt runs).
type NodeWithheld = HashMap<(String, u32), Withheld>;

/// A job whose GPUs are held back on a node.
#[derive(Debug, Clone)]
pub struct Withheld {
    pub gpus: Vec<String>,
    /// Since when: its end was reported, or the node was first seen running it.
    pub since: Instant,
    /// Whether the node running it after all was recorded (once).
    pub audited: bool,
}

/// How long a node gets to apply a MIG layout before it is sent again.
pub const PARTITION_RESEND: Duration = Duration::from_secs(10);

/// A MIG layout (profile id, start slice) sent to a GPU, and when.
type SentLayout = (Vec<(u32, u8)>, Instant);

/// A node's launches awaiting confirmation: job id to (attempt, when last sent).
type Unconfirmed = HashMap<String, (u32, Instant)>;

/// A node's stream is open already: it has one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyOpen;

impl Hub {
    /// Opens the node's stream, unless one is still open: a node has one stream at a time,
    /// so a second subscriber (whoever stole its key) cannot take its agent's over. Says
    /// too whether the node opened one before in this term (a re-subscription).
    pub fn subscribe(
        &self,
        node_id: &str,
    ) -> Result<(AssignmentTx, AssignmentRx, bool), AlreadyOpen> {
        let mut streams = self.lock();
        if streams.get(node_id).is_some_and(|tx| !tx.is_closed()) {
            return Err(AlreadyOpen);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        streams.insert(node_id.to_owned(), tx.clone());
        let again = !lock(&self.subscribed).insert(node_id.to_owned());
        Ok((tx, rx, again))
    }

    /// Whether the node's assignment stream is open here: its agent is connected.
    pub fn is_open(&self, node_id: &str) -> bool {
        self.lock().get(node_id).is_some_and(|tx| !tx.is_closed())
    }

    /// Sends to the node if it is connected. A node that is not connected gets everything it
    /// holds when it next subscribes, so nothing is lost by dropping here.
    pub fn send(&self, node_id: &str, assignment: Assignment) {
        let mut streams = self.lock();
        if let Some(tx) = streams.get(node_id)
            && tx.send(Ok(assignment)).is_err()
        {
            streams.remove(node_id);
        }
    }

    /// Nodes that can take new work now: their assignment stream is open (a launch can
    /// reach them) and their heartbeat reached this term (what they still run of ended
    /// jobs is held back: a new leader learns it from that heartbeat, not from memory).
    pub fn placeable(&self) -> std::collections::HashSet<String> {
        let heard = lock(&self.heard);
        self.lock()
            .iter()
            .filter(|(node, tx)| !tx.is_closed() && heard.contains(*node))
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// A launch sent (or resent to a node that subscribed again): awaiting confirmation,
    /// so that it is sent again if the stream it went on dies.
    pub fn resent(&self, node_id: &str, job: &Job) {
        lock(&self.unconfirmed)
            .entry(node_id.to_owned())
            .or_default()
            .insert(job.id.clone(), (job.attempt, Instant::now()));
    }

    /// Sends a launch (see `crate::launches`) and remembers it until the node confirms it.
    pub fn launch(&self, node_id: &str, job: &Job, launch: Assignment) {
        self.resent(node_id, job);
        self.send(node_id, launch);
    }

    /// The node reported on the job: whatever it was sent arrived.
    pub fn confirmed(&self, node_id: &str, job_id: &str) {
        if let Some(jobs) = lock(&self.unconfirmed).get_mut(node_id) {
            jobs.remove(job_id);
        }
    }

    /// Launches to `node_id` unconfirmed for longer than `after` that its agent does not
    /// run (`running`): (job id, attempt) to check and send again. Those it runs are
    /// confirmed.
    pub fn overdue(
        &self,
        node_id: &str,
        running: &[String],
        after: Duration,
    ) -> Vec<(String, u32)> {
        let mut map = lock(&self.unconfirmed);
        let Some(jobs) = map.get_mut(node_id) else {
            return Vec::new();
        };
        jobs.retain(|id, _| !running.contains(id));
        let now = Instant::now();
        jobs.iter_mut()
            .filter(|(_, (_, sent))| now.duration_since(*sent) >= after)
            .map(|(id, (attempt, sent))| {
                *sent = now;
                (id.clone(), *attempt)
            })
            .collect()
    }

    /// Of `stopping`, jobs (id, attempt) the node still runs although they are being
    /// stopped, those whose stop to send now: not sent yet, or last sent `every` ago. What is
    /// no longer among them is forgotten.
    pub fn stops_due(
        &self,
        node_id: &str,
        stopping: &[(String, u32)],
        every: Duration,
    ) -> Vec<String> {
        let mut map = lock(&self.stops);
        let sent = map.entry(node_id.to_owned()).or_default();
        sent.retain(|id, (attempt, _)| stopping.iter().any(|(j, a)| j == id && a == attempt));
        let now = Instant::now();
        let mut due = Vec::new();
        for (id, attempt) in stopping {
            let last = sent.get(id).map(|(_, at)| *at);
            if last.is_none_or(|at| now.duration_since(at) >= every) {
                sent.insert(id.clone(), (*attempt, now));
                due.push(id.clone());
            }
        }
        if sent.is_empty() {
            map.remove(node_id);
        }
        due
    }

    /// Whether to send `layout` to `gpu` now: not when the same was sent less than
    /// [`PARTITION_RESEND`] ago (the node is applying it). Remembers it as sent.
    pub fn partition_due(&self, gpu: &str, layout: &[(u32, u8)]) -> bool {
        let mut sent = lock(&self.partitions);
        let now = Instant::now();
        if let Some((last, at)) = sent.get(gpu)
            && last == layout
            && now.duration_since(*at) < PARTITION_RESEND
        {
            return false;
        }
        sent.insert(gpu.to_owned(), (layout.to_vec(), now));
        true
    }

    /// Holds the `gpus` of `job_id`'s `attempt` on `node_id` back from placement (see
    /// [`Withheld`]), unless already held. Attempt 0 is whichever attempt runs: held while
    /// the node runs the job at all.
    pub fn withhold(&self, node_id: &str, job_id: &str, attempt: u32, gpus: Vec<String>) {
        lock(&self.withheld)
            .entry(node_id.to_owned())
            .or_default()
            .entry((job_id.to_owned(), attempt))
            .or_insert(Withheld {
                gpus,
                since: Instant::now(),
                audited: false,
            });
    }

    /// The node's heartbeat shows it runs `running` (each job with its attempt where the
    /// node says): what it no longer runs is released, and the held jobs it still runs are
    /// returned, with whether room may have appeared (something was released, or this is
    /// the node's first heartbeat of the term: it takes new work from now on). An ended attempt is released while a later attempt
    /// of the same job runs there: its GPUs are not the later one's.
    pub fn reconcile(
        &self,
        node_id: &str,
        running: &[(String, Option<u32>)],
    ) -> (bool, Vec<(String, Withheld)>) {
        let first = lock(&self.heard).insert(node_id.to_owned());
        let mut map = lock(&self.withheld);
        let Some(jobs) = map.get_mut(node_id) else {
            return (first, Vec::new());
        };
        let before = jobs.len();
        jobs.retain(|(id, attempt), _| {
            running.iter().any(|(r, runs)| {
                r == id && (*attempt == 0 || runs.is_none_or(|runs| runs == *attempt))
            })
        });
        let released = first || jobs.len() < before;
        let still = jobs
            .iter()
            .map(|((id, _), w)| (id.clone(), w.clone()))
            .collect();
        if jobs.is_empty() {
            map.remove(node_id);
        }
        (released, still)
    }

    /// Marks the held job (any attempt of it) as recorded: `true` the first time.
    pub fn audit_once(&self, node_id: &str, job_id: &str) -> bool {
        let mut map = lock(&self.withheld);
        let Some(jobs) = map.get_mut(node_id) else {
            return false;
        };
        let mut first = false;
        for (_, w) in jobs.iter_mut().filter(|((id, _), _)| id == job_id) {
            first |= !std::mem::replace(&mut w.audited, true);
        }
        first
    }

    /// The GPUs held back on `node_id`.
    pub fn withheld_gpus(&self, node_id: &str) -> Vec<String> {
        lock(&self.withheld)
            .get(node_id)
            .map(|jobs| jobs.values().flat_map(|w| w.gpus.iter().cloned()).collect())
            .unwrap_or_default()
    }

    /// Ends the node's stream, telling it why (its credentials were revoked).
    pub fn disconnect(&self, node_id: &str, why: tonic::Status) {
        if let Some(tx) = self.lock().remove(node_id) {
            let _ = tx.send(Err(why));
        }
    }

    /// Ends every open stream, so that connected agents see the control plane go away.
    pub fn close_all(&self) {
        self.lock().clear();
    }

    /// Forgets what was sent and held back (a new term starts from what the database and
    /// the nodes' next heartbeats say).
    pub fn reset(&self) {
        lock(&self.subscribed).clear();
        lock(&self.unconfirmed).clear();
        lock(&self.partitions).clear();
        lock(&self.withheld).clear();
        lock(&self.stops).clear();
        lock(&self.heard).clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AssignmentTx>> {
        lock(&self.streams)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a launch carries besides the job's record.
#[derive(Default)]
pub struct LaunchExtras {
    pub uid_slot: Option<u32>,
    pub credentials: Option<allot_domain::PullSecret>,
    pub volumes: Vec<allot_proto::v1::VolumeMount>,
    pub secrets: Vec<allot_proto::v1::JobSecret>,
    /// For a replica of a gang: its place, and where the gang meets.
    pub gang: Option<allot_proto::v1::Gang>,
    /// Its tenant's network policy now.
    pub network_policy: Option<allot_proto::v1::NetworkPolicy>,
}

/// What a task of an array is told of it, under Allot's names and Slurm's (for scripts
/// that read `SLURM_ARRAY_TASK_ID`): its index, the array's id, and the array's first,
/// last and count of indices.
fn array_env(job: &Job) -> Vec<(String, String)> {
    let (Some(task), Some(spec)) = (&job.array_task, &job.spec.array) else {
        return Vec::new();
    };
    let tasks = spec.tasks().unwrap_or_default();
    let (min, max) = (
        tasks.first().copied().unwrap_or(task.index),
        tasks.last().copied().unwrap_or(task.index),
    );
    let mut env = Vec::new();
    for prefix in ["ALLOT", "SLURM"] {
        env.push((format!("{prefix}_ARRAY_TASK_ID"), task.index.to_string()));
        env.push((format!("{prefix}_ARRAY_JOB_ID"), task.array_id.clone()));
        env.push((format!("{prefix}_ARRAY_TASK_MIN"), min.to_string()));
        env.push((format!("{prefix}_ARRAY_TASK_MAX"), max.to_string()));
        env.push((
            format!("{prefix}_ARRAY_TASK_COUNT"),
            tasks.len().to_string(),
        ));
    }
    env
}

/// The launch of `job`, carrying the trace context of the current span (the scheduling
/// decision), if any.
pub fn launch(job: &Job, extras: LaunchExtras) -> Assignment {
    let (registry_username, registry_password) = extras
        .credentials
        .map(|c| (c.username, c.password))
        .unwrap_or_default();
    Assignment {
        kind: Some(Kind::Launch(Launch {
            job_id: job.id.clone(),
            tenant: job.spec.tenant.to_string(),
            name: job.spec.name.clone(),
            command: job.spec.command.clone(),
            cpu_milli: job.spec.cpu_milli,
            memory_bytes: job.spec.memory_bytes,
            image: job.image_to_run().unwrap_or_default(),
            network: job.spec.network.as_str().to_owned(),
            registry_username,
            registry_password,
            uid_slot: extras.uid_slot,
            volumes: extras.volumes,
            secrets: extras.secrets,
            env: job
                .spec
                .env
                .clone()
                .into_iter()
                .chain(array_env(job))
                .collect(),
            workdir: job.spec.workdir.clone().unwrap_or_default(),
            gpu_uuids: job.gpu_uuids.clone(),
            attempt: job.attempt,
            gpu_milli: job.held_gpu_milli.unwrap_or(allot_domain::GPU_MILLI),
            gpu_memory_bytes: job.spec.gpu_memory_bytes.unwrap_or(0),
            gpu_compute: job
                .spec
                .gpu_compute
                .map(|c| c.as_str().to_owned())
                .unwrap_or_default(),
            checkpoint_dir: job.spec.checkpoint_dir.clone().unwrap_or_default(),
            traceparent: allot_telemetry::traceparent(&tracing::Span::current())
                .unwrap_or_default(),
            gang: extras.gang,
            network_policy: extras.network_policy,
        })),
    }
}

/// Stops the job's current attempt: cancelled by a person, or preempted by reclaim (then
/// `preempt_reason` says why).
pub fn cancel(job: &Job) -> Assignment {
    cancel_within(job, 0)
}

/// A `Cancel` giving the job `grace_seconds` between the termination signal and the kill
/// (0: the agent's own grace).
pub fn cancel_within(job: &Job, grace_seconds: u32) -> Assignment {
    Assignment {
        kind: Some(Kind::Cancel(Cancel {
            job_id: job.id.clone(),
            attempt: job.attempt,
            reason: match &job.preempt_reason {
                Some(r) if !job.cancel_requested => format!("preempted: {r}"),
                _ => "cancelled".to_owned(),
            },
            grace_seconds,
        })),
    }
}

/// A running job's new share, for its node to apply to the job's limits.
pub fn resize(job: &Job) -> Assignment {
    let share = job.share();
    Assignment {
        kind: Some(Kind::Resize(allot_proto::v1::Resize {
            job_id: job.id.clone(),
            attempt: job.attempt,
            gpu_milli: share.gpu_milli,
            gpu_memory_bytes: share.gpu_memory_bytes,
        })),
    }
}

/// The MIG layout a GPU should have.
pub fn partition(gpu_uuid: &str, layout: &[(u32, u8)]) -> Assignment {
    Assignment {
        kind: Some(Kind::Partition(allot_proto::v1::Partition {
            gpu_uuid: gpu_uuid.to_owned(),
            layout: layout
                .iter()
                .map(|&(profile, start)| allot_proto::v1::MigPlacement {
                    profile,
                    start: u32::from(start),
                })
                .collect(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(jobs: &[(&str, Option<u32>)]) -> Vec<(String, Option<u32>)> {
        jobs.iter().map(|(j, a)| ((*j).to_owned(), *a)).collect()
    }

    /// A requeued job's first attempt ended on the node and its second runs there on
    /// another GPU: the first attempt's GPU comes back (it used to stay held back until the
    /// job left the node altogether).
    #[test]
    fn an_ended_attempt_is_released_while_a_later_one_runs() {
        let hub = Hub::default();
        // Its first heartbeat of the term, before anything was held back.
        assert!(
            hub.reconcile("n", &[]).0,
            "a node first heard may take work"
        );
        hub.withhold("n", "a", 1, vec!["GPU-0".into()]);
        let (released, still) = hub.reconcile("n", &running(&[("a", Some(1))]));
        assert!(!released && still.len() == 1, "attempt 1 still runs");
        assert_eq!(hub.withheld_gpus("n"), ["GPU-0"]);
        let (released, still) = hub.reconcile("n", &running(&[("a", Some(2))]));
        assert!(released && still.is_empty());
        assert!(hub.withheld_gpus("n").is_empty());
    }

    #[test]
    fn without_attempts_or_for_any_attempt_the_job_id_decides() {
        let hub = Hub::default();
        // Its first heartbeat of the term, before anything was held back.
        assert!(
            hub.reconcile("n", &[]).0,
            "a node first heard may take work"
        );
        hub.withhold("n", "a", 1, vec!["GPU-0".into()]);
        hub.withhold("n", "b", 0, vec!["GPU-1".into()]);
        // An agent that does not say which attempt runs: held while the job runs.
        let (released, _) = hub.reconcile("n", &running(&[("a", None), ("b", Some(5))]));
        assert!(!released);
        assert_eq!(hub.withheld_gpus("n").len(), 2);
        assert!(hub.audit_once("n", "b") && !hub.audit_once("n", "b"));
        let (released, _) = hub.reconcile("n", &[]);
        assert!(released);
        assert!(hub.withheld_gpus("n").is_empty());
    }

    /// A node takes new work only once its stream is open and its heartbeat has reached
    /// this term: a new leader learns from that heartbeat what ended jobs still hold there.
    #[test]
    fn a_node_is_placeable_once_subscribed_and_heard_in_the_term() {
        let hub = Hub::default();
        let (_tx, _rx, _) = hub.subscribe("n").expect("first stream");
        assert!(hub.placeable().is_empty(), "not heard yet");
        let (first, _) = hub.reconcile("n", &[]);
        assert!(first);
        assert!(hub.placeable().contains("n"));
        assert!(!hub.reconcile("n", &[]).0, "heard already");
        hub.reset();
        assert!(hub.placeable().is_empty(), "a new term hears it again");
        // Heard but not subscribed: a launch could not reach it.
        hub.close_all();
        hub.reconcile("m", &[]);
        assert!(hub.placeable().is_empty());
    }
}
