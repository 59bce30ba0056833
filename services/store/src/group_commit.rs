//! Group commit: callers queue writes, one task commits whatever has queued, one
//! transaction per audit log, so a busy log pays one commit (one fsync, one lock of its
//! head) per batch instead of one per write. Batches for different logs commit
//! concurrently; the next batch is gathered while one commits. Reads that many requests
//! make alike use the same queue (`TokenReader`: one statement per batch).

use std::collections::BTreeMap;
use std::future::Future;

use tokio::sync::{mpsc, oneshot};

use crate::StoreError;

type Queued<I, O> = (I, oneshot::Sender<Result<O, StoreError>>);

/// A queue of writes of `I`, each answered with its own `O` once its batch committed.
pub(crate) struct GroupCommit<I, O> {
    tx: mpsc::UnboundedSender<Queued<I, O>>,
}

impl<I, O> Clone for GroupCommit<I, O> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> GroupCommit<I, O> {
    /// Starts the committing task; it ends when every clone of the queue is dropped.
    /// `log_of` names the audit log an item appends to; `commit` writes one log's batch
    /// and answers each item, in order (as many answers as items).
    pub(crate) fn start<L, C, F>(
        max_batch: usize,
        log_of: L,
        commit: C,
    ) -> (Self, tokio::task::JoinHandle<()>)
    where
        L: Fn(&I) -> String + Send + 'static,
        C: Fn(String, Vec<I>) -> F + Send + 'static,
        F: Future<Output = Vec<Result<O, StoreError>>> + Send,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<Queued<I, O>>();
        let task = tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < max_batch.max(1) {
                    match rx.try_recv() {
                        Ok(q) => batch.push(q),
                        Err(_) => break,
                    }
                }
                let mut by_log: BTreeMap<String, Vec<Queued<I, O>>> = BTreeMap::new();
                for q in batch {
                    by_log.entry(log_of(&q.0)).or_default().push(q);
                }
                let commits = by_log.into_iter().map(|(log, queued)| {
                    let (items, waiters): (Vec<_>, Vec<_>) = queued.into_iter().unzip();
                    let answers = commit(log, items);
                    async move {
                        let mut answers = answers.await.into_iter();
                        for done in waiters {
                            let answer = answers.next().unwrap_or_else(|| {
                                Err(StoreError::Batch("the batch gave no answer".into()))
                            });
                            let _ = done.send(answer);
                        }
                    }
                });
                futures_util::future::join_all(commits).await;
            }
        });
        (Self { tx }, task)
    }

    /// Queues one write and waits until its batch is committed (or failed).
    pub(crate) async fn submit(&self, item: I) -> Result<O, StoreError> {
        let stopped = || StoreError::Batch("the group commit has stopped".into());
        let (done, wait) = oneshot::channel();
        self.tx.send((item, done)).map_err(|_| stopped())?;
        wait.await.map_err(|_| stopped())?
    }
}
