//! Operator commands (HTTP API / `gantryctl`): role weights and quotas, reservations on an
//! agent, deactivating / reactivating and removing agents, tearing down frameworks and
//! clearing unhealthy GPUs. What they change is persisted (weights, quotas, dynamic
//! reservations, deactivation in the agent's record, removals) and survives a restart or
//! failover; a GPU clear is the agent's to keep.

use super::*;

/// Smallest and largest role weight an operator may set (shares are divided by the weight; the
/// bounds keep them finite and comparable).
pub const MIN_WEIGHT: f64 = 0.001;
pub const MAX_WEIGHT: f64 = 1_000_000.0;
/// Resource kinds one quota guarantee or limit may name.
pub const MAX_QUOTA_KINDS: usize = 32;
/// Largest amount of one resource in a quota, in milli-units (10^12 units).
pub const MAX_QUOTA_MILLI: u64 = 1_000_000_000_000_000;

/// Resource kinds every cluster knows, whatever its agents offer.
pub const STANDARD_RESOURCE_KINDS: [&str; 5] = ["cpus", "mem", "disk", "gpus", "ports"];

/// One part (guarantee or limit) of a quota change.
#[derive(Debug, Clone, PartialEq)]
pub enum QuotaPart<T> {
    /// Left as it is.
    Keep,
    /// Set to this.
    Set(T),
    /// Removed.
    Remove,
}

impl<T: Clone> QuotaPart<T> {
    fn apply(self, current: Option<T>) -> Option<T> {
        match self {
            QuotaPart::Keep => current,
            QuotaPart::Set(v) => Some(v),
            QuotaPart::Remove => None,
        }
    }
}

/// An operator request (HTTP API / `gantryctl`).
#[derive(Debug, Clone, PartialEq)]
pub enum OperatorCommand {
    SetWeight {
        role: String,
        weight: f64,
    },
    /// Replaces the role's quota; `None` parts are removed.
    SetQuota {
        role: String,
        guarantee: Option<Resources>,
        /// Kinds named with zero are limited to zero.
        limit: Option<ResourceLimits>,
    },
    /// Changes the role's quota part by part: what is [`QuotaPart::Keep`] stays as it is (a
    /// change never drops a part silently). Checked as [`OperatorCommand::SetQuota`].
    ChangeQuota {
        role: String,
        guarantee: QuotaPart<Resources>,
        limit: QuotaPart<ResourceLimits>,
    },
    /// Reserves unreserved resources of an agent for `role` (not in use by tasks; outstanding
    /// offers that no longer fit are rescinded). Persisted as a dynamic reservation.
    Reserve {
        agent_id: AgentId,
        role: String,
        resources: Resources,
    },
    /// Returns dynamically reserved resources of `role` on an agent to the unreserved pool
    /// (not in use by the role's tasks).
    Unreserve {
        agent_id: AgentId,
        role: String,
        resources: Resources,
    },
    /// Stops offering an agent (its tasks run on) until reactivated.
    DeactivateAgent {
        agent_id: AgentId,
    },
    /// Offers a deactivated agent again.
    ReactivateAgent {
        agent_id: AgentId,
    },
    /// Removes an agent for good: its tasks are `LOST`, its connection closed.
    MarkAgentGone {
        agent_id: AgentId,
    },
    /// Removes a framework: its tasks are killed, its offers rescinded (Mesos TEARDOWN).
    Teardown {
        framework_id: FrameworkId,
    },
    /// Asks the agent to bring an unhealthy GPU back (as `gantry-agent clear-gpu` does); the
    /// agent reports the GPU healthy and the master offers it again.
    ClearGpu {
        agent_id: AgentId,
        uuid: String,
    },
}

impl Master {
    /// Applies a weight or quota command (which do not depend on the time); see
    /// [`Master::operator_at`].
    pub fn operator(&mut self, cmd: OperatorCommand) -> Result<Vec<Output>, OperatorRejection> {
        self.operator_at(cmd, 0)
    }

