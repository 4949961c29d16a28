//! Frameworks: the message dispatch for framework connections, subscription (validation,
//! ACLs, limits, failover by id), disconnection (failover timeout running) and removal.

use super::*;
use crate::security::Exceeded;

impl Master {
    pub(super) fn framework_message(
        &mut self,
        conn: ConnId,
        msg: FrameworkToMaster,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(Peer::Framework {
            principal,
            framework,
        }) = self.conns.get(&conn).cloned()
        else {
            out.push(Output::Close {
                conn,
                reason: "framework message on a connection that is not a framework's".into(),
            });
            return;
        };
        let fw = match (msg, framework) {
            (FrameworkToMaster::Subscribe(info), None) => {
                return self.subscribe(conn, principal, info, now, out)
            }
            (FrameworkToMaster::Subscribe(_), Some(_)) => {
                out.push(err(
                    conn,
                    ErrorKind::InvalidRequest,
                    "already subscribed on this connection",
                ));
                return;
            }
            (_, None) => {
                out.push(err(conn, ErrorKind::NotSubscribed, "subscribe first"));
                out.push(Output::Close {
                    conn,
                    reason: "framework message before subscribing".into(),
                });
                return;
            }
            (msg, Some(fw)) => (msg, fw),
        };
        let (msg, fw) = fw;
        match msg {
            FrameworkToMaster::Subscribe(_) => unreachable!("handled above"),
            FrameworkToMaster::Accept {
                offer_ids,
                operations,
                refuse_seconds,
            } => self.accept(conn, fw, offer_ids, operations, refuse_seconds, now, out),
            FrameworkToMaster::Decline {
                offer_ids,
                refuse_seconds,
            } => {
                let refuse = match refuse_ms(refuse_seconds) {
                    Ok(r) => r,
                    Err(e) => return out.push(err(conn, ErrorKind::InvalidRequest, e.to_string())),
                };
                // One error for all unknown ids: a long list of them is not a long answer.
                let mut unknown: Option<(OfferId, usize)> = None;
                let mut mine = Vec::with_capacity(offer_ids.len());
                for oid in offer_ids {
                    match self.allocator.offer(oid) {
                        Some(o) if o.framework == fw => mine.push(oid),
                        _ => unknown.get_or_insert((oid, 0)).1 += 1,
                    }
                }
                // Rule 2 (docs/allocator.md): a decline acts on ALL of the framework's
                // outstanding offers on each agent it names, with one filter over their union
                // there; the offers it did not name are rescinded at the framework.
                let named: HashSet<OfferId> = mine.iter().copied().collect();
                let mut agents: Vec<AgentId> = Vec::new();
                for oid in &mine {
                    if let Some(o) = self.allocator.offer(*oid) {
                        if !agents.contains(&o.agent) {
                            agents.push(o.agent);
                        }
                    }
                }
                for agent in agents {
                    for oid in self.allocator.offers_on(fw, agent) {
                        if !named.contains(&oid) {
                            mine.push(oid);
                            out.push(Output::ToFramework(
                                conn,
                                MasterToFramework::Rescind { offer_id: oid },
                            ));
                        }
                    }
                }
                let _ = self.allocator.decline_offers(&mine, refuse, now);
                match unknown {
                    Some((oid, 1)) => out.push(err(
                        conn,
                        ErrorKind::UnknownOffer,
                        format!("decline: offer {oid} is not outstanding for this framework"),
                    )),
                    Some((oid, n)) => out.push(err(
                        conn,
                        ErrorKind::UnknownOffer,
                        format!(
                            "decline: {n} offers (the first {oid}) are not outstanding for this framework"
                        ),
                    )),
                    None => {}
                }
            }
            FrameworkToMaster::Kill { task_id } => {
                self.framework_kill(conn, fw, task_id, None, now, out)
            }
            FrameworkToMaster::KillFor { task_id, reason } => {
                if reason.is_framework_kill() {
                    self.framework_kill(conn, fw, task_id, Some(reason), now, out)
                } else {
                    out.push(err(
                        conn,
                        ErrorKind::InvalidRequest,
                        format!(
                            "kill: {reason} is not a reason a framework may give \
                             (killed-by-request, preempted, time-limit, deadline)"
                        ),
                    ));
                }
            }
            FrameworkToMaster::Reconcile { task_ids } => self.reconcile(conn, fw, task_ids, out),
            FrameworkToMaster::Suppress { roles } => {
                if roles.is_empty() {
                    self.allocator.suppress(fw, None);
                } else {
                    for r in &roles {
                        self.allocator.suppress(fw, Some(r));
                    }
                }
            }
            FrameworkToMaster::Revive { roles } => {
                if roles.is_empty() {
                    self.allocator.revive(fw, None);
                } else {
                    for r in &roles {
                        self.allocator.revive(fw, Some(r));
                    }
                }
                self.allocation_pending = true;
            }
            FrameworkToMaster::Acknowledge { task_id, update_id } => {
                let Some(task) = self.tasks.get_mut(&task_id) else {
                    return;
                };
                if task.framework != fw {
                    return;
                }
                // Any pending update (frameworks acknowledge in order, but need not).
                let Some(pos) = task.pending.iter().position(|u| u.update_id == update_id) else {
                    return;
                };
                task.pending.remove(pos);
                task.acked.insert(update_id);
                if let Some(aconn) = self.agents.get(&task.agent).and_then(|a| a.conn) {
                    out.push(Output::ToAgent(
                        aconn,
                        MasterToAgent::Acknowledge { task_id, update_id },
                    ));
                }
                self.finish_task_if_done(task_id);
            }
            FrameworkToMaster::SetDemand { demands } => {
                if demands.len() > MAX_DEMAND_SHAPES {
                    return out.push(err(
                        conn,
                        ErrorKind::InvalidRequest,
                        format!(
                            "demand declares {} task shapes; at most {MAX_DEMAND_SHAPES}",
                            demands.len()
                        ),
                    ));
                }
                if demands
                    .iter()
                    .filter_map(|d| d.gpu_model.as_ref())
                    .any(|m| m.len() > MAX_DEMAND_MODEL_LEN)
                {
                    return out.push(err(
                        conn,
                        ErrorKind::InvalidRequest,
                        format!("demand GPU model longer than {MAX_DEMAND_MODEL_LEN} bytes"),
                    ));
                }
                if demands.iter().any(|d| d.task.is_empty()) {
                    return out.push(err(
                        conn,
                        ErrorKind::InvalidRequest,
                        "demand task shape is empty",
                    ));
                }
                self.allocator.set_demands(fw, demands);
                self.allocation_pending = true;
            }
            FrameworkToMaster::DestroyVolume { agent_id, name } => {
                // The framework is the connection's: it cannot name another framework's volume.
                let principal = self.frameworks.get(&fw).map(|f| f.principal.clone());
                match self.agents.get(&agent_id) {
                    Some(a) if a.conn.is_some() => out.push(Output::Volume {
                        reply: conn,
                        agent: a.name.clone(),
                        agent_id,
                        request: VolumeRequest::Destroy {
                            framework: fw.to_string(),
                            name,
                            principal: format!("framework:{}", principal.unwrap_or_default()),
                        },
                    }),
                    known => {
                        let why = if known.is_some() {
                            format!("agent {agent_id} is not connected; try again when it is")
                        } else {
                            format!("no agent {agent_id}")
                        };
                        out.push(Output::ToFramework(
                            conn,
                            MasterToFramework::VolumeDestroyed(VolumeDestroyed {
                                agent_id,
                                name,
                                outcome: VolumeOutcome::Failed(why),
                            }),
                        ));
                    }
                }
            }
            FrameworkToMaster::Teardown => {
                self.remove_framework(fw, "framework tore down", now, out);
                self.conns.remove(&conn);
                out.push(Output::Close {
                    conn,
                    reason: "framework tore down".into(),
                });
            }
        }
    }

