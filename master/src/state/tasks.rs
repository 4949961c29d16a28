//! Task lifecycle: releasing a terminal task's resources, moving acknowledged terminal tasks
//! to the bounded completed history, and the status updates the master makes itself.

use super::*;

impl Master {
    /// Returns a terminal task's resources to the allocator once.
    pub(super) fn release_task_resources(&mut self, tid: TaskId) {
        let Some(task) = self.tasks.get_mut(&tid) else {
            return;
        };
        if task.recovered {
            return;
        }
        task.recovered = true;
        let (fw, agent, alloc) = (task.framework, task.agent, task.allocation.clone());
        if self.frameworks.contains_key(&fw) && self.agents.contains_key(&agent) {
            self.allocator.recover(fw, agent, &alloc);
            self.allocation_pending = true;
        }
    }

    /// Moves a terminal, acknowledged task to the completed list.
    pub(super) fn finish_task_if_done(&mut self, tid: TaskId) {
        let done = self
            .tasks
            .get(&tid)
            .is_some_and(|t| t.state.is_terminal() && t.pending.is_empty());
        let fw_gone = self
            .tasks
            .get(&tid)
            .is_some_and(|t| !self.frameworks.contains_key(&t.framework));
        if !(done || fw_gone && self.tasks.get(&tid).is_some_and(|t| t.state.is_terminal())) {
            return;
        }
        let Some(task) = self.tasks.remove(&tid) else {
            return;
        };
        if let Some(a) = self.agents.get_mut(&task.agent) {
            a.tasks.remove(&tid);
        }
        if let Some(f) = self.frameworks.get_mut(&task.framework) {
            f.tasks.remove(&tid);
        }
        *self.tasks_completed.entry(task.state.as_str()).or_default() += 1;
        self.remember_completed(task.record());
    }

    /// Adds a completed task to its framework's history, dropping the oldest past the bound.
    /// A framework that is neither active nor among the completed ones keeps no history.
    pub(super) fn remember_completed(&mut self, record: TaskRecord) {
        let fw = record.framework;
        let known = self.frameworks.contains_key(&fw)
            || self.completed_frameworks.iter().any(|f| f.id == fw);
        let max = self.config.max_completed_tasks_per_framework;
        if !known || max == 0 {
            return;
        }
        *self.completed_count.entry(record.id).or_default() += 1;
        let list = self.completed.entry(fw).or_default();
        list.push_back(record);
        let mut dropped = Vec::new();
        while list.len() > max {
            if let Some(old) = list.pop_front() {
                dropped.push(old.id);
            }
        }
        self.forget_completed(dropped);
    }

    /// Keeps a task the master refused (`ERROR`) or dropped (`DROPPED`) in its framework's
    /// history with the reason and message, so that operators see it (`/state`, the API): it
    /// never reached an agent (`agent`: the offers' agent, when they named a known one).
    pub(super) fn remember_refused(
        &mut self,
        fw: FrameworkId,
        (agent, role): (Option<AgentId>, &str),
        task: &TaskInfo,
        (state, reason): (TaskState, TaskReason),
        message: &str,
        now: Millis,
    ) {
        self.emit(ClusterEvent::TaskUpdated {
            task_id: task.task_id.to_string(),
            name: task.name.clone(),
            framework_id: fw.to_string(),
            agent_id: agent.map(|a| a.to_string()).unwrap_or_default(),
            state: state.as_str().to_string(),
            reason: Some(reason.as_str().to_string()),
            message: super::kept_message(message),
            role: role.to_string(),
            user: task.command.user.clone(),
            resources: task.resources.clone(),
        });
        self.remember_completed(TaskRecord {
            id: task.task_id,
            name: task.name.clone(),
            framework: fw,
            agent: agent.unwrap_or(NO_AGENT),
            role: role.to_string(),
            user: task.command.user.clone(),
            resources: task.resources.clone(),
            gpus: Vec::new(),
            ports: Vec::new(),
            state,
            reason: Some(reason),
            message: super::kept_message(message),
            exit_code: None,
            signal: None,
            staged_at: now,
            started_at: None,
            ended_at: Some(now),
        });
    }