    /// Applies an operator command at `now`. Weights and quotas take effect at the next batch
    /// allocation (as in Mesos).
    pub fn operator_at(
        &mut self,
        cmd: OperatorCommand,
        now: Millis,
    ) -> Result<Vec<Output>, OperatorRejection> {
        let mut out = Vec::new();
        match cmd {
            OperatorCommand::SetWeight { .. } | OperatorCommand::SetQuota { .. } => {
                return self.role_command(cmd);
            }
            OperatorCommand::ChangeQuota {
                role,
                guarantee,
                limit,
            } => {
                let (g, l) = self.allocator.quota(&role);
                return self.role_command(OperatorCommand::SetQuota {
                    role,
                    guarantee: guarantee.apply(g),
                    limit: limit.apply(l),
                });
            }
            OperatorCommand::Reserve {
                agent_id,
                role,
                resources,
            } => self.operator_reserve(agent_id, &role, &resources, true, &mut out)?,
            OperatorCommand::Unreserve {
                agent_id,
                role,
                resources,
            } => self.operator_reserve(agent_id, &role, &resources, false, &mut out)?,
            OperatorCommand::DeactivateAgent { agent_id } => {
                self.set_active(agent_id, false, &mut out)?
            }
            OperatorCommand::ReactivateAgent { agent_id } => {
                self.set_active(agent_id, true, &mut out)?
            }
            OperatorCommand::MarkAgentGone { agent_id } => {
                if !self.agents.contains_key(&agent_id) {
                    return Err(not_found_agent(agent_id));
                }
                // One meaning of "gone": removed for good, its id remembered and refused
                // (`state::maintenance`).
                let cmd = super::maintenance::MaintenanceCommand::MarkGone {
                    agent: agent_id.to_string(),
                };
                match self.maintenance(cmd, now) {
                    Ok(o) => out.extend(o),
                    Err(e) => return Err(OperatorRejection::Invalid(e.to_string())),
                }
            }
            OperatorCommand::Teardown { framework_id } => {
                if !self.frameworks.contains_key(&framework_id) {
                    return Err(OperatorRejection::NotFound(format!(
                        "no framework {framework_id}"
                    )));
                }
                tracing::warn!(framework = %framework_id, "framework torn down by an operator");
                // Its tasks' KILLED updates say an operator killed them.
                let tids: Vec<TaskId> = self
                    .frameworks
                    .get(&framework_id)
                    .map(|f| f.tasks.iter().copied().collect())
                    .unwrap_or_default();
                for tid in tids {
                    if let Some(t) = self.tasks.get_mut(&tid) {
                        t.kill_reason.get_or_insert(TaskReason::OperatorKill);
                    }
                }
                self.remove_framework(framework_id, "torn down by an operator", now, &mut out);
            }
            OperatorCommand::ClearGpu { agent_id, uuid } => {
                let a = self
                    .agents
                    .get(&agent_id)
                    .ok_or_else(|| not_found_agent(agent_id))?;
                let gpu = a.gpus.iter().find(|g| g.uuid == uuid).ok_or_else(|| {
                    OperatorRejection::NotFound(format!("agent {} has no GPU {uuid:?}", a.name))
                })?;
                if gpu.healthy {
                    return Err(OperatorRejection::Conflict(format!(
                        "GPU {uuid} of agent {} is healthy",
                        a.name
                    )));
                }
                let conn = a.conn.ok_or_else(|| {
                    OperatorRejection::Conflict(format!(
                        "agent {} is disconnected; clear the GPU on the host (gantry-agent clear-gpu)",
                        a.name
                    ))
                })?;
                tracing::info!(agent = %a.name, gpu = %uuid, "operator clears a GPU");
                out.push(Output::ToAgent(conn, MasterToAgent::ClearGpu { uuid }));
            }
        }
        Ok(out)
    }