    pub(super) fn subscribe(
        &mut self,
        conn: ConnId,
        principal: String,
        info: FrameworkInfo,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if let Err(rejection) = self.check_subscribe(&principal, &info) {
            return refuse_framework(conn, rejection.to_string(), out);
        }
        let failover_timeout_ms = (info.failover_timeout_secs.min(365.0 * 86400.0) * 1000.0) as u64;
        let id = match info
            .framework_id
            .and_then(|id| self.frameworks.get(&id).map(|f| (id, f.principal.clone())))
        {
            Some((id, owner)) if owner == principal => {
                // Failover: the same principal takes its framework back.
                let old_conn = {
                    let f = self.frameworks.get_mut(&id).expect("checked above");
                    f.name = info.name.clone();
                    f.failover_timeout_ms = failover_timeout_ms;
                    f.capabilities = info.capabilities.clone();
                    for r in &info.roles {
                        if !f.roles.contains(r) {
                            f.roles.push(r.clone());
                        }
                    }
                    f.disconnected_at = None;
                    f.conn.replace(conn)
                };
                if let Some(c) = old_conn.filter(|c| *c != conn) {
                    // The old connection's offers die with it.
                    self.conns.remove(&c);
                    out.push(Output::Close {
                        conn: c,
                        reason: "framework re-subscribed elsewhere".into(),
                    });
                    let offers = self.allocator.framework_offers(id);
                    for o in offers {
                        self.allocator.rescind(o);
                    }
                }
                // Capabilities and new roles may change on failover (as in Mesos).
                let (name, roles) = self
                    .frameworks
                    .get(&id)
                    .map(|f| (f.name.clone(), f.roles.clone()))
                    .unwrap_or_default();
                let gpu = info.capabilities.contains(&Capability::GpuResources);
                self.allocator.add_framework(id, &name, &roles, gpu, None);
                self.allocator
                    .set_min_allocatable(id, &info.min_allocatable);
                self.allocator.revive(id, None);
                for r in &info.suppressed_roles {
                    self.allocator.suppress(id, Some(r));
                }
                id
            }
            Some(_) => {
                // Checked by `check_subscribe`.
                return refuse_framework(
                    conn,
                    "framework id belongs to another principal".into(),
                    out,
                );
            }
            None => {
                let id = self.fresh_framework_id();
                let gpu = info.capabilities.contains(&Capability::GpuResources);
                self.allocator
                    .add_framework(id, &info.name, &info.roles, gpu, None);
                self.allocator
                    .set_min_allocatable(id, &info.min_allocatable);
                for r in &info.suppressed_roles {
                    self.allocator.suppress(id, Some(r));
                }
                self.frameworks.insert(
                    id,
                    FrameworkRec {
                        id,
                        name: info.name.clone(),
                        principal: principal.clone(),
                        roles: info.roles.clone(),
                        capabilities: info.capabilities.clone(),
                        failover_timeout_ms,
                        conn: Some(conn),
                        disconnected_at: None,
                        tasks: HashSet::new(),
                    },
                );
                self.emit(ClusterEvent::FrameworkAdded {
                    framework_id: id.to_string(),
                    name: info.name.clone(),
                    principal: principal.clone(),
                });
                id
            }
        };
        if let Some(Peer::Framework { framework, .. }) = self.conns.get_mut(&conn) {
            *framework = Some(id);
        }
        tracing::info!(framework = %id, name = %info.name, %principal, "framework subscribed");
        self.emit_framework(id);
        if let Some(f) = self.frameworks.get(&id) {
            out.push(Output::Persist(Mutation::PutFramework(FrameworkRecord {
                id,
                name: f.name.clone(),
                roles: f.roles.clone(),
                principal: f.principal.clone(),
                failover_timeout_secs: f.failover_timeout_ms as f64 / 1000.0,
                partition_aware: f.capabilities.contains(&Capability::PartitionAware),
            })));
        }
        out.push(Output::ToFramework(
            conn,
            MasterToFramework::Subscribed {
                framework_id: id,
                epoch: self.config.epoch,
                heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            },
        ));
        // Redeliver updates the framework has not acknowledged yet, oldest first: a slice now,
        // the rest as its outbox drains (`pacing`).
        self.hold_pending(id);
        self.send_held(id, conn, UPDATE_SLICE, now, out);
        self.send_inventory(id, conn, out);
        self.allocation_pending = true;
    }

