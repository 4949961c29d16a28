//! Partitions (docs/ha.md, "Partitions"; Mesos 1.x partition awareness): an agent out of touch
//! past its re-register timeout becomes unreachable, its tasks `UNREACHABLE` (partition-aware
//! frameworks) or `LOST`; back in time it resumes them; past the unreachable timeout it is gone
//! and they are `GONE`. A terminal state is never rewritten.

use super::*;

impl Master {
    /// A running task whose agent went away, for a framework told `LOST`: its pending updates
    /// are replaced by `LOST` (reason `agent-lost`) and it is forgotten (into the history).
    pub(super) fn lose_task(
        &mut self,
        tid: TaskId,
        message: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if let Some(t) = self.tasks.get_mut(&tid) {
            t.pending.clear();
        }
        self.master_update(
            tid,
            TaskState::Lost,
            TaskReason::AgentLost,
            message,
            now,
            out,
        );
        self.finish_task_if_done(tid);
        self.tasks.remove(&tid);
    }

    /// An agent out of touch past its re-register timeout (docs/ha.md, "Partitions"; Mesos
    /// 1.x partition awareness): its resources leave the pool and its offers are rescinded;
    /// its running tasks become `UNREACHABLE` for partition-aware frameworks (kept, to resume
    /// if it comes back within the unreachable timeout) and `LOST` for the others; tasks that
    /// already ended keep their real terminal state. The agent stays in the registry, its id
    /// and name reserved for it, until it comes back or the unreachable timeout passes.
    pub(super) fn agent_unreachable(&mut self, id: AgentId, now: Millis, out: &mut Vec<Output>) {
        let Some(a) = self.agents.remove(&id) else {
            return;
        };
        self.agents_by_name.remove(&a.name);
        let timeout_s = self.config.agent_reregister_timeout_ms / 1000;
        let mut kept = HashSet::new();
        for tid in a.tasks.iter().copied() {
            let Some(t) = self.tasks.get_mut(&tid) else {
                continue;
            };
            t.recovered = true; // its resources leave with the agent
            if t.state.is_terminal() {
                // Ended before the agent went, its update not acknowledged yet: the real
                // terminal state stays and is delivered when the framework is back.
                if !t.pending.is_empty() {
                    kept.insert(tid);
                }
                self.finish_task_if_done(tid);
                continue;
            }
            let aware = self
                .frameworks
                .get(&t.framework)
                .is_some_and(|f| f.capabilities.contains(&Capability::PartitionAware));
            if aware {
                self.master_update(
                    tid,
                    TaskState::Unreachable,
                    TaskReason::AgentUnreachable,
                    &format!(
                        "agent {} unreachable: not back within {timeout_s} s; the task may \
                         still run",
                        a.name
                    ),
                    now,
                    out,
                );
                kept.insert(tid);
            } else {
                let why = format!(
                    "agent lost: {} did not re-register within {timeout_s} s",
                    a.name
                );
                self.lose_task(tid, &why, now, out);
            }
        }
        for rec in self.allocator.remove_agent(id) {
            self.send_rescind(&rec, out);
        }
        for role in a.reserved.keys() {
            self.forget_role(role);
        }
        if let Some(c) = a.conn {
            self.conns.remove(&c);
            out.push(Output::Close {
                conn: c,
                reason: "agent unreachable".into(),
            });
        }
        tracing::warn!(agent = %a.name, tasks = kept.len(),
            "agent unreachable: did not re-register in time; expected back within the unreachable timeout");
        self.emit(ClusterEvent::AgentRemoved {
            agent_id: id.to_string(),
            name: a.name.clone(),
            reason: "unreachable: did not re-register in time".to_string(),
        });
        let record = AgentRecord {
            id,
            name: a.name.clone(),
            hostname: a.hostname.clone(),
            deactivated: !a.active,
        };
        self.recovered_by_name.insert(a.name.clone(), id);
        self.recovered_agents.insert(
            id,
            RecoveredAgent {
                record,
                dynamic: a.dynamic,
                deadline: now.saturating_add(self.config.agent_unreachable_timeout_ms),
                unreachable: Some(Unreachable {
                    since: now,
                    tasks: kept,
                    kills: HashSet::new(),
                }),
                adopt: false,
            },
        );
        self.agent_timers_changed();
        self.allocation_pending = true;
    }