    fn set_active(
        &mut self,
        id: AgentId,
        active: bool,
        out: &mut Vec<Output>,
    ) -> Result<(), OperatorRejection> {
        let a = self
            .agents
            .get_mut(&id)
            .ok_or_else(|| not_found_agent(id))?;
        if a.active == active {
            return Ok(());
        }
        a.active = active;
        tracing::warn!(agent = %a.name, active, "agent activity changed by an operator");
        out.push(Output::Persist(Mutation::PutAgent(AgentRecord {
            id,
            name: a.name.clone(),
            hostname: a.hostname.clone(),
            deactivated: !active,
        })));
        // A draining agent stays unoffered until it is undrained too.
        let offered = active && self.drain_state(id).is_none();
        for rec in self.allocator.set_agent_active(id, offered) {
            self.send_rescind(&rec, out);
        }
        self.allocation_pending = true;
        self.emit_agent(id, if active { "reactivated" } else { "deactivated" });
        Ok(())
    }

    /// RESERVE / UNRESERVE by an operator on an agent's free resources.
    fn operator_reserve(
        &mut self,
        id: AgentId,
        role: &str,
        resources: &Resources,
        reserve: bool,
        out: &mut Vec<Output>,
    ) -> Result<(), OperatorRejection> {
        self.config.limits.check_role(role)?;
        if resources.is_empty() {
            return Err(OperatorRejection::Invalid("no resources named".into()));
        }
        self.check_resource_kinds("reservation", resources.names())?;
        let a = self.agents.get(&id).ok_or_else(|| not_found_agent(id))?;
        // What the agent's tasks hold, by pool.
        let mut used_unreserved = Resources::new();
        let mut used_role = Resources::new();
        for t in a.tasks.iter().filter_map(|t| self.tasks.get(t)) {
            if t.recovered {
                continue;
            }
            used_unreserved.add_assign(&t.allocation.unreserved);
            if let Some(r) = t.allocation.reserved.get(role) {
                used_role.add_assign(r);
            }
        }
        if reserve {
            let free = a.resources.saturating_sub(&used_unreserved);
            if !free.contains(resources) {
                return Err(OperatorRejection::Conflict(format!(
                    "agent {} has {free} unreserved and not in use; {resources} can not be reserved",
                    a.name
                )));
            }
        } else {
            let dynamic = a.dynamic.get(role).cloned().unwrap_or_default();
            if !dynamic.contains(resources) {
                return Err(OperatorRejection::Conflict(format!(
                    "{resources} is not dynamically reserved for {role:?} on agent {} (static reservations belong to the agent's configuration)",
                    a.name
                )));
            }
            let reserved = a.reserved.get(role).cloned().unwrap_or_default();
            if !reserved.saturating_sub(&used_role).contains(resources) {
                return Err(OperatorRejection::Conflict(format!(
                    "{resources} of {role:?} on agent {} is in use by tasks",
                    a.name
                )));
            }
        }
        let Some(a) = self.agents.get_mut(&id) else {
            return Err(not_found_agent(id));
        };
        a.apply_reservation(role, resources, reserve);
        let (unreserved, reserved) = (a.resources.clone(), a.reserved.clone());
        let now_reserved = a.dynamic.get(role).cloned().unwrap_or_default();
        tracing::info!(agent = %a.name, %role, %resources, reserve, "operator reservation change");
        for rec in self.allocator.update_agent(id, unreserved, reserved) {
            self.send_rescind(&rec, out);
        }
        out.push(Output::Persist(Mutation::SetReservation(Reservation {
            agent_id: id,
            role: role.to_string(),
            resources: now_reserved,
        })));
        self.send_agent_summary(id, out);
        if !reserve {
            self.forget_role(role);
        }
        self.allocation_pending = true;
        self.emit(ClusterEvent::RoleUpdated {
            role: role.to_string(),
            what: if reserve { "reserved" } else { "unreserved" }.into(),
        });
        Ok(())
    }

