//! Kills in the core: a kill request (SIGTERM to the task's process group, or the task ended
//! at once when it never started), the index of killed tasks ([`AgentCore::kill_deadline`]:
//! no scan of every task), escalation after the grace period (SIGKILL of the group, repeated,
//! then the cgroup), and a dead supervisor's task killed.

use gantry_proto::*;

use super::{AgentCore, Effect, ExitStatus};

/// How long after a cgroup-wide SIGKILL of a task it is repeated.
const ESCALATE_AGAIN_MS: u64 = 1000;

impl AgentCore {
    pub(super) fn kill(&mut self, framework_id: FrameworkId, task_id: TaskId, now: u64) {
        let Some(rec) = self.ckpt.tasks.get_mut(&task_id) else {
            // The master believes we run it, but we do not: say it is gone.
            tracing::warn!(task = %task_id, "kill for an unknown task");
            let mut update = self.make_update(
                task_id,
                framework_id,
                TaskState::Killed,
                "task unknown to the agent".into(),
                None,
                None,
                now,
            );
            update.reason = Some(TaskReason::KilledByRequest);
            self.push_update(update);
            self.flush_updates(now);
            return;
        };
        if rec.state.is_terminal() || rec.kill_requested_ms.is_some() {
            return;
        }
        rec.kill_requested_ms = Some(now);
        self.killing.insert(task_id);
        if let Some(l) = rec.launched {
            tracing::info!(task = %task_id, pgid = l.task_pgid, "killing task (SIGTERM)");
            self.emit(Effect::Signal {
                pgid: l.task_pgid,
                signal: libc::SIGTERM,
            });
        }
        self.dirty.insert(task_id);
    }

    /// Kills past their grace period: SIGKILL the process group (every
    /// [`super::KILL_REPEAT_MS`]), and every
    /// process in the task's cgroup (a process group can be left; a cgroup cannot) at most
    /// once a second.
    pub(super) fn escalate_kills(&mut self, now: u64) {
        let mut signals = Vec::new();
        let mut escalate = Vec::new();
        // (Ended and forgotten tasks leave the index here.)
        let tasks = &self.ckpt.tasks;
        self.killing
            .retain(|id| tasks.get(id).is_some_and(|r| !r.state.is_terminal()));
        for (id, rec) in self
            .killing
            .iter()
            .filter_map(|id| Some((id, tasks.get(id)?)))
        {
            let (Some(asked), Some(l)) = (rec.kill_requested_ms, rec.launched) else {
                continue;
            };
            let grace = rec
                .info
                .kill_grace_secs
                .map(|s| std::time::Duration::from_secs(s.into()))
                .unwrap_or(self.config.kill_grace);
            if !rec.state.is_terminal() && now.saturating_sub(asked) > grace.as_millis() as u64 {
                let again = self
                    .group_killed
                    .get(id)
                    // (A clock set back does not hold the kill up.)
                    .is_none_or(|t| now < *t || now - *t >= super::KILL_REPEAT_MS);
                if again {
                    signals.push((*id, l.task_pgid));
                }
                let recent = self
                    .escalated
                    .get(id)
                    .is_some_and(|t| now.saturating_sub(*t) < ESCALATE_AGAIN_MS);
                if !recent {
                    escalate.push(*id);
                }
            }
        }
        for (id, pgid) in signals {
            self.group_killed.insert(id, now);
            self.emit(Effect::Signal {
                pgid,
                signal: libc::SIGKILL,
            });
        }
        for id in escalate {
            self.escalated.insert(id, now);
            self.emit(Effect::KillCgroup(id));
        }
    }

    /// When [`AgentCore::escalate_kills`] has something to do next: a kill's grace period ends,
    /// or the next SIGKILL of a group already past it ([`super::KILL_REPEAT_MS`]).
    pub(super) fn kill_deadline(&self) -> Option<u64> {
        let tasks = &self.ckpt.tasks;
        let indexed = self
            .killing
            .iter()
            .filter_map(|id| Some((id, tasks.get(id)?)));
        self.kill_deadline_of(indexed)
    }

    /// [`AgentCore::kill_deadline`] by a scan of every task: what the index must agree with
    /// (property test `core/tests/time.rs`).
    #[cfg(test)]
    pub(super) fn kill_deadline_scan(&self) -> Option<u64> {
        self.kill_deadline_of(self.ckpt.tasks.iter())
    }

    fn kill_deadline_of<'a>(
        &self,
        tasks: impl Iterator<Item = (&'a TaskId, &'a super::TaskRecord)>,
    ) -> Option<u64> {
        tasks
            .filter(|(_, rec)| !rec.state.is_terminal() && rec.launched.is_some())
            .filter_map(|(id, rec)| {
                let asked = rec.kill_requested_ms?;
                let grace = rec
                    .info
                    .kill_grace_secs
                    .map(|s| std::time::Duration::from_secs(s.into()))
                    .unwrap_or(self.config.kill_grace);
                let grace_end = asked + grace.as_millis() as u64 + 1;
                Some(match self.group_killed.get(id) {
                    Some(t) => grace_end.max(t + super::KILL_REPEAT_MS),
                    None => grace_end,
                })
            })
            .min()
    }

    /// The supervisor of a task this agent launched died: the exit it recorded, if it made one;
    /// else the task, unsupervised now, is killed (no task runs without the agent knowing) and
    /// ends with an unknown status.
    pub(super) fn supervisor_lost(&mut self, task: TaskId, recorded: Option<ExitStatus>, now: u64) {
        let status = match recorded {
            Some(status) => status,
            None => {
                let pgid = self
                    .ckpt
                    .tasks
                    .get(&task)
                    .filter(|t| !t.state.is_terminal())
                    .and_then(|t| t.launched)
                    .map(|l| l.task_pgid);
                if let Some(pgid) = pgid {
                    tracing::warn!(%task, "the supervisor died: killing the task");
                    self.emit(Effect::Signal {
                        pgid,
                        signal: libc::SIGKILL,
                    });
                }
                ExitStatus {
                    code: None,
                    signal: None,
                }
            }
        };
        self.exited(task, status, None, now);
    }
}
