//! Messages paced to a framework that reads slower than its tasks change: a slow framework
//! is slowed down, not closed.
//!
//! - *Agents' status updates* wait in their task records (`TaskRec::pending`, up to
//!   `MAX_PENDING_UPDATES` per task, in order) until acknowledged: the master has them anyway.
//!   They never take the last quarter of a framework's outbox; beyond it the shell hands them
//!   back ([`Input::UpdatesHeld`]) and the core keeps only their ids, in order, per framework.
//!   From then on that framework's updates queue behind them, and [`Master::work_backlog`]
//!   sends them as its outbox drains. A re-subscribing framework gets its unacknowledged
//!   updates the same way (not all at once, which would overflow the outbox of a framework
//!   with 80,000 tasks starting and close it again, forever).
//! - *Offers* a full outbox could not take go back to the pool ([`Input::Undelivered`]): the
//!   framework never saw them. And no offers are made to a framework whose outbox is more than
//!   half full or that has updates held ([`Master::pace_offers`], before each allocation): it
//!   would read them late and accept them stale, and the others get them instead.
//! - *Everything else* (rescinds, the master's own updates, errors, notices) exists nowhere
//!   else: held in full, sent first as the outbox drains, at most [`HELD_MESSAGES`]. Only a
//!   framework past that, a full outbox *and* that many messages behind, is closed (the
//!   hostile-peer rule: what it costs the master stays bounded).
//!
//! Memory: two ids per unacknowledged update of the framework's own tasks, plus at most
//! [`HELD_MESSAGES`] messages.

use super::*;

/// Held updates of one framework: ids in the order they were produced, and the same ids as a
/// set (an agent retransmitting an update while it waits here does not hold it twice).
#[derive(Debug, Default)]
pub(crate) struct Held {
    queue: VecDeque<(TaskId, UpdateId)>,
    set: HashSet<(TaskId, UpdateId)>,
    /// Messages that exist nowhere else (rescinds, the master's own updates, errors,
    /// notices), sent before the held updates; at most [`HELD_MESSAGES`].
    messages: VecDeque<MasterToFramework>,
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
        self.queue.len() + self.messages.len()
    }
}

/// True for the status updates the core can send again later, so that the shell hands them
/// back ([`Input::UpdatesHeld`]) rather than queueing them past three quarters of a
/// framework's outbox: agents' updates (pending until acknowledged) and the master's STAGING
/// ("sent to agent": made again from the task while it is still staging, skipped once the
/// agent's updates have superseded it).
pub fn paced(u: &StatusUpdate) -> bool {
    !u.reconciliation
        && match u.source {
            UpdateSource::Agent => true,
            UpdateSource::Master => u.state == TaskState::Staging,
        }
}

/// Held updates sent per framework per [`Master::work_backlog`] slice at most.
pub const UPDATE_SLICE: usize = 1024;

/// Messages other than agents' updates held for one framework at most (on top of its full
/// outbox): a framework with more is not reading at all and is closed.
pub const HELD_MESSAGES: usize = 16_384;

impl Master {
    /// Sends `update` (already `pending` on its task, or a task's STAGING) to its framework now, or holds it when the
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

    /// The framework `conn` is the current connection of, if any.
    fn framework_on(&self, conn: ConnId) -> Option<FrameworkId> {
        let Some(Peer::Framework {
            framework: Some(fw),
            ..
        }) = self.conns.get(&conn)
        else {
            return None;
        };
        (self.frameworks.get(fw).and_then(|f| f.conn) == Some(conn)).then_some(*fw)
    }

    /// True when a held key that is not a pending update stands for the task's STAGING (see
    /// [`paced`]): the task is still staging, nothing from its agent yet.
    fn still_staging(&self, task_id: TaskId, fw: FrameworkId) -> bool {
        self.tasks.get(&task_id).is_some_and(|t| {
            t.framework == fw && t.state == TaskState::Staging && t.pending.is_empty()
        })
    }

    /// What to send now for held key (`t`, `u`) of `fw`: the pending update, or a STAGING made
    /// again; `None` when acknowledged or superseded since.
    fn held_update(
        &mut self,
        t: TaskId,
        u: UpdateId,
        fw: FrameworkId,
        now: Millis,
    ) -> Option<StatusUpdate> {
        if let Some(update) = self.pending_update(t, u) {
            return Some(update.clone());
        }
        if !self.still_staging(t, fw) {
            return None;
        }
        let agent = self.tasks.get(&t).map(|r| r.agent);
        Some(self.new_update(
            t,
            fw,
            agent,
            TaskState::Staging,
            "sent to agent".into(),
            now,
        ))
    }