    fn role_command(&mut self, cmd: OperatorCommand) -> Result<Vec<Output>, OperatorRejection> {
        match cmd {
            OperatorCommand::SetWeight { role, weight } => {
                self.config.limits.check_role(&role)?;
                if !(weight.is_finite() && (MIN_WEIGHT..=MAX_WEIGHT).contains(&weight)) {
                    return Err(OperatorRejection::Weight(weight));
                }
                tracing::info!(%role, weight, "role weight set");
                self.allocator.set_weight(&role, weight);
                if weight == 1.0 {
                    // Back to the default: a role kept only by its weight is unused now.
                    self.forget_role(&role);
                }
                self.emit(ClusterEvent::RoleUpdated {
                    role: role.clone(),
                    what: "weight".into(),
                });
                Ok(vec![Output::Persist(Mutation::SetWeight { role, weight })])
            }
            OperatorCommand::SetQuota {
                role,
                guarantee,
                limit,
            } => {
                self.config.limits.check_role(&role)?;
                let parts: [(&str, Vec<(&str, u64)>); 2] = [
                    (
                        "guarantee",
                        guarantee.iter().flat_map(|g| g.iter()).collect(),
                    ),
                    ("limit", limit.iter().flat_map(|l| l.iter()).collect()),
                ];
                for (part, r) in parts {
                    if r.len() > MAX_QUOTA_KINDS {
                        return Err(OperatorRejection::QuotaKinds(part));
                    }
                    self.check_resource_kinds(part, r.iter().map(|(n, _)| *n))?;
                    if let Some((name, _)) = r.iter().find(|(_, milli)| *milli > MAX_QUOTA_MILLI) {
                        return Err(OperatorRejection::QuotaAmount {
                            part,
                            name: name.to_string(),
                        });
                    }
                }
                if let (Some(g), Some(l)) = (&guarantee, &limit) {
                    if let Some(name) = g
                        .names()
                        .find(|n| l.limit(n).is_some_and(|max| g.milli(n) > max))
                    {
                        return Err(OperatorRejection::GuaranteeOverLimit(name.to_string()));
                    }
                }
                // Refused (nothing changes) when guarantees would not nest.
                self.allocator
                    .set_quota(&role, guarantee.clone(), limit.clone())?;
                tracing::info!(%role, ?guarantee, ?limit, "role quota set");
                if guarantee.is_none() && limit.is_none() {
                    self.forget_role(&role);
                }
                let m = if guarantee.is_none() && limit.is_none() {
                    Mutation::RemoveQuota { role }
                } else {
                    Mutation::SetQuota {
                        role,
                        quota: Quota {
                            guarantee: guarantee.unwrap_or_default(),
                            limit: limit.unwrap_or_default(),
                        },
                    }
                };
                self.emit(ClusterEvent::RoleUpdated {
                    role: match &m {
                        Mutation::SetQuota { role, .. } | Mutation::RemoveQuota { role } => {
                            role.clone()
                        }
                        _ => String::new(),
                    },
                    what: "quota".into(),
                });
                Ok(vec![Output::Persist(m)])
            }
            _ => Err(OperatorRejection::Invalid("not a role command".into())),
        }
    }
}

impl Master {
    /// The resource kinds this cluster knows: [`STANDARD_RESOURCE_KINDS`], those declared
    /// (`--resource-kinds`, [`MasterConfig::resource_kinds`]) and those its agents have
    /// (unreserved or reserved). Quotas and reservations may name only these.
    pub fn known_resource_kinds(&self) -> std::collections::BTreeSet<String> {
        let mut kinds: std::collections::BTreeSet<String> = STANDARD_RESOURCE_KINDS
            .iter()
            .map(|k| k.to_string())
            .chain(self.config.resource_kinds.iter().cloned())
            .collect();
        for a in self.agents.values() {
            kinds.extend(a.resources.names().map(str::to_string));
            for r in a.reserved.values() {
                kinds.extend(r.names().map(str::to_string));
            }
        }
        kinds
    }

    /// Refuses a kind the cluster does not know (a typo such as `cpu` for `cpus` would
    /// otherwise be stored as a quota on a resource nobody has), naming the known ones.
    fn check_resource_kinds<'a>(
        &self,
        part: &'static str,
        mut names: impl Iterator<Item = &'a str>,
    ) -> Result<(), OperatorRejection> {
        let known = self.known_resource_kinds();
        match names.find(|n| !known.contains(*n)) {
            None => Ok(()),
            Some(name) => Err(OperatorRejection::UnknownResourceKind {
                part,
                name: name.to_string(),
                known: known.into_iter().collect::<Vec<_>>().join(", "),
            }),
        }
    }
}

fn not_found_agent(id: AgentId) -> OperatorRejection {
    OperatorRejection::NotFound(format!("no agent {id}"))
}
