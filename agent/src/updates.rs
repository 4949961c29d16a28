//! The agent's status update manager (PURE: time is an input).
//!
//! Updates of one task are delivered in order: only the oldest unacknowledged update of a task
//! is in flight; it is retried with capped exponential backoff until the master acknowledges
//! it, and then the next one goes. The whole queue is checkpointed so it survives restarts.

use std::collections::{BTreeMap, VecDeque};

use gantry_sdk::protocol::{StatusUpdate, TaskId, UpdateId};
use serde::{Deserialize, Serialize};

/// First retry after 1 s, doubling up to 10 s.
pub const RETRY_INITIAL_MS: u64 = 1_000;
pub const RETRY_MAX_MS: u64 = 10_000;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TaskQueue {
    updates: VecDeque<StatusUpdate>,
    /// When the head was last sent (None: not sent on this connection yet).
    #[serde(skip)]
    sent_at: Option<u64>,
    #[serde(skip)]
    retry_ms: u64,
}

/// Per-task queues of unacknowledged updates.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UpdateQueue {
    tasks: BTreeMap<TaskId, TaskQueue>,
    /// Updates sent again because no acknowledgement came in time (since the agent started).
    #[serde(skip)]
    retries: u64,
}

impl UpdateQueue {
    /// Queues an update (it goes out when it reaches the head of its task's queue).
    pub fn push(&mut self, update: StatusUpdate) {
        self.tasks
            .entry(update.task_id)
            .or_default()
            .updates
            .push_back(update);
    }

    /// Handles an acknowledgement. Returns true if it matched the task's in-flight update.
    pub fn ack(&mut self, task: TaskId, update: UpdateId) -> bool {
        let Some(q) = self.tasks.get_mut(&task) else {
            return false;
        };
        if q.updates.front().map(|u| u.update_id) != Some(update) {
            return false;
        }
        q.updates.pop_front();
        q.sent_at = None;
        q.retry_ms = 0;
        if q.updates.is_empty() {
            self.tasks.remove(&task);
        }
        true
    }

    /// The updates to (re)send now: heads never sent on this connection, and heads whose
    /// retry time has come.
    pub fn due(&mut self, now: u64) -> Vec<StatusUpdate> {
        let mut out = Vec::new();
        for q in self.tasks.values_mut() {
            let Some(head) = q.updates.front() else {
                continue;
            };
            let due = match q.sent_at {
                None => true,
                Some(t) => now >= t + q.retry_ms,
            };
            if due {
                if q.sent_at.is_some() {
                    self.retries += 1;
                }
                out.push(head.clone());
                q.retry_ms = if q.sent_at.is_none() {
                    RETRY_INITIAL_MS
                } else {
                    (q.retry_ms * 2).clamp(RETRY_INITIAL_MS, RETRY_MAX_MS)
                };
                q.sent_at = Some(now);
            }
        }
        out
    }

    /// After a reconnect: everything in flight is sent again at once.
    pub fn reset_connection(&mut self) {
        for q in self.tasks.values_mut() {
            q.sent_at = None;
            q.retry_ms = 0;
        }
    }

    /// After registering (the master got every pending update inside the registration): treat
    /// every head as sent now, so retries follow the normal backoff.
    pub fn mark_all_sent(&mut self, now: u64) {
        for q in self.tasks.values_mut() {
            q.sent_at = Some(now);
            q.retry_ms = RETRY_INITIAL_MS;
        }
    }

    /// All unacknowledged updates, oldest first per task (for re-registration).
    pub fn all(&self) -> Vec<StatusUpdate> {
        self.tasks
            .values()
            .flat_map(|q| q.updates.iter().cloned())
            .collect()
    }

    /// True if the task still has updates waiting for acknowledgement.
    pub fn has_pending(&self, task: TaskId) -> bool {
        self.tasks.contains_key(&task)
    }

    /// Updates sent again because no acknowledgement came in time (`/metrics`).
    pub fn retries(&self) -> u64 {
        self.retries
    }

    pub fn len(&self) -> usize {
        self.tasks.values().map(|q| q.updates.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_sdk::protocol::*;

    fn update(task: TaskId, state: TaskState) -> StatusUpdate {
        StatusUpdate::new(task, FrameworkId::random(), state)
    }

    #[test]
    fn in_order_with_backoff_until_acked() {
        let t = TaskId::random();
        let mut q = UpdateQueue::default();
        let running = update(t, TaskState::Running);
        let finished = update(t, TaskState::Finished);
        q.push(running.clone());
        q.push(finished.clone());
        assert_eq!(q.due(0), vec![running.clone()]);
        assert!(q.due(500).is_empty());
        assert_eq!(q.due(1000), vec![running.clone()]);
        assert!(q.due(2500).is_empty(), "second retry waits 2 s");
        assert_eq!(q.due(3000), vec![running.clone()]);
        assert_eq!(q.retries(), 2, "the first send is not a retry");
        assert!(
            !q.ack(t, finished.update_id),
            "only the head can be acknowledged"
        );
        assert!(q.ack(t, running.update_id));
        assert_eq!(q.due(3001), vec![finished.clone()]);
        assert!(q.ack(t, finished.update_id));
        assert!(q.is_empty());
    }

    #[test]
    fn reconnect_resends_immediately_and_survives_serde() {
        let t = TaskId::random();
        let mut q = UpdateQueue::default();
        q.push(update(t, TaskState::Running));
        assert_eq!(q.due(0).len(), 1);
        q.reset_connection();
        assert_eq!(q.due(1).len(), 1);
        let json = serde_json::to_string(&q).unwrap();
        let mut back: UpdateQueue = serde_json::from_str(&json).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back.due(0).len(), 1);
    }
}