    /// Uncounts completed records that were dropped.
    pub(super) fn forget_completed(&mut self, ids: impl IntoIterator<Item = TaskId>) {
        for id in ids {
            if let Some(n) = self.completed_count.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    self.completed_count.remove(&id);
                }
            }
        }
    }

    /// The completed record of `tid` in `fw`'s history, if kept (a map look-up for ids that
    /// were never completed, so a reconcile of many unknown ids stays cheap).
    pub(crate) fn completed_task(&self, fw: FrameworkId, tid: TaskId) -> Option<&TaskRecord> {
        if !self.completed_count.contains_key(&tid) {
            return None;
        }
        self.completed.get(&fw)?.iter().rev().find(|c| c.id == tid)
    }

    /// A status update made by the master itself (LOST, ERROR, KILLED of a task no agent runs).
    pub(super) fn master_update(
        &mut self,
        tid: TaskId,
        state: TaskState,
        reason: TaskReason,
        message: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(task) = self.tasks.get(&tid) else {
            return;
        };
        let (fw, agent) = (task.framework, task.agent);
        let mut update = self.new_update(tid, fw, Some(agent), state, message.to_string(), now);
        update.reason = Some(reason);
        let Some(task) = self.tasks.get_mut(&tid) else {
            return;
        };
        task.state = state;
        task.note(state, &update, now);
        let Some(task) = self.tasks.get_mut(&tid) else {
            return;
        };
        if state.is_terminal() {
            task.pending.clear();
            self.release_task_resources(tid);
        }
        self.emit_task(tid);
        if let Some(conn) = self.frameworks.get(&fw).and_then(|f| f.conn) {
            out.push(Output::ToFramework(conn, MasterToFramework::Update(update)));
        }
        if state.is_terminal() {
            self.finish_task_if_done(tid);
        }
    }

    /// A status update made by the master (not relayed from an agent).
    pub(super) fn new_update(
        &mut self,
        task_id: TaskId,
        framework_id: FrameworkId,
        agent_id: Option<AgentId>,
        state: TaskState,
        message: String,
        now: Millis,
    ) -> StatusUpdate {
        StatusUpdate {
            update_id: UpdateId::from_u128(self.next_id()),
            task_id,
            framework_id,
            agent_id,
            state,
            source: UpdateSource::Master,
            reason: None,
            message,
            exit_code: None,
            signal: None,
            gpus: Vec::new(),
            timestamp_ms: now,
            reconciliation: false,
            ports: Vec::new(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn error_update(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        task: &TaskInfo,
        (agent, role): (Option<AgentId>, &str),
        kind: ErrorKind,
        reason: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        out.push(err(conn, kind, reason.to_string()));
        self.refused(
            conn,
            fw,
            (agent, role),
            task,
            (TaskState::Error, TaskReason::InvalidTask),
            reason,
            now,
            out,
        );
    }

    /// A task the master refused before it ran (`ERROR` or `DROPPED`): its update to the
    /// framework, and its record kept for operators.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn refused(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        (agent, role): (Option<AgentId>, &str),
        task: &TaskInfo,
        (state, reason): (TaskState, TaskReason),
        message: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let mut update = self.new_update(task.task_id, fw, None, state, message.to_string(), now);
        update.reason = Some(reason);
        out.push(Output::ToFramework(conn, MasterToFramework::Update(update)));
        self.remember_refused(fw, (agent, role), task, (state, reason), message, now);
    }
}

impl Master {
    /// TASK_DROPPED for every task an invalid accept carried (Mesos `REASON_INVALID_OFFERS`):
    /// nothing of them ran, the framework launches them again on later offers. A task whose id
    /// belongs to a task the master knows gets an error instead: a DROPPED update would claim
    /// that task never ran.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn drop_tasks(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        (agent, role): (Option<AgentId>, &str),
        operations: &[Operation],
        message: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) -> usize {
        let mut dropped = 0;
        for op in operations {
            for task in op.tasks() {
                if self.tasks.contains_key(&task.task_id) {
                    out.push(err(
                        conn,
                        ErrorKind::InvalidTask,
                        format!("task id {} is already in use ({message})", task.task_id),
                    ));
                    continue;
                }
                self.refused(
                    conn,
                    fw,
                    (agent, role),
                    task,
                    (TaskState::Dropped, TaskReason::InvalidOffers),
                    message,
                    now,
                    out,
                );
                dropped += 1;
            }
        }
        dropped
    }
}
