//! The tasks an agent reports when it registers again: reconciled against what the master
//! knows (adopted after a master failover, within the agent's resources and for known
//! frameworks; killed otherwise), so a re-registering agent cannot make the master account a
//! task it never launched.

use super::*;

impl Master {
    /// Brings the master's view of an agent's tasks in line with what the agent reports.
    ///
    /// A task the master does not know is adopted only when `adopt` (this master never knew
    /// the agent's tasks: it came back after a master failover), only for a framework the
    /// master knows, and only while the adopted tasks fit in the agent's registered resources;
    /// anything else is killed and not accounted. A live agent that re-registers cannot make
    /// the master account a task it never launched (docs/security.md, "Phantom tasks").
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reconcile_agent_tasks(
        &mut self,
        id: AgentId,
        conn: ConnId,
        running: &[RunningTask],
        pending: &[StatusUpdate],
        adopt: bool,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        // What adopted tasks may hold in all: the agent's registered resources.
        let mut room = self
            .agents
            .get(&id)
            .map(|a| {
                let mut all = a.resources.clone();
                for r in a.reserved.values() {
                    all.add_assign(r);
                }
                all
            })
            .unwrap_or_default();
        let reported: HashSet<TaskId> = running
            .iter()
            .map(|r| r.task.task_id)
            .chain(pending.iter().map(|u| u.task_id))
            .collect();
        for rt in running {
            let tid = rt.task.task_id;
            match self.tasks.get(&tid) {
                Some(t) if t.agent == id => {}
                Some(_) => {
                    // Known on another agent: should not happen; kill the stray copy.
                    out.push(Output::ToAgent(
                        conn,
                        MasterToAgent::KillTask {
                            framework_id: rt.framework_id,
                            task_id: tid,
                        },
                    ));
                }
                None => {
                    let fits = rt.state.is_terminal() || room.contains(&rt.task.resources);
                    if !adopt || !fits || !self.frameworks.contains_key(&rt.framework_id) {
                        // Not this master's to vouch for: a live or returning agent reporting a
                        // task the master never launched (or no longer keeps), a task over the
                        // agent's registered resources, or one whose framework is gone.
                        if !adopt || !fits {
                            tracing::warn!(agent = %id, task = %tid, framework = %rt.framework_id,
                                adopt, fits, "agent reports a task the master does not know; killing it");
                        }
                        out.push(Output::ToAgent(
                            conn,
                            MasterToAgent::KillTask {
                                framework_id: rt.framework_id,
                                task_id: tid,
                            },
                        ));
                        continue;
                    }
                    let allocation = OfferResources {
                        unreserved: rt.task.resources.clone(),
                        reserved: BTreeMap::new(),
                    };
                    let role = self
                        .frameworks
                        .get(&rt.framework_id)
                        .and_then(|f| f.roles.first().cloned())
                        .unwrap_or_default();
                    // A task that already ended (its terminal update is still unacknowledged)
                    // holds nothing.
                    let ended = rt.state.is_terminal();
                    if !ended {
                        room = room.saturating_sub(&rt.task.resources);
                        if let Err(e) =
                            self.allocator
                                .add_allocation(rt.framework_id, id, &role, &allocation)
                        {
                            tracing::warn!(task = %tid, "adopted task's resources not charged: {e}");
                        }
                    }
                    self.tasks.insert(
                        tid,
                        TaskRec {
                            info: rt.task.clone(),
                            framework: rt.framework_id,
                            agent: id,
                            state: rt.state,
                            allocation,
                            recovered: ended,
                            pending: VecDeque::new(),
                            acked: HashSet::new(),
                            last_message: "adopted from re-registering agent".into(),
                            usage: None,
                            role: role.clone(),
                            gpus: rt.gpus.clone(),
                            ports: super::kept_ports(&rt.task, &rt.ports),
                            reason: None,
                            exit_code: None,
                            signal: None,
                            staged_at: now,
                            started_at: (rt.state == TaskState::Running).then_some(now),
                            ended_at: ended.then_some(now),
                            kill_reason: None,
                        },
                    );
                    if let Some(f) = self.frameworks.get_mut(&rt.framework_id) {
                        f.tasks.insert(tid);
                    }
                    if let Some(a) = self.agents.get_mut(&id) {
                        a.tasks.insert(tid);
                    }
                }
            }
        }
        // Tasks the master placed on this agent that the agent does not know: lost in flight.
        let missing: Vec<TaskId> = self
            .agents
            .get(&id)
            .map(|a| {
                a.tasks
                    .iter()
                    .filter(|t| !reported.contains(t))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        for tid in missing {
            let non_terminal = self
                .tasks
                .get(&tid)
                .is_some_and(|t| !t.state.is_terminal() && t.pending.is_empty());
            if non_terminal {
                self.master_update(
                    tid,
                    TaskState::Lost,
                    TaskReason::AgentLost,
                    "task unknown to the agent after it re-registered",
                    now,
                    out,
                );
            }
        }
        // Re-send kills and queued updates for this agent's tasks.
        let kills: Vec<(FrameworkId, TaskId)> = self
            .tasks
            .iter()
            .filter(|(_, t)| {
                t.agent == id
                    && !t.state.is_terminal()
                    && !self.frameworks.contains_key(&t.framework)
            })
            .map(|(tid, t)| (t.framework, *tid))
            .collect();
        for (fw, tid) in kills {
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