    /// Why `principal` may not subscribe `info` (validity, identity, ACLs, limits), if so.
    pub(super) fn check_subscribe(
        &self,
        principal: &str,
        info: &FrameworkInfo,
    ) -> Result<(), SubscribeRejection> {
        let limits = &self.config.limits;
        if info.name.is_empty() || info.name.len() > 256 {
            return Err(SubscribeRejection::Name);
        }
        if !info.failover_timeout_secs.is_finite() || info.failover_timeout_secs < 0.0 {
            return Err(SubscribeRejection::FailoverTimeout);
        }
        if info.roles.is_empty() {
            return Err(SubscribeRejection::NoRole);
        }
        let min = &info.min_allocatable;
        if min.len() > MAX_MIN_ALLOCATABLE
            || min.iter().any(|q| q.iter().count() > MAX_MIN_ALLOCATABLE)
        {
            return Err(SubscribeRejection::MinAllocatable { count: min.len() });
        }
        // Counted before anything else is looked at, so 50,000 roles cost one comparison.
        if let Err(Exceeded { count, limit }) = limits.check_roles_per_framework(info.roles.len()) {
            return Err(SubscribeRejection::TooManyRoles { count, limit });
        }
        if info.suppressed_roles.len() > info.roles.len() {
            return Err(SubscribeRejection::TooManySuppressedRoles {
                count: info.suppressed_roles.len(),
                roles: info.roles.len(),
            });
        }
        if let Some(r) = info
            .suppressed_roles
            .iter()
            .find(|r| !info.roles.contains(r))
        {
            return Err(SubscribeRejection::SuppressedRole(r.clone()));
        }
        for role in &info.roles {
            limits.check_role(role)?;
            if !self.config.acls.may_register(principal, role) {
                return Err(SubscribeRejection::RoleNotAllowed {
                    principal: principal.to_string(),
                    role: role.clone(),
                });
            }
        }
        match info.framework_id {
            Some(id) => {
                let Some(f) = self.frameworks.get(&id) else {
                    return Err(SubscribeRejection::UnknownId(id));
                };
                if f.principal != principal {
                    tracing::warn!(framework = %id, owner = %f.principal, %principal,
                        "subscribe with another principal's framework id refused");
                    return Err(SubscribeRejection::OtherPrincipal {
                        id,
                        principal: principal.to_string(),
                    });
                }
                let mut roles: HashSet<&str> = f.roles.iter().map(String::as_str).collect();
                roles.extend(info.roles.iter().map(String::as_str));
                if let Err(Exceeded { count, limit }) =
                    limits.check_roles_per_framework(roles.len())
                {
                    return Err(SubscribeRejection::WouldHoldTooManyRoles { id, count, limit });
                }
            }
            None => {
                let mine = self
                    .frameworks
                    .values()
                    .filter(|f| f.principal == principal)
                    .count();
                if let Err(Exceeded { count, limit }) = limits.check_new_framework(mine) {
                    return Err(SubscribeRejection::TooManyFrameworks {
                        principal: principal.to_string(),
                        count,
                        limit,
                    });
                }
            }
        }
        Ok(())
    }

