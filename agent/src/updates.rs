//! The agent's status update manager (PURE: time is an input).
//!
//! Updates of one task are delivered in order and **pipelined**: each goes out as soon as it is
//! known, on the agent's one stream to the master, without waiting for the acknowledgement of
//! the previous one (at most [`WINDOW`] unacknowledged updates of a task are in flight; the
//! master keeps the same bound). Each update stays queued until the framework's
//! acknowledgement comes back through the master (acknowledgements may come in any order).
//! When the oldest in-flight update of a task is not acknowledged in time, every in-flight
//! update of the task is sent again, in order, with capped exponential backoff. The whole
//! queue is checkpointed so it survives restarts.

use std::collections::{BTreeMap, VecDeque};

use gantry_proto::{StatusUpdate, TaskId, UpdateId};
use serde::{Deserialize, Serialize};

/// First retry after 1 s, doubling up to 10 s.
pub const RETRY_INITIAL_MS: u64 = 1_000;
pub const RETRY_MAX_MS: u64 = 10_000;
/// Unacknowledged updates of one task in flight at once (the master refuses more:
/// `gantry_master`'s per-task bound is the same number).
pub const WINDOW: usize = 8;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TaskQueue {
    updates: VecDeque<StatusUpdate>,
    /// How many of the oldest updates were sent on this connection (at most [`WINDOW`]).
    #[serde(skip)]
    sent: usize,
    /// When the in-flight updates were last sent, or the oldest of them was last acknowledged
    /// (None: nothing in flight on this connection).
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
    /// Queues an update (it goes out at the next [`UpdateQueue::due`], once fewer than
    /// [`WINDOW`] older updates of its task are in flight).
    pub fn push(&mut self, update: StatusUpdate) {
        self.tasks
            .entry(update.task_id)
            .or_default()
            .updates
            .push_back(update);
    }

    /// Handles an acknowledgement of any queued update of the task (in flight or not: the
    /// write-ahead log replays acknowledgements before anything is sent). Returns true if it
    /// matched one.
    pub fn ack(&mut self, task: TaskId, update: UpdateId, now: u64) -> bool {
        let Some(q) = self.tasks.get_mut(&task) else {
            return false;
        };
        let Some(pos) = q.updates.iter().position(|u| u.update_id == update) else {
            return false;
        };
        q.updates.remove(pos);
        if pos < q.sent {
            q.sent -= 1;
        }
        if q.sent == 0 {
            q.sent_at = None;
            q.retry_ms = 0;
        } else if pos == 0 {
            // Progress: the next oldest gets a full retry period from now.
            q.sent_at = Some(now);
            q.retry_ms = RETRY_INITIAL_MS;
        }
        if q.updates.is_empty() {
            self.tasks.remove(&task);
        }
        true
    }

    /// The updates to (re)send now, in order per task: every in-flight update of a task whose
    /// oldest one was not acknowledged in time, then the updates not sent on this connection
    /// yet, up to the window.
    pub fn due(&mut self, now: u64) -> Vec<StatusUpdate> {
        let mut out = Vec::new();
        for q in self.tasks.values_mut() {
            let timed_out = q.sent > 0 && q.sent_at.is_some_and(|t| now >= t + q.retry_ms);
            if timed_out {
                self.retries += q.sent as u64;
                out.extend(q.updates.iter().take(q.sent).cloned());
                q.retry_ms = (q.retry_ms * 2).clamp(RETRY_INITIAL_MS, RETRY_MAX_MS);
                q.sent_at = Some(now);
            }
            let limit = q.updates.len().min(WINDOW);
            if q.sent < limit {
                out.extend(q.updates.range(q.sent..limit).cloned());
                if q.sent == 0 {
                    q.sent_at = Some(now);
                    q.retry_ms = RETRY_INITIAL_MS;
                }
                q.sent = limit;
            }
        }
        out
    }

    /// When [`UpdateQueue::due`] has something to send next: now for updates not sent on this
    /// connection yet (within the window), else the earliest retry. `None`: nothing queued.
    pub fn next_due(&self, now: u64) -> Option<u64> {
        self.tasks
            .values()
            .filter_map(|q| {
                if q.sent < q.updates.len().min(WINDOW) {
                    Some(now)
                } else if q.sent > 0 {
                    q.sent_at.map(|t| t + q.retry_ms)
                } else {
                    None
                }
            })
            .min()
    }

    /// After a reconnect: everything in flight is sent again at once.
    pub fn reset_connection(&mut self) {
        for q in self.tasks.values_mut() {
            q.sent = 0;
            q.sent_at = None;
            q.retry_ms = 0;
        }
    }

    /// After registering (the master got the updates of [`UpdateQueue::in_window`] inside the
    /// registration): treat them as sent now, so retries follow the normal backoff.
    pub fn mark_all_sent(&mut self, now: u64) {
        for q in self.tasks.values_mut() {
            q.sent = q.updates.len().min(WINDOW);
            q.sent_at = Some(now);
            q.retry_ms = RETRY_INITIAL_MS;
        }
    }

    /// The unacknowledged updates that may be in flight (up to [`WINDOW`] per task), oldest
    /// first per task (for re-registration).
    pub fn in_window(&self) -> Vec<StatusUpdate> {
        self.tasks
            .values()
            .flat_map(|q| q.updates.iter().take(WINDOW).cloned())
            .collect()
    }

    /// All unacknowledged updates, oldest first per task.
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
    use gantry_proto::*;

    fn update(task: TaskId, state: TaskState) -> StatusUpdate {
        StatusUpdate::new(task, FrameworkId::random(), state)
    }

    fn states(v: &[StatusUpdate]) -> Vec<TaskState> {
        v.iter().map(|u| u.state).collect()
    }

    #[test]
    fn pipelined_in_order_with_backoff_until_acked() {
        let t = TaskId::random();
        let mut q = UpdateQueue::default();
        let starting = update(t, TaskState::Starting);
        let running = update(t, TaskState::Running);
        let finished = update(t, TaskState::Finished);
        q.push(starting.clone());
        q.push(running.clone());
        // Both go at once, in order, without waiting for an acknowledgement.
        assert_eq!(q.due(0), vec![starting.clone(), running.clone()]);
        assert!(q.due(10).is_empty(), "nothing new, nothing due");
        q.push(finished.clone());
        assert_eq!(q.due(20), vec![finished.clone()], "only the new one");
        assert!(q.due(500).is_empty());
        // The oldest was not acknowledged in time: everything in flight again, in order.
        assert_eq!(
            q.due(1000),
            vec![starting.clone(), running.clone(), finished.clone()]
        );
        assert!(q.due(2500).is_empty(), "second retry waits 2 s");
        assert_eq!(q.due(3000).len(), 3);
        assert_eq!(q.retries(), 6, "the first sends are not retries");
        assert!(q.ack(t, starting.update_id, 3100));
        assert!(
            !q.ack(t, starting.update_id, 3100),
            "a duplicate ack matches nothing"
        );
        // Progress restarts the retry period from the acknowledgement.
        assert!(q.due(4000).is_empty());
        assert_eq!(q.due(4100), vec![running.clone(), finished.clone()]);
        assert!(q.ack(t, running.update_id, 4200));
        assert!(q.ack(t, finished.update_id, 4200));
        assert!(q.is_empty());
        assert!(!q.has_pending(t));
    }

    #[test]
    fn acknowledgements_out_of_order_remove_only_their_update() {
        let t = TaskId::random();
        let mut q = UpdateQueue::default();
        let u: Vec<StatusUpdate> = [TaskState::Starting, TaskState::Running, TaskState::Failed]
            .into_iter()
            .map(|s| update(t, s))
            .collect();
        for x in &u {
            q.push(x.clone());
        }
        assert_eq!(q.due(0).len(), 3);
        assert!(q.ack(t, u[2].update_id, 10), "the newest first");
        assert!(q.ack(t, u[0].update_id, 20));
        assert!(q.has_pending(t));
        assert_eq!(q.all(), vec![u[1].clone()]);
        // The one left is retried from the time the oldest was acknowledged.
        assert!(q.due(1019).is_empty());
        assert_eq!(q.due(1020), vec![u[1].clone()]);
        assert!(!q.ack(TaskId::random(), u[1].update_id, 30), "another task");
        assert!(q.ack(t, u[1].update_id, 30));
        assert!(q.is_empty());
    }

    #[test]
    fn at_most_a_window_of_a_task_is_in_flight() {
        let t = TaskId::random();
        let other = TaskId::random();
        let mut q = UpdateQueue::default();
        let u: Vec<StatusUpdate> = (0..WINDOW + 2)
            .map(|_| update(t, TaskState::Running))
            .collect();
        for x in &u {
            q.push(x.clone());
        }
        let o = update(other, TaskState::Starting);
        q.push(o.clone());
        let sent = q.due(0);
        assert_eq!(
            sent.len(),
            WINDOW + 1,
            "a window of one task, and the other"
        );
        assert!(sent.contains(&o));
        assert_eq!(
            &sent
                .iter()
                .filter(|x| x.task_id == t)
                .cloned()
                .collect::<Vec<_>>()[..],
            &u[..WINDOW]
        );
        assert_eq!(
            q.in_window().len(),
            WINDOW + 1,
            "registration carries the window"
        );
        assert_eq!(q.all().len(), WINDOW + 3);
        // An acknowledgement opens the window for the next one.
        assert!(q.ack(t, u[0].update_id, 5));
        assert_eq!(q.due(6), vec![u[WINDOW].clone()]);
        assert!(q.ack(t, u[3].update_id, 7));
        assert_eq!(q.due(8), vec![u[WINDOW + 1].clone()]);
        assert!(q.due(9).is_empty());
    }

    #[test]
    fn reconnect_resends_immediately_and_survives_serde() {
        let t = TaskId::random();
        let mut q = UpdateQueue::default();
        q.push(update(t, TaskState::Starting));
        q.push(update(t, TaskState::Running));
        assert_eq!(q.due(0).len(), 2);
        q.reset_connection();
        assert_eq!(
            states(&q.due(1)),
            vec![TaskState::Starting, TaskState::Running]
        );
        let json = serde_json::to_string(&q).unwrap();
        let mut back: UpdateQueue = serde_json::from_str(&json).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(
            back.due(0).len(),
            2,
            "a restarted agent sends them all again"
        );
        // Registered with them: sent, retried on the normal backoff.
        back.reset_connection();
        back.mark_all_sent(100);
        assert!(back.due(100).is_empty());
        assert_eq!(back.due(1100).len(), 2);
    }

    #[test]
    fn acknowledgements_replayed_before_anything_was_sent_apply() {
        let t = TaskId::random();
        let mut q = UpdateQueue::default();
        let a = update(t, TaskState::Starting);
        let b = update(t, TaskState::Running);
        q.push(a.clone());
        q.push(b.clone());
        assert!(q.ack(t, b.update_id, 0));
        assert_eq!(q.due(0), vec![a]);
    }
}
