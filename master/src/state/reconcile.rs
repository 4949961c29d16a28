//! Explicit and implicit task reconciliation, answered in bounded slices
//! ([`RECONCILE_SLICE`]) round robin by [`Master::work_backlog`] as fast as each framework reads.

use super::*;

impl Master {
    /// True when reconciliation answers or held status updates (`pacing`) are waiting to be
    /// sent ([`Master::work_backlog`]).
    pub fn has_backlog(&self) -> bool {
        !self.reconciles.is_empty() || !self.held.is_empty()
    }

    /// Answers one slice (at most [`RECONCILE_SLICE`] ids) of the next reconciliation whose
    /// connection can take messages, and sends held status updates to frameworks whose
    /// outboxes have room (at most [`UPDATE_SLICE`] each): `room(conn)` says how many more
    /// messages a connection can queue. Returns false when nothing waiting could make progress
    /// (the shell retries at its next tick).
    pub fn work_backlog(
        &mut self,
        now: Millis,
        out: &mut Vec<Output>,
        room: impl Fn(ConnId) -> usize,
    ) -> bool {
        let answered = self.work_reconciles(now, out, &room);
        let sent = self.work_held(now, out, &room);
        answered || sent
    }

    fn work_reconciles(
        &mut self,
        now: Millis,
        out: &mut Vec<Output>,
        room: &impl Fn(ConnId) -> usize,
    ) -> bool {
        for _ in 0..self.reconciles.len() {
            let Some(mut job) = self.reconciles.pop_front() else {
                return false;
            };
            // A framework that went away (or reconnected elsewhere) gets no more answers.
            let live = self
                .frameworks
                .get(&job.framework)
                .is_some_and(|f| f.conn == Some(job.conn));
            if !live {
                continue;
            }
            let n = room(job.conn).min(RECONCILE_SLICE);
            if n == 0 {
                self.reconciles.push_back(job);
                continue;
            }
            self.reconcile_slice(&mut job, n, now, out);
            if job.next < job.ids.len() {
                self.reconciles.push_back(job);
            }
            return true;
        }
        false
    }

    pub(super) fn reconcile(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        task_ids: Vec<TaskId>,
        out: &mut Vec<Output>,
    ) {
        if task_ids.len() > MAX_RECONCILE_IDS {
            return out.push(err(
                conn,
                ErrorKind::InvalidRequest,
                format!(
                    "reconcile names {} task ids; at most {MAX_RECONCILE_IDS} per message",
                    task_ids.len()
                ),
            ));
        }
        let waiting: usize = self
            .reconciles
            .iter()
            .filter(|j| j.framework == fw)
            .map(|j| j.ids.len() - j.next)
            .sum();
        let ids: Vec<TaskId> = if task_ids.is_empty() {
            self.frameworks
                .get(&fw)
                .map(|f| f.tasks.iter().copied().collect())
                .unwrap_or_default()
        } else {
            task_ids
        };
        if waiting > 0 && waiting + ids.len() > MAX_PENDING_RECONCILE_IDS {
            return out.push(err(
                conn,
                ErrorKind::InvalidRequest,
                format!(
                    "{waiting} task ids of earlier reconciles are still being answered; \
                     at most {MAX_PENDING_RECONCILE_IDS} may wait: ask again later"
                ),
            ));
        }
        // Answered from the backlog, a slice at a time, as fast as the framework reads.
        if !ids.is_empty() {
            self.reconciles.push_back(Reconciling {
                conn,
                framework: fw,
                ids,
                next: 0,
            });
        }
    }

    /// Answers up to `n` more ids of `job`.
    pub(super) fn reconcile_slice(
        &mut self,
        job: &mut Reconciling,
        n: usize,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let (conn, fw) = (job.conn, job.framework);
        let end = (job.next + n).min(job.ids.len());
        for i in job.next..end {
            let tid = job.ids[i];
            let known = match self.tasks.get(&tid).filter(|t| t.framework == fw) {
                Some(t) => Some(t.record()),
                None => self.completed_task(fw, tid).cloned(),
            };
            let (state, agent, message, reason) = match &known {
                Some(r) => (r.state, Some(r.agent), r.message.clone(), r.reason),
                // After a failover, agents still re-registering may hold it: say nothing
                // yet (as Mesos does) rather than a LOST that may be wrong.
                None if self.awaited_agents() > 0 => continue,
                None => (
                    TaskState::Lost,
                    None,
                    "unknown task".to_string(),
                    Some(TaskReason::Unknown),
                ),
            };
            let mut update = self.new_update(tid, fw, agent, state, message, now);
            update.reason = reason;
            if let Some(r) = &known {
                update.exit_code = r.exit_code;
                update.signal = r.signal;
                update.gpus = r.gpus.clone();
                update.ports = r.ports.clone();
            }
            update.reconciliation = true;
            out.push(Output::ToFramework(conn, MasterToFramework::Update(update)));
        }
        job.next = end;
    }
}

/// Task ids answered per slice of a reconciliation (a few hundred microseconds of core time).
pub const RECONCILE_SLICE: usize = 1024;
/// Task ids one framework may have waiting for reconciliation answers; a reconcile past it is
/// refused (the framework asks again once answered).
pub const MAX_PENDING_RECONCILE_IDS: usize = 8 * MAX_RECONCILE_IDS;

/// A reconciliation with answers still to send.
#[derive(Debug)]
pub(super) struct Reconciling {
    conn: ConnId,
    framework: FrameworkId,
    ids: Vec<TaskId>,
    next: usize,
}
