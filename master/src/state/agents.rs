//! Agents: registration and re-registration (identity by certificate name plus checkpointed
//! id), status updates and GPU health from agents, disconnection and removal (tasks `LOST`).
//! The tasks a re-registering agent reports are reconciled in `agent_tasks`; agents out of
//! touch are `partitions`.

use super::*;

impl Master {
    pub(super) fn agent_message(
        &mut self,
        conn: ConnId,
        msg: AgentToMaster,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        // Only the id is copied per message; the name and address only for a registration.
        let agent = match self.conns.get(&conn) {
            Some(Peer::Agent { agent, .. }) => *agent,
            _ => {
                out.push(Output::Close {
                    conn,
                    reason: "agent message on a connection that is not an agent's".into(),
                });
                return;
            }
        };
        // Liveness counts every message from a registered agent, not only heartbeats: an agent
        // busy sending status updates, or whose heartbeat waits behind them in a busy master's
        // queue, is alive.
        if let Some(a) = agent.and_then(|id| self.agents.get_mut(&id)) {
            a.last_seen = now;
        }
        match (msg, agent) {
            (
                AgentToMaster::Register {
                    agent_id,
                    hostname,
                    resources,
                    reserved,
                    attributes,
                    gpus,
                    running_tasks,
                    pending_updates,
                    task_user,
                },
                None,
            ) => {
                let Some(Peer::Agent { name, address, .. }) = self.conns.get(&conn).cloned() else {
                    return;
                };
                if let Err(e) = run_as::check_agent_default(&task_user) {
                    let message = e.to_string();
                    out.push(Output::ToAgent(
                        conn,
                        MasterToAgent::Error {
                            message: message.clone(),
                        },
                    ));
                    out.push(Output::Close {
                        conn,
                        reason: message,
                    });
                    return;
                }
                self.register_agent(
                    conn,
                    name,
                    address,
                    agent_id,
                    hostname,
                    resources,
                    reserved,
                    attributes,
                    gpus,
                    running_tasks,
                    pending_updates,
                    now,
                    out,
                );
                if let Some(Peer::Agent {
                    agent: Some(id), ..
                }) = self.conns.get(&conn)
                {
                    if let Some(a) = self.agents.get_mut(id) {
                        a.task_user = task_user;
                    }
                }
            }
            (AgentToMaster::Register { .. }, Some(_)) => {
                out.push(Output::Close {
                    conn,
                    reason: "agent registered twice on one connection".into(),
                });
            }
            (_, None) => out.push(Output::Close {
                conn,
                reason: "agent sent a message before registering".into(),
            }),
            // Seen above.
            (AgentToMaster::Heartbeat, Some(_)) => {}
            (AgentToMaster::StatusUpdate(update), Some(id)) => {
                self.agent_update(conn, id, update, now, out)
            }
            (AgentToMaster::Usage { tasks, gpus }, Some(id)) => {
                if let Some(a) = self.agents.get_mut(&id) {
                    a.gpu_samples = gpus;
                }
                for (task_id, usage) in tasks {
                    if let Some(t) = self.tasks.get_mut(&task_id) {
                        if t.agent == id {
                            t.usage = Some(usage);
                        }
                    }
                }
            }
            (
                AgentToMaster::GpuHealth {
                    uuid,
                    healthy,
                    reason,
                },
                Some(id),
            ) => self.gpu_health(id, &uuid, healthy, &reason, out),
            (AgentToMaster::TerminationNotice { in_ms, reason }, Some(id)) => {
                self.termination_notice(id, in_ms, reason, now, out)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn register_agent(
        &mut self,
        conn: ConnId,
        name: String,
        address: String,
        claimed_id: Option<AgentId>,
        hostname: String,
        resources: Resources,
        reserved: BTreeMap<String, Resources>,
        attributes: Attributes,
        gpus: Vec<GpuInfo>,
        running: Vec<RunningTask>,
        pending_updates: Vec<StatusUpdate>,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if let Some(e) = reserved
            .keys()
            .find_map(|r| self.config.limits.check_role(r).err())
        {
            return self.refuse_agent(conn, format!("reservations: {e}"), out);
        }
        if let Err(e) = register_limits::check(&hostname, &attributes, &gpus, &reserved) {
            return self.refuse_agent(conn, format!("registration refused: {e}"), out);
        }
        if let Some(message) = self.gone_refusal(claimed_id) {
            return self.refuse_agent(conn, message, out);
        }
        // Who this is: its certificate name plus the id it checkpointed. An id belongs to one
        // name; a name to one live agent (see docs/security.md).
        let claim = match claimed_id {
            Some(c) => match (self.agents.get(&c), self.recovered_agents.get(&c)) {
                (Some(a), _) if a.name == name => Claim::Live(c),
                (Some(a), _) => {
                    let owner = a.name.clone();
                    return self.refuse_agent(
                        conn,
                        format!(
                            "agent id {c} belongs to agent {owner:?}; agent {name:?} (at \
                             {address}) may not claim it"
                        ),
                        out,
                    );
                }
                (None, Some(RecoveredAgent { record: rec, .. })) if rec.name == name => {
                    Claim::Recovered(c)
                }
                (None, Some(RecoveredAgent { record: rec, .. })) => {
                    let owner = rec.name.clone();
                    return self.refuse_agent(
                        conn,
                        format!(
                            "agent id {c} belongs to agent {owner:?} (expected back after a \
                             failover); agent {name:?} (at {address}) may not claim it"
                        ),
                        out,
                    );
                }
                (None, None) => {
                    // Not an id this master (or its registry) vouches for: removed after the
                    // re-register timeout, or never issued. The agent joins as a new agent and
                    // the tasks it reports are killed (their frameworks were told they are LOST).
                    tracing::warn!(agent = %name, %address, claimed = %c,
                        "agent claims an unknown id; registering it as a new agent");
                    Claim::New
                }
            },
            None => Claim::New,
        };
        // A second agent under a name in use (by a live agent, or one expected back after a
        // failover) is refused: only one that has been gone for the re-register timeout (and so
        // was removed) may be replaced by a new incarnation.
        if matches!(claim, Claim::New) {
            // A new incarnation under the name of an unreachable agent (its work directory
            // lost, say): the old one will not come back, so its tasks are gone.
            let old = self.recovered_by_name.get(&name).copied();
            if let Some(old) = old.filter(|o| {
                self.recovered_agents
                    .get(o)
                    .is_some_and(|r| r.unreachable.is_some())
            }) {
                self.agent_gone(
                    old,
                    "a new incarnation of the agent registered under its name",
                    now,
                    out,
                );
            }
        }
        let holder = self.agents_by_name.get(&name).copied().or_else(|| {
            matches!(claim, Claim::New)
                .then(|| self.recovered_by_name.get(&name).copied())
                .flatten()
        });
        if let Some(other) = holder.filter(|o| Some(*o) != claimed_id) {
            let state = match self.agents.get(&other) {
                Some(a) => match (a.conn, a.disconnected_at) {
                    (Some(_), _) => format!("connected from {}", a.address),
                    (None, Some(t)) => format!(
                        "last at {}, disconnected {} s ago",
                        a.address,
                        now.saturating_sub(t) / 1000
                    ),
                    (None, None) => format!("last at {}", a.address),
                },
                None => "expected back after a master failover".to_string(),
            };
            let message = format!(
                "agent name {name:?} is in use by another agent (id {other}, {state}); this agent \
                 at {address} claims {}. Give each agent its own --name; a new incarnation is \
                 admitted only once the old one has been gone for the re-register timeout ({} s)",
                claimed_id.map_or("no id".to_string(), |c| format!("id {c}")),
                self.config.agent_reregister_timeout_ms / 1000
            );
            return self.refuse_agent(conn, message, out);
        }
        // Dynamic reservations this agent had (before an agent restart or a master failover),
        // and its registry record if this master recovered it from the registry.
        let mut recovered: Option<AgentRecord> = None;
        let mut unreachable: Option<Unreachable> = None;
        let mut adopt = false;
        let dynamic = match claim {
            Claim::Live(c) => self
                .agents
                .get(&c)
                .map(|a| a.dynamic.clone())
                .unwrap_or_default(),
            Claim::Recovered(c) => match self.recovered_agents.remove(&c) {
                Some(RecoveredAgent {
                    record: rec,
                    dynamic: d,
                    unreachable: u,
                    adopt: a,
                    ..
                }) => {
                    self.recovered_by_name.remove(&rec.name);
                    recovered = Some(rec);
                    unreachable = u;
                    adopt = a;
                    d
                }
                None => BTreeMap::new(),
            },
            Claim::New => BTreeMap::new(),
        };
        let (resources, reserved) = with_dynamic(resources, reserved, &dynamic);
        let id = match claim {
            Claim::Live(c) => Some(c),
            Claim::Recovered(_) | Claim::New => None,
        };
        let id = match id {
            Some(id) => {
                // Re-registration: replace the connection, reconcile tasks.
                let (old_conn, old_resources, old_reserved) = {
                    let Some(a) = self.agents.get_mut(&id) else {
                        return;
                    };
                    let old = a.conn.replace(conn);
                    a.address = address;
                    a.hostname = hostname;
                    a.attributes = attributes;
                    a.gpus = gpus;
                    a.offer_parts = Default::default();
                    a.last_seen = now;
                    a.disconnected_at = None;
                    self.agent_timer_floor.set(None);
                    let old_res = std::mem::replace(&mut a.resources, resources.clone());
                    let old_reserved = std::mem::replace(&mut a.reserved, reserved.clone());
                    (old, old_res, old_reserved)
                };
                if let Some(c) = old_conn.filter(|c| *c != conn) {
                    self.conns.remove(&c);
                    out.push(Output::Close {
                        conn: c,
                        reason: "agent reconnected on a new connection".into(),
                    });
                }
                if old_resources != resources || old_reserved != reserved {
                    for rec in self
                        .allocator
                        .update_agent(id, resources.clone(), reserved.clone())
                    {
                        self.send_rescind(&rec, out);
                    }
                }
                self.reconcile_agent_tasks(id, conn, &running, &pending_updates, false, now, out);
                self.emit_agent(id, "re-registered");
                id
            }
            None => {
                let id = match claim {
                    Claim::Recovered(c) => c,
                    _ => self.fresh_agent_id(),
                };
                self.allocator
                    .add_agent(id, &name, resources.clone(), reserved.clone());
                self.agents.insert(
                    id,
                    AgentRec {
                        id,
                        name: name.clone(),
                        hostname,
                        address,
                        conn: Some(conn),
                        resources,
                        reserved,
                        dynamic: dynamic.clone(),
                        attributes,
                        gpus,
                        offer_parts: Default::default(),
                        gpu_samples: Vec::new(),
                        last_seen: now,
                        disconnected_at: None,
                        tasks: HashSet::new(),
                        task_user: String::new(),
                        active: true,
                    },
                );
                self.agents_by_name.insert(name.clone(), id);
                self.agent_timers_changed();
                let (total, price_per_hour) = self.agent_price(id);
                self.emit(ClusterEvent::AgentAdded {
                    agent_id: id.to_string(),
                    name: name.clone(),
                    total,
                    price_per_hour,
                });
                let hostname = self
                    .agents
                    .get(&id)
                    .map(|a| a.hostname.clone())
                    .unwrap_or_default();
                let deactivated = recovered.as_ref().is_some_and(|r| r.deactivated);
                if deactivated {
                    // Deactivated by an operator before the failover: still not offered.
                    if let Some(a) = self.agents.get_mut(&id) {
                        a.active = false;
                    }
                    self.allocator.set_agent_active(id, false);
                }
                let record = AgentRecord {
                    id,
                    name: name.clone(),
                    hostname,
                    deactivated,
                };
                // After a failover the registry already holds most re-registering agents:
                // write only what changed (10,000 agents must not mean 10,000 etcd writes).
                if recovered.as_ref() != Some(&record) {
                    out.push(Output::Persist(Mutation::PutAgent(record)));
                }
                if let Some(u) = unreachable {
                    // Back from a partition within the unreachable timeout: its tasks resume
                    // their real states; anything else it reports is killed.
                    tracing::info!(agent = %name, away_ms = now.saturating_sub(u.since),
                        tasks = u.tasks.len(), "unreachable agent re-registered");
                    self.resume_tasks(id, conn, u, &running, now, out);
                }
                if matches!(claim, Claim::Recovered(_)) {
                    // Back after a master restart (tasks adopted) or a partition (`adopt` is
                    // false: only the tasks it kept are its).
                    self.reconcile_agent_tasks(
                        id,
                        conn,
                        &running,
                        &pending_updates,
                        adopt,
                        now,
                        out,
                    );
                } else {
                    // Nobody vouches for tasks a new agent reports: they are killed.
                    for rt in running.iter().filter(|rt| !rt.state.is_terminal()) {
                        out.push(Output::ToAgent(
                            conn,
                            MasterToAgent::KillTask {
                                framework_id: rt.framework_id,
                                task_id: rt.task.task_id,
                            },
                        ));
                    }
                }
                id
            }
        };
        // The models of its GPUs, for demands that name one (allocator::models), and where
        // they sit, for whole GPUs earmarked by demand offers (allocator::gpus).
        let (models, topology): (Vec<String>, _) = self
            .agents
            .get(&id)
            .map(|a| {
                let models = a.gpus.iter().map(|g| g.name.clone()).collect();
                (models, super::gpus::gpu_view_topology(a))
            })
            .unwrap_or_default();
        self.allocator.set_agent_gpu_topology(id, topology);
        if !self.allocator.set_agent_gpu_models(id, &models) {
            tracing::warn!(agent = %name, ?models, "more than {} GPU models: demands naming this agent's model are not offered here", crate::allocator::MAX_MODELS);
        }
        if let Some(Peer::Agent { agent, .. }) = self.conns.get_mut(&conn) {
            *agent = Some(id);
        }
        out.push(Output::ToAgent(
            conn,
            MasterToAgent::Registered {
                agent_id: id,
                epoch: self.config.epoch,
                heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            },
        ));
        self.maintenance_after_register(id, out);
        self.send_agent_summary(id, out);
        // Updates the agent made while it was away.
        for update in pending_updates {
            self.agent_update(conn, id, update, now, out);
        }
        self.allocation_pending = true;
    }

    pub(super) fn agent_update(
        &mut self,
        conn: ConnId,
        agent: AgentId,
        update: StatusUpdate,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if let Some(a) = self.agents.get_mut(&agent) {
            a.last_seen = now;
        }
        let ack = Output::ToAgent(
            conn,
            MasterToAgent::Acknowledge {
                task_id: update.task_id,
                update_id: update.update_id,
            },
        );
        let Some(task) = self.tasks.get_mut(&update.task_id) else {
            // A completed task's update again: its acknowledgement was lost on the way.
            if self.completed_count.contains_key(&update.task_id) {
                self.status_update_retries += 1;
            }
            // Unknown task (its framework was removed): nobody will acknowledge; we do.
            out.push(ack);
            return;
        };
        if task.agent != agent {
            out.push(Output::Close {
                conn,
                reason: format!(
                    "status update for task {} which runs on another agent",
                    update.task_id
                ),
            });
            return;
        }
        if task.acked.contains(&update.update_id) {
            self.status_update_retries += 1;
            out.push(ack);
            return;
        }
        if let Some(p) = task
            .pending
            .iter()
            .find(|p| p.update_id == update.update_id)
        {
            // A retransmission of an update the framework has not acknowledged yet: forwarded
            // again (the framework's acknowledgement may have been lost), state unchanged.
            self.status_update_retries += 1;
            // Paced like a first delivery (held once when the framework is behind).
            let p = p.clone();
            self.deliver_update(p, out);
            return;
        }
        let framework_known = self.frameworks.contains_key(&task.framework);
        if framework_known && task.pending.len() >= MAX_PENDING_UPDATES {
            // The agent pipelines at most this many updates of a task (its window).
            out.push(Output::Close {
                conn,
                reason: format!(
                    "more than {MAX_PENDING_UPDATES} unacknowledged status updates for task {}",
                    update.task_id
                ),
            });
            return;
        }
        let mut update = update;
        // The agent only knows it was asked to kill: say why when the master asked for a reason.
        if let Some(why) = task.kill_reason {
            if update.state == TaskState::Killed
                && matches!(update.reason, None | Some(TaskReason::KilledByRequest))
            {
                let said = why.kill_message().unwrap_or("killed");
                update.message = if update.message.is_empty() {
                    said.to_string()
                } else {
                    format!("{said} (agent: {})", update.message)
                };
                update.reason = Some(why);
            }
        }
        let was_terminal = task.state.is_terminal();
        if !was_terminal || update.state.is_terminal() {
            task.state = update.state;
        }
        let state = task.state;
        task.note(state, &update, now);
        let framework = task.framework;
        update.agent_id = Some(agent);
        update.framework_id = framework;
        if framework_known {
            task.pending.push_back(update.clone());
        }
        if update.state.is_terminal() {
            self.release_task_resources(update.task_id);
        }
        self.emit_task(update.task_id);
        match self.frameworks.get(&framework) {
            // Now, or paced when the framework is behind (`pacing`).
            Some(_) => self.deliver_update(update, out),
            None => {
                // Framework removed: acknowledge on its behalf.
                out.push(ack);
                self.finish_task_if_done(update.task_id);
            }
        }
    }

    pub(super) fn gpu_health(
        &mut self,
        agent: AgentId,
        uuid: &str,
        healthy: bool,
        reason: &str,
        out: &mut Vec<Output>,
    ) {
        let Some(a) = self.agents.get_mut(&agent) else {
            return;
        };
        let Some(gpu) = a.gpus.iter_mut().find(|g| g.uuid == uuid) else {
            return;
        };
        if gpu.healthy == healthy {
            return;
        }
        gpu.healthy = healthy;
        a.offer_parts = Default::default();
        let healthy_count = a.gpus.iter().filter(|g| g.healthy).count() as u64;
        // Statically reserved GPUs stay reserved; the unreserved pool absorbs the change.
        let reserved_gpus: u64 = a.reserved.values().map(|r| r.milli("gpus")).sum();
        let mut resources = a.resources.clone();
        resources.set_milli(
            "gpus",
            (healthy_count * gantry_proto::resources::MILLI).saturating_sub(reserved_gpus),
        );
        a.resources = resources.clone();
        let reserved = a.reserved.clone();
        tracing::warn!(%agent, gpu = uuid, healthy, reason, "GPU health changed");
        for rec in self.allocator.update_agent(agent, resources, reserved) {
            self.send_rescind(&rec, out);
        }
        self.allocation_pending = true;
        let what = if healthy {
            format!("GPU {uuid} healthy again")
        } else {
            format!("GPU {uuid} unhealthy: {reason}")
        };
        self.emit_agent(agent, &what);
        self.send_agent_summary(agent, out);
    }

    pub(super) fn agent_disconnected(
        &mut self,
        id: AgentId,
        conn: ConnId,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(a) = self.agents.get_mut(&id) else {
            return;
        };
        if a.conn != Some(conn) {
            return;
        }
        a.conn = None;
        a.disconnected_at = Some(now);
        self.agent_timer_floor.set(None);
        tracing::info!(agent = %a.name, "agent disconnected; waiting for it to re-register");
        self.emit_agent(id, "disconnected");
        // Its outstanding offers can no longer be used.
        let offers = self.allocator.agent_offers(id);
        for oid in offers {
            if let Some(rec) = self.allocator.rescind(oid) {
                self.send_rescind(&rec, out);
            }
        }
    }

    pub(super) fn remove_agent(
        &mut self,
        id: AgentId,
        reason: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let tasks: Vec<TaskId> = self
            .agents
            .get(&id)
            .map(|a| a.tasks.iter().copied().collect())
            .unwrap_or_default();
        for tid in tasks {
            if let Some(t) = self.tasks.get_mut(&tid) {
                t.recovered = true; // the agent's resources leave with it
                if t.state.is_terminal() {
                    // It ended (FINISHED, say) before the agent went: a terminal state is
                    // never rewritten. Kept until its framework acknowledges the real update
                    // (redelivered when it subscribes again).
                    self.finish_task_if_done(tid);
                    continue;
                }
                self.lose_task(tid, reason, now, out);
            }
        }
        for rec in self.allocator.remove_agent(id) {
            self.send_rescind(&rec, out);
        }
        if let Some(a) = self.agents.remove(&id) {
            self.agents_by_name.remove(&a.name);
            for role in a.reserved.keys() {
                self.forget_role(role);
            }
            if let Some(c) = a.conn {
                self.conns.remove(&c);
                out.push(Output::Close {
                    conn: c,
                    reason: reason.to_string(),
                });
            }
            tracing::warn!(agent = %a.name, reason, "agent removed");
            self.send_agent_removed(id, &a.name, reason, out);
            self.emit(ClusterEvent::AgentRemoved {
                agent_id: id.to_string(),
                name: a.name.clone(),
                reason: reason.to_string(),
            });
            for role in a.dynamic.keys() {
                out.push(Output::Persist(Mutation::RemoveReservation {
                    agent_id: id,
                    role: role.clone(),
                }));
            }
            out.push(Output::Persist(Mutation::RemoveAgent(id)));
        }
        self.forget_drain(id, out);
    }
}
