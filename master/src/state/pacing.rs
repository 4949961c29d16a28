//! Status updates paced to a framework that reads slower than its tasks change.
//!
//! A framework's status updates wait in its task records (`TaskRec::pending`, up to
//! `MAX_PENDING_UPDATES` per task, in order) until it acknowledges them: the master has them anyway. So when a framework's outbox is full, the
//! shell does not close it for an agent's update (it does for anything else, the master's own
//! updates included: the hostile-peer rule; agents' updates never take the outbox's last
//! quarter, which stays for those); it hands the update back ([`Input::UpdatesHeld`]) and the
//! core keeps only its ids, in order, per framework. From then on that framework's updates queue behind them, and
//! [`Master::work_backlog`] sends them as its outbox drains. A re-subscribing framework gets
//! its unacknowledged updates the same way (not all at once, which would overflow the outbox
//! of a framework with 80,000 tasks starting and close it again, forever).
//!
//! Memory: one entry per unacknowledged update the master already holds (a retransmitted
//! update is held once), so a framework that never reads costs two ids per update of its own
//! tasks, no more.

use super::*;

/// Held updates of one framework: ids in the order they were produced, and the same ids as a
/// set (an agent retransmitting an update while it waits here does not hold it twice).
#[derive(Debug, Default)]
pub(crate) struct Held {
    queue: VecDeque<(TaskId, UpdateId)>,
    set: HashSet<(TaskId, UpdateId)>,
}

impl Held {
    fn push(&mut self, key: (TaskId, UpdateId)) {
        if self.set.insert(key) {
            self.queue.push_back(key);
        }
    }

    fn pop(&mut self) -> Option<(TaskId, UpdateId)> {
        let key = self.queue.pop_front()?;
        self.set.remove(&key);
        Some(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }
}

/// Held updates sent per framework per [`Master::work_backlog`] slice at most.
pub const UPDATE_SLICE: usize = 1024;

impl Master {
    /// Sends `update` (already `pending` on its task) to its framework now, or holds it when the
    /// framework is behind (earlier updates held: order is kept). Nothing while the framework
    /// is disconnected: it gets its pending updates when it subscribes again.
    pub(super) fn deliver_update(&mut self, update: StatusUpdate, out: &mut Vec<Output>) {
        let fw = update.framework_id;
        let Some(conn) = self.frameworks.get(&fw).and_then(|f| f.conn) else {
            return;
        };
        match self.held.get_mut(&fw) {
            Some(held) => held.push((update.task_id, update.update_id)),
            None => out.push(Output::ToFramework(conn, MasterToFramework::Update(update))),
        }
    }

    /// The update `update_id` of task `task_id` if it is the one waiting for its framework's
    /// acknowledgement.
    fn pending_update(&self, task_id: TaskId, update_id: UpdateId) -> Option<&StatusUpdate> {
        self.tasks
            .get(&task_id)?
            .pending
            .iter()
            .find(|u| u.update_id == update_id)
    }

    /// The shell could not queue these agents' updates to `conn` (its outbox was full): held,
    /// in order, those still pending on the connection's framework's tasks. One no longer
    /// pending was acknowledged or superseded (a master-made terminal update, which went out
    /// itself): nothing to send.
    pub(super) fn updates_held(&mut self, conn: ConnId, updates: Vec<(TaskId, UpdateId)>) {
        let Some(Peer::Framework {
            framework: Some(fw),
            ..
        }) = self.conns.get(&conn)
        else {
            return;
        };
        let fw = *fw;
        if self.frameworks.get(&fw).and_then(|f| f.conn) != Some(conn) {
            return;
        }
        let ours: VecDeque<_> = updates
            .into_iter()
            .filter(|(t, u)| {
                self.pending_update(*t, *u)
                    .is_some_and(|p| p.framework_id == fw)
            })
            .collect();
        let held = self.held.entry(fw).or_default();
        // Held before anything already waiting: these were produced earlier.
        let mut queue = ours;
        queue.extend(held.queue.drain(..));
        held.set.clear();
        for key in queue {
            held.push(key);
        }
        if held.len() == 0 {
            self.held.remove(&fw);
        }
    }

    /// Holds every update `fw` has not acknowledged, oldest first (a framework subscribing
    /// again): [`Master::work_backlog`] sends them as its outbox has room.
    pub(super) fn hold_pending(&mut self, fw: FrameworkId) {
        // Tasks by their oldest pending update, each task's updates in order.
        let mut pending: Vec<&VecDeque<StatusUpdate>> = self
            .frameworks
            .get(&fw)
            .map(|f| {
                f.tasks
                    .iter()
                    .filter_map(|t| self.tasks.get(t).map(|t| &t.pending))
                    .filter(|q| !q.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        pending.sort_unstable_by_key(|q| q.front().map(|u| (u.timestamp_ms, u.task_id)));
        let keys: Vec<(TaskId, UpdateId)> = pending
            .into_iter()
            .flatten()
            .map(|u| (u.task_id, u.update_id))
            .collect();
        self.held.remove(&fw);
        if keys.is_empty() {
            return;
        }
        let held = self.held.entry(fw).or_default();
        for key in keys {
            held.push(key);
        }
    }

    /// The framework left (or was removed): nothing more to send it; a re-subscription holds
    /// its pending updates again.
    pub(super) fn forget_held(&mut self, fw: FrameworkId) {
        self.held.remove(&fw);
    }

    /// Sends held updates to every framework whose outbox has room: at most `room(conn)` and
    /// [`UPDATE_SLICE`] each. False when no framework with held updates had room.
    pub(super) fn work_held(
        &mut self,
        out: &mut Vec<Output>,
        room: &impl Fn(ConnId) -> usize,
    ) -> bool {
        let ids: Vec<FrameworkId> = self.held.keys().copied().collect();
        let mut progress = false;
        for fw in ids {
            let Some(conn) = self.frameworks.get(&fw).and_then(|f| f.conn) else {
                self.held.remove(&fw);
                continue;
            };
            let n = room(conn).min(UPDATE_SLICE);
            if n > 0 {
                self.send_held(fw, conn, n, out);
                progress = true;
            }
        }
        progress
    }

    /// Sends up to `n` of `fw`'s held updates to `conn`, oldest first; once none are left its
    /// updates go straight out again.
    pub(super) fn send_held(
        &mut self,
        fw: FrameworkId,
        conn: ConnId,
        n: usize,
        out: &mut Vec<Output>,
    ) {
        let mut sent = 0;
        while sent < n {
            let Some((t, u)) = self.held.get_mut(&fw).and_then(Held::pop) else {
                break;
            };
            // Acknowledged since (or superseded): nothing to send.
            if let Some(update) = self.pending_update(t, u) {
                out.push(Output::ToFramework(
                    conn,
                    MasterToFramework::Update(update.clone()),
                ));
                sent += 1;
            }
        }
        if self.held.get(&fw).is_some_and(|h| h.len() == 0) {
            self.held.remove(&fw);
        }
    }

    /// Status updates held for frameworks (for `/state` and tests).
    pub fn held_updates(&self) -> usize {
        self.held.values().map(Held::len).sum()
    }
}
