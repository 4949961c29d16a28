//! Ordered, group-committed registry writes for the server's event loop.
//!
//! The core loop must not wait on etcd for every agent admission. It submits mutation batches
//! here and gets a [`PendingWrite`] back at once; one background task applies them **in
//! submission order**, packing consecutive submissions into one store call of up to
//! [`MAX_GROUP_OPS`] mutations (a single etcd transaction, a single journal fsync). When 10,000
//! agents register at once this turns 10,000 round trips into about 80.
//!
//! A group is all-or-nothing: if its write fails, every submission in it gets the error (for
//! example `Fenced` after a lost leadership). Each submission is validated on its own first, so
//! an invalid one fails alone without failing its neighbours.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

use super::etcd::MAX_TXN_OPS;
use super::{Mutation, RegistryError, RegistryStore};

/// Most mutations written in one group (etcd's transaction limit).
pub const MAX_GROUP_OPS: usize = MAX_TXN_OPS;

struct Job {
    mutations: Vec<Mutation>,
    done: oneshot::Sender<Result<(), RegistryError>>,
}

/// Counters of a writer (for tests and metrics).
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Submissions completed (successfully or not).
    pub submissions: AtomicU64,
    /// Store calls made (groups).
    pub commits: AtomicU64,
}

/// Handle to the background writer. Cheap to clone; the task ends when every handle is dropped
/// (after finishing what was submitted).
#[derive(Clone)]
pub struct RegistryWriter {
    tx: mpsc::UnboundedSender<Job>,
    stats: Arc<WriterStats>,
}

/// The outcome of one submission; resolves when it is durable (or failed).
pub struct PendingWrite(oneshot::Receiver<Result<(), RegistryError>>);

impl Future for PendingWrite {
    type Output = Result<(), RegistryError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(RegistryError::Etcd(
                    "registry writer stopped before the write completed".into(),
                ))
            })
        })
    }
}

impl RegistryWriter {
    /// Starts the writer task on the current Tokio runtime.
    pub fn spawn(store: RegistryStore) -> RegistryWriter {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(WriterStats::default());
        tokio::spawn(run(store, rx, stats.clone()));
        RegistryWriter { tx, stats }
    }

    /// Queues a batch (applied atomically, after everything submitted before it).
    pub fn submit(&self, mutations: Vec<Mutation>) -> PendingWrite {
        let (done, rx) = oneshot::channel();
        if let Err(e) = mutations.iter().try_for_each(Mutation::validate) {
            let _ = done.send(Err(e));
        } else if let Err(mpsc::error::SendError(job)) = self.tx.send(Job { mutations, done }) {
            let _ = job.done.send(Err(RegistryError::Etcd(
                "registry writer is not running".into(),
            )));
        }
        PendingWrite(rx)
    }

    /// Submits and waits until the batch is durable.
    pub async fn write(&self, mutations: Vec<Mutation>) -> Result<(), RegistryError> {
        self.submit(mutations).await
    }

    /// Counters.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }
}

/// A copy of an error for every submission of a failed group.
fn duplicate(e: &RegistryError) -> RegistryError {
    match e {
        RegistryError::Fenced(m) => RegistryError::Fenced(m.clone()),
        RegistryError::Corrupt { location, reason } => RegistryError::Corrupt {
            location: location.clone(),
            reason: reason.clone(),
        },
        RegistryError::Invalid(m) => RegistryError::Invalid(m.clone()),
        RegistryError::Io { path, source } => RegistryError::Io {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        RegistryError::Etcd(m) => RegistryError::Etcd(m.clone()),
        RegistryError::Timeout(d) => RegistryError::Timeout(*d),
    }
}

async fn run(store: RegistryStore, mut rx: mpsc::UnboundedReceiver<Job>, stats: Arc<WriterStats>) {
    let mut carry: Option<Job> = None;
    loop {
        let first = match carry.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let mut ops = first.mutations.len();
        let mut group = vec![first];
        // Take whatever else is already queued, up to the group limit.
        while ops < MAX_GROUP_OPS {
            match rx.try_recv() {
                Ok(job) if ops + job.mutations.len() <= MAX_GROUP_OPS => {
                    ops += job.mutations.len();
                    group.push(job);
                }
                Ok(job) => {
                    carry = Some(job);
                    break;
                }
                Err(_) => break,
            }
        }
        let mutations: Vec<Mutation> = group
            .iter()
            .flat_map(|j| j.mutations.iter().cloned())
            .collect();
        let result = store.apply_all(&mutations).await;
        stats.commits.fetch_add(1, Ordering::Relaxed);
        stats
            .submissions
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        for job in group {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(duplicate(e)),
            };
            let _ = job.done.send(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Fence;
    use crate::registry::{AgentRecord, FileStore};
    use gantry_proto::ids::AgentId;

    fn agent(i: u128) -> Mutation {
        Mutation::PutAgent(AgentRecord {
            id: AgentId::from_u128(i),
            name: format!("agent-{i}"),
            hostname: format!("host-{i}"),
            deactivated: false,
        })
    }

    #[tokio::test]
    async fn groups_concurrent_submissions_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = RegistryStore::File(FileStore::open(dir.path()).unwrap());
        store.set_fence(Fence::Standalone);
        let writer = RegistryWriter::spawn(store.clone());
        let pending: Vec<PendingWrite> = (0..1000u128)
            .map(|i| writer.submit(vec![agent(i)]))
            .collect();
        // A later submission overrides an earlier one for the same key: order is kept.
        let last = writer.submit(vec![Mutation::PutAgent(AgentRecord {
            id: AgentId::from_u128(5),
            name: "renamed".into(),
            hostname: "h".into(),
            deactivated: false,
        })]);
        for p in pending {
            p.await.unwrap();
        }
        last.await.unwrap();
        let reg = store.load().await.unwrap();
        assert_eq!(reg.agents.len(), 1000);
        assert_eq!(reg.agents[&AgentId::from_u128(5)].name, "renamed");
        let commits = writer.stats().commits.load(Ordering::Relaxed);
        assert!(
            commits < 100,
            "{commits} commits for 1001 submissions: no grouping"
        );
        assert_eq!(writer.stats().submissions.load(Ordering::Relaxed), 1001);
    }

    #[tokio::test]
    async fn invalid_submission_fails_alone_and_fenced_group_fails_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = RegistryStore::File(FileStore::open(dir.path()).unwrap());
        store.set_fence(Fence::Standalone);
        let writer = RegistryWriter::spawn(store.clone());
        let bad = writer.submit(vec![Mutation::SetWeight {
            role: "a".into(),
            weight: -1.0,
        }]);
        let good = writer.submit(vec![agent(1)]);
        assert!(matches!(bad.await, Err(RegistryError::Invalid(_))));
        good.await.unwrap();

        store.clear_fence();
        let a = writer.submit(vec![agent(2)]);
        let b = writer.submit(vec![agent(3)]);
        assert!(matches!(a.await, Err(RegistryError::Fenced(_))));
        assert!(matches!(b.await, Err(RegistryError::Fenced(_))));
        assert_eq!(store.load().await.unwrap().agents.len(), 1);
    }
}