    /// The shell could not queue these agents' updates to `conn` (its outbox was full): held,
    /// in order, those still pending on the connection's framework's tasks. One no longer
    /// pending was acknowledged or superseded (a master-made terminal update, which went out
    /// itself): nothing to send.
    pub(super) fn updates_held(&mut self, conn: ConnId, updates: Vec<(TaskId, UpdateId)>) {
        let Some(fw) = self.framework_on(conn) else {
            return;
        };
        let ours: VecDeque<_> = updates
            .into_iter()
            .filter(|(t, u)| {
                self.pending_update(*t, *u)
                    .map_or_else(|| self.still_staging(*t, fw), |p| p.framework_id == fw)
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

    /// The shell could not queue these to `conn` (its outbox was full): the offers return
    /// to the pool, to be offered again (the framework never saw them); the messages are
    /// held after any already held, and the framework is closed past [`HELD_MESSAGES`].
    pub(super) fn undelivered(
        &mut self,
        conn: ConnId,
        offers: Vec<OfferId>,
        messages: Vec<MasterToFramework>,
        out: &mut Vec<Output>,
    ) {
        for id in offers {
            self.allocator.rescind(id);
            self.allocation_pending = true;
        }
        let Some(fw) = self.framework_on(conn) else {
            return;
        };
        let held = self.held.entry(fw).or_default();
        // A heartbeat that did not fit says nothing the next one will not.
        held.messages.extend(
            messages
                .into_iter()
                .filter(|m| !matches!(m, MasterToFramework::Heartbeat)),
        );
        if held.messages.len() > HELD_MESSAGES {
            let count =
                |f: fn(&MasterToFramework) -> bool| held.messages.iter().filter(|m| f(m)).count();
            tracing::warn!(
                framework = %fw,
                held = held.messages.len(),
                rescinds = count(|m| matches!(m, MasterToFramework::Rescind { .. })),
                updates = count(|m| matches!(m, MasterToFramework::Update(_))),
                errors = count(|m| matches!(m, MasterToFramework::Error { .. })),
                first = ?held.messages.iter().find_map(|m| match m {
                    MasterToFramework::Update(u) => Some((u.state, u.source, u.reconciliation, u.message.clone())),
                    _ => None,
                }),
                "framework is not reading its messages; closing it"
            );
            out.push(Output::Close {
                conn,
                reason: format!(
                    "not reading its messages: {HELD_MESSAGES} held on top of a full queue"
                ),
            });
        }
        if held.len() == 0 {
            self.held.remove(&fw);
        }
    }

    /// Pauses offers to every framework that is not keeping up with what it was sent
    /// (`backed_up(conn)`, or updates held for it here) and resumes the others: called by the
    /// shell before each allocation, so offers go to frameworks that can take them and a
    /// slow one does not pile offers it would read too late (and accept stale) on top of its
    /// backlog.
    pub fn pace_offers(&mut self, backed_up: impl Fn(ConnId) -> bool) {
        for (id, f) in &self.frameworks {
            let Some(conn) = f.conn else {
                continue;
            };
            let paused = backed_up(conn) || self.held.contains_key(id);
            if paused != self.allocator.paused(*id) {
                if paused {
                    tracing::debug!(framework = %id, "offers paused: the framework is behind");
                }
                self.allocator.set_paused(*id, paused);
                if !paused {
                    self.allocation_pending = true;
                }
            }
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
        let messages = self
            .held
            .remove(&fw)
            .map(|h| h.messages)
            .unwrap_or_default();
        if keys.is_empty() && messages.is_empty() {
            return;
        }
        let held = self.held.entry(fw).or_default();
        held.messages = messages;
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
        now: Millis,
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
                self.send_held(fw, conn, n, now, out);
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
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let mut sent = 0;
        while sent < n {
            let Some(m) = self.held.get_mut(&fw).and_then(|h| h.messages.pop_front()) else {
                break;
            };
            out.push(Output::ToFramework(conn, m));
            sent += 1;
        }
        while sent < n {
            let Some((t, u)) = self.held.get_mut(&fw).and_then(Held::pop) else {
                break;
            };
            // Acknowledged since (or superseded): nothing to send.
            if let Some(update) = self.held_update(t, u, fw, now) {
                out.push(Output::ToFramework(conn, MasterToFramework::Update(update)));
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
