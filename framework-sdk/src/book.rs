//! [`TaskBook`]: what a framework knows about its tasks, kept from launches and status updates.
//!
//! Every scheduler ends up writing this table: which tasks it launched, where, in which state,
//! and which are still alive. The book is pure (no I/O, no clock: times are arguments) and
//! idempotent: a redelivered or reconciliation update that does not change a task's state
//! reports no transition, so schedulers can react to [`TaskBook::update`]'s answer alone.
//!
//! ```
//! use gantry_sdk::book::TaskBook;
//! use gantry_sdk::protocol::*;
//! let mut book = TaskBook::new();
//! let task = TaskId::random();
//! let agent = AgentId::random();
//! book.launched(task, "web/0", agent, 0);
//! assert_eq!(book.state(task), Some(TaskState::Staging));
//! assert_eq!(book.active_on(agent), vec![task]);
//! ```

use std::collections::{BTreeMap, HashMap};

use crate::protocol::{AgentId, StatusUpdate, TaskId, TaskReason, TaskState};

/// One task as the book knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEntry {
    /// The task's id.
    pub id: TaskId,
    /// The name it was launched with.
    pub name: String,
    /// The agent it was launched on (updated from status updates).
    pub agent: Option<AgentId>,
    /// Its latest known state.
    pub state: TaskState,
    /// Why it is in that state, when the update said.
    pub reason: Option<TaskReason>,
    /// The latest update's message.
    pub message: String,
    /// When it was launched (the caller's clock, e.g. milliseconds since start).
    pub launched_at: u64,
    /// When it last changed state (the caller's clock).
    pub changed_at: u64,
    /// The host ports its agent gave it (for a `ports:K` task; from its status updates, the
    /// first of which is `PORT`).
    pub ports: Vec<u16>,
}

/// A state change reported by [`TaskBook::update`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The task.
    pub task: TaskId,
    /// The state before (`None`: a task the book did not know, e.g. found by reconciliation).
    pub from: Option<TaskState>,
    /// The state now.
    pub to: TaskState,
}

impl Transition {
    /// True when the task just ended.
    pub fn ended(&self) -> bool {
        self.to.is_terminal() && !self.from.is_some_and(TaskState::is_terminal)
    }
}

/// The framework's table of tasks. See the module docs.
#[derive(Debug, Default, Clone)]
pub struct TaskBook {
    tasks: HashMap<TaskId, TaskEntry>,
}