    pub(super) fn framework_disconnected(&mut self, id: FrameworkId, conn: ConnId, now: Millis) {
        let Some(f) = self.frameworks.get_mut(&id) else {
            return;
        };
        if f.conn != Some(conn) {
            return;
        }
        f.conn = None;
        f.disconnected_at = Some(now);
        self.forget_held(id);
        tracing::info!(framework = %id, "framework disconnected; keeping its tasks for its failover timeout");
        let offers = self.allocator.framework_offers(id);
        for o in offers {
            self.allocator.rescind(o);
        }
        // No offers while it is away.
        self.allocator.suppress(id, None);
        self.emit_framework(id);
    }

    pub(super) fn remove_framework(
        &mut self,
        id: FrameworkId,
        reason: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(f) = self.frameworks.remove(&id) else {
            return;
        };
        self.forget_held(id);
        self.completed_frameworks.push_back(CompletedFramework {
            id,
            name: f.name.clone(),
            principal: f.principal.clone(),
            roles: f.roles.clone(),
            removed_at: now,
            reason: reason.to_string(),
        });
        while self.completed_frameworks.len() > self.config.max_completed_frameworks {
            if let Some(old) = self.completed_frameworks.pop_front() {
                if let Some(list) = self.completed.remove(&old.id) {
                    self.forget_completed(list.into_iter().map(|r| r.id));
                }
            }
        }
        out.push(Output::Persist(Mutation::RemoveFramework(id)));
        tracing::info!(framework = %id, reason, "framework removed");
        self.emit(ClusterEvent::FrameworkRemoved {
            framework_id: id.to_string(),
            name: f.name.clone(),
            reason: reason.to_string(),
        });
        // Its outstanding offers go with it; nobody is left to tell.
        self.allocator.remove_framework(id);
        for role in &f.roles {
            self.forget_role(role);
        }
        for tid in f.tasks {
            let Some(t) = self.tasks.get_mut(&tid) else {
                continue;
            };
            t.recovered = true; // freed by remove_framework
            t.pending.clear();
            if t.state.is_terminal() {
                self.finish_task_if_done(tid);
            } else if !self.agents.contains_key(&t.agent) {
                // Its agent is unreachable: the task is killed if the agent comes back (it is
                // then unknown); nothing of it is kept here.
                let agent = t.agent;
                if let Some(u) = self
                    .recovered_agents
                    .get_mut(&agent)
                    .and_then(|r| r.unreachable.as_mut())
                {
                    u.tasks.remove(&tid);
                }
                if let Some(t) = self.tasks.remove(&tid) {
                    self.remember_completed(t.record());
                }
            } else if let Some(aconn) = self.agents.get(&t.agent).and_then(|a| a.conn) {
                out.push(Output::ToAgent(
                    aconn,
                    MasterToAgent::KillTask {
                        framework_id: id,
                        task_id: tid,
                    },
                ));
            }
        }
        self.allocation_pending = true;
    }
}