    /// An unreachable agent that will not come back (its unreachable timeout passed, a new
    /// incarnation took its name, or an operator marked it gone): its `UNREACHABLE` tasks are
    /// `GONE`, and it leaves the registry.
    pub(super) fn agent_gone(
        &mut self,
        id: AgentId,
        reason: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(rec) = self.recovered_agents.remove(&id) else {
            return;
        };
        if self.recovered_by_name.get(&rec.record.name) == Some(&id) {
            self.recovered_by_name.remove(&rec.record.name);
        }
        for tid in rec.unreachable.map(|u| u.tasks).unwrap_or_default() {
            let unreachable = self
                .tasks
                .get(&tid)
                .is_some_and(|t| t.state == TaskState::Unreachable);
            if unreachable {
                self.master_update(
                    tid,
                    TaskState::Gone,
                    TaskReason::AgentUnreachable,
                    &format!("agent {} gone: {reason}", rec.record.name),
                    now,
                    out,
                );
            }
            self.finish_task_if_done(tid);
        }
        tracing::warn!(agent = %rec.record.name, reason, "agent gone");
        self.send_agent_removed(id, &rec.record.name, reason, out);
        for role in rec.dynamic.keys() {
            out.push(Output::Persist(Mutation::RemoveReservation {
                agent_id: id,
                role: role.clone(),
            }));
        }
        out.push(Output::Persist(Mutation::RemoveAgent(id)));
        self.forget_drain(id, out);
        self.agent_timers_changed();
    }

    /// The tasks of an unreachable agent that came back: those it still runs are charged
    /// again and resume their real state (the framework is told); kills asked for while it was
    /// away are sent. Terminal states reached while away arrive as the agent's own updates.
    pub(super) fn resume_tasks(
        &mut self,
        id: AgentId,
        conn: ConnId,
        away: Unreachable,
        running: &[RunningTask],
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if let Some(a) = self.agents.get_mut(&id) {
            a.tasks.extend(away.tasks.iter().copied());
        }
        for rt in running {
            let tid = rt.task.task_id;
            let Some(t) = self.tasks.get_mut(&tid) else {
                continue;
            };
            if t.agent != id || t.state != TaskState::Unreachable || rt.state.is_terminal() {
                continue;
            }
            let (fw, role, allocation) = (t.framework, t.role.clone(), t.allocation.clone());
            if let Err(e) = self.allocator.add_allocation(fw, id, &role, &allocation) {
                tracing::warn!(task = %tid, "resumed task's resources not charged: {e}");
            } else if let Some(t) = self.tasks.get_mut(&tid) {
                t.recovered = false;
            }
            let name = self
                .agents
                .get(&id)
                .map(|a| a.name.clone())
                .unwrap_or_default();
            let mut update = self.new_update(
                tid,
                fw,
                Some(id),
                rt.state,
                format!("agent {name} is back: the task resumes"),
                now,
            );
            update.gpus = rt.gpus.clone();
            if let Some(t) = self.tasks.get_mut(&tid) {
                t.state = rt.state;
                t.note(rt.state, &update, now);
            }
            self.emit_task(tid);
            if let Some(fconn) = self.frameworks.get(&fw).and_then(|f| f.conn) {
                out.push(Output::ToFramework(
                    fconn,
                    MasterToFramework::Update(update),
                ));
            }
            if away.kills.contains(&tid) {
                out.push(Output::ToAgent(
                    conn,
                    MasterToAgent::KillTask {
                        framework_id: fw,
                        task_id: tid,
                    },
                ));
            }
        }
    }
}