impl TaskBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a task just launched on `agent` (state `STAGING`) at time `now`.
    pub fn launched(&mut self, id: TaskId, name: impl Into<String>, agent: AgentId, now: u64) {
        self.tasks.insert(
            id,
            TaskEntry {
                id,
                name: name.into(),
                agent: Some(agent),
                state: TaskState::Staging,
                reason: None,
                message: String::new(),
                launched_at: now,
                changed_at: now,
                ports: Vec::new(),
            },
        );
    }

    /// Applies a status update at time `now`; the transition when the state changed. A task
    /// already terminal never goes back (a late `RUNNING` after `KILLED` is ignored); an update
    /// for an unknown task adds it (reconciliation after a restart of the scheduler).
    pub fn update(&mut self, u: &StatusUpdate, now: u64) -> Option<Transition> {
        match self.tasks.get_mut(&u.task_id) {
            Some(e) => {
                if !u.ports.is_empty() {
                    e.ports = u.ports.clone();
                }
                if e.state.is_terminal() || e.state == u.state {
                    return None;
                }
                let from = e.state;
                e.state = u.state;
                e.reason = u.reason;
                e.message = u.message.clone();
                e.changed_at = now;
                if u.agent_id.is_some() {
                    e.agent = u.agent_id;
                }
                Some(Transition {
                    task: u.task_id,
                    from: Some(from),
                    to: u.state,
                })
            }
            None => {
                self.tasks.insert(
                    u.task_id,
                    TaskEntry {
                        id: u.task_id,
                        name: String::new(),
                        agent: u.agent_id,
                        state: u.state,
                        reason: u.reason,
                        message: u.message.clone(),
                        launched_at: now,
                        changed_at: now,
                        ports: u.ports.clone(),
                    },
                );
                Some(Transition {
                    task: u.task_id,
                    from: None,
                    to: u.state,
                })
            }
        }
    }

    /// The task's entry.
    pub fn get(&self, id: TaskId) -> Option<&TaskEntry> {
        self.tasks.get(&id)
    }

    /// The task's latest state.
    pub fn state(&self, id: TaskId) -> Option<TaskState> {
        self.tasks.get(&id).map(|e| e.state)
    }

    /// Every task, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &TaskEntry> {
        self.tasks.values()
    }

    /// Tasks not yet terminal, sorted by id (what to reconcile explicitly).
    pub fn active(&self) -> Vec<TaskId> {
        let mut v: Vec<TaskId> = self
            .tasks
            .values()
            .filter(|e| !e.state.is_terminal())
            .map(|e| e.id)
            .collect();
        v.sort();
        v
    }

    /// Tasks not yet terminal on `agent`, sorted by id (e.g. the tasks a drain notice concerns).
    pub fn active_on(&self, agent: AgentId) -> Vec<TaskId> {
        let mut v: Vec<TaskId> = self
            .tasks
            .values()
            .filter(|e| !e.state.is_terminal() && e.agent == Some(agent))
            .map(|e| e.id)
            .collect();
        v.sort();
        v
    }

    /// How many tasks are in each state.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for e in self.tasks.values() {
            *m.entry(e.state.as_str()).or_default() += 1;
        }
        m
    }

    /// Forgets terminal tasks that changed before `before`; how many were forgotten.
    pub fn forget_ended(&mut self, before: u64) -> usize {
        let n = self.tasks.len();
        self.tasks
            .retain(|_, e| !(e.state.is_terminal() && e.changed_at < before));
        n - self.tasks.len()
    }

    /// Number of tasks in the book.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True when the book holds no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::FrameworkId;

    fn update(task: TaskId, state: TaskState) -> StatusUpdate {
        StatusUpdate::new(task, FrameworkId::random(), state)
    }

    #[test]
    fn transitions_are_reported_once_and_terminal_states_stick() {
        let mut b = TaskBook::new();
        let (t, a) = (TaskId::random(), AgentId::random());
        b.launched(t, "x", a, 1);
        let tr = b.update(&update(t, TaskState::Running), 2).unwrap();
        assert_eq!(tr.from, Some(TaskState::Staging));
        assert!(!tr.ended());
        assert_eq!(b.update(&update(t, TaskState::Running), 3), None);
        let tr = b.update(&update(t, TaskState::Killed), 4).unwrap();
        assert!(tr.ended());
        assert_eq!(b.update(&update(t, TaskState::Running), 5), None);
        assert_eq!(b.state(t), Some(TaskState::Killed));
        assert!(b.active().is_empty());
        assert_eq!(b.counts().get("KILLED"), Some(&1));
        assert_eq!(b.forget_ended(4), 0);
        assert_eq!(b.forget_ended(5), 1);
        assert!(b.is_empty());
    }

    #[test]
    fn unknown_tasks_are_added_and_active_tasks_are_found_per_agent() {
        let mut b = TaskBook::new();
        let (t1, t2, a) = (TaskId::random(), TaskId::random(), AgentId::random());
        b.launched(t1, "a", a, 0);
        let mut u = update(t2, TaskState::Running);
        u.agent_id = Some(a);
        assert_eq!(b.update(&u, 1).unwrap().from, None);
        let mut want = vec![t1, t2];
        want.sort();
        assert_eq!(b.active_on(a), want);
        assert!(b.active_on(AgentId::random()).is_empty());
        assert_eq!(b.len(), 2);
    }
    #[test]
    fn ports_come_from_updates_and_stay() {
        let mut b = TaskBook::new();
        let (t, a) = (TaskId::random(), AgentId::random());
        b.launched(t, "web/0", a, 0);
        let mut u = update(t, TaskState::Running);
        u.ports = vec![31000, 31001];
        b.update(&u, 1);
        assert_eq!(b.get(t).unwrap().ports, vec![31000, 31001]);
        // A later update without ports (a master-made one) leaves them.
        b.update(&update(t, TaskState::Finished), 2);
        assert_eq!(b.get(t).unwrap().ports, vec![31000, 31001]);
    }
}
