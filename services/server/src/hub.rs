//! Per-node assignment streams: the scheduler and the API push launches and cancels here, and
//! the node's open `WatchAssignments` stream carries them.

use std::collections::HashMap;
use std::sync::Mutex;

use allot_domain::Job;
use allot_proto::v1::{Assignment, Cancel, Launch, assignment::Kind};
use tokio::sync::mpsc;

pub type AssignmentTx = mpsc::UnboundedSender<Result<Assignment, tonic::Status>>;
pub type AssignmentRx = mpsc::UnboundedReceiver<Result<Assignment, tonic::Status>>;

#[derive(Debug, Default)]
pub struct Hub {
    streams: Mutex<HashMap<String, AssignmentTx>>,
}

impl Hub {
    /// Opens the node's stream, replacing (and so closing) any earlier one.
    pub fn subscribe(&self, node_id: &str) -> (AssignmentTx, AssignmentRx) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().insert(node_id.to_owned(), tx.clone());
        (tx, rx)
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

    /// Ends every open stream, so that connected agents see the control plane go away.
    pub fn close_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AssignmentTx>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub fn launch(job: &Job) -> Assignment {
    Assignment {
        kind: Some(Kind::Launch(Launch {
            job_id: job.id.clone(),
            tenant: job.spec.tenant.to_string(),
            name: job.spec.name.clone(),
            command: job.spec.command.clone(),
            env: job.spec.env.clone().into_iter().collect(),
            workdir: job.spec.workdir.clone().unwrap_or_default(),
            gpu_uuids: job.gpu_uuids.clone(),
            attempt: job.attempt,
            gpu_milli: job.held_gpu_milli.unwrap_or(allot_domain::GPU_MILLI),
            gpu_memory_bytes: job.spec.gpu_memory_bytes.unwrap_or(0),
        })),
    }
}

/// Stops the job's current attempt: cancelled by a person, or preempted by reclaim (then
/// `preempt_reason` says why).
pub fn cancel(job: &Job) -> Assignment {
    Assignment {
        kind: Some(Kind::Cancel(Cancel {
            job_id: job.id.clone(),
            attempt: job.attempt,
            reason: match &job.preempt_reason {
                Some(r) if !job.cancel_requested => format!("preempted: {r}"),
                _ => "cancelled".to_owned(),
            },
        })),
    }
}