impl Master {
    /// A framework's kill of one of its tasks (`reason`: why, when it said,
    /// [`FrameworkToMaster::KillFor`]).
    fn framework_kill(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        task_id: TaskId,
        reason: Option<TaskReason>,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        match self.tasks.get_mut(&task_id) {
            Some(t) if t.framework == fw => {
                if t.state.is_terminal() {
                    return;
                }
                if reason.is_some() {
                    t.kill_reason = reason;
                }
                match self.agents.get(&t.agent).and_then(|a| a.conn) {
                    Some(aconn) => out.push(Output::ToAgent(
                        aconn,
                        MasterToAgent::KillTask {
                            framework_id: fw,
                            task_id,
                        },
                    )),
                    None => {
                        let agent = t.agent;
                        if let Some(u) = self
                            .recovered_agents
                            .get_mut(&agent)
                            .and_then(|r| r.unreachable.as_mut())
                            .filter(|u| u.tasks.contains(&task_id))
                        {
                            // Sent when the agent comes back (or the task is GONE).
                            u.kills.insert(task_id);
                        } else if !self.agents.contains_key(&agent) {
                            self.master_update(
                                task_id,
                                TaskState::Lost,
                                TaskReason::AgentLost,
                                "agent is gone",
                                now,
                                out,
                            );
                        }
                        // Otherwise the agent is disconnected: the kill is sent again
                        // when the framework retries after reconciling.
                    }
                }
            }
            _ => out.push(err(
                conn,
                ErrorKind::UnknownTask,
                format!("kill: task {task_id} is unknown"),
            )),
        }
    }
}
