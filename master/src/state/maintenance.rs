//! Maintenance: draining agents (Mesos maintenance and `DRAIN_AGENT`), undraining, and marking
//! agents gone for good.
//!
//! A drain, started by an operator ([`Master::maintenance`]) or by the agent's spot-termination
//! notice ([`AgentToMaster::TerminationNotice`]):
//! 1. stops offering the agent (its outstanding offers are rescinded; the allocator skips it);
//! 2. sends every framework with unfinished tasks there a [`MasterToFramework::DrainNotice`]
//!    with the deadline (again whenever the framework re-subscribes on a new connection);
//! 3. at the deadline, kills what remains (the agent applies each task's grace period), and
//!    resends the kills every [`DRAIN_KILL_RETRY_MS`] to an agent that was away;
//! 4. is `DRAINING` until every task on the agent ended and its last update was acknowledged,
//!    then `DRAINED` (the agent stays registered and unoffered until undrained).
//!
//! The drain is persisted in the registry ([`MaintenanceRecord`], with the deadline in Unix
//! milliseconds), so a new leader ([`Master::restore_maintenance`]) keeps draining with the
//! same deadline. An agent removed (lost, or marked gone) leaves maintenance. `mark-gone`
//! removes the agent (its tasks `LOST`) and remembers its id ([`GoneRecord`]): a
//! re-registration claiming it is refused.

use serde::Serialize;

use super::*;
use crate::registry::{GoneRecord, MaintenanceRecord};

/// How often kills are resent to a draining agent past its deadline while tasks remain.
pub const DRAIN_KILL_RETRY_MS: Millis = 5_000;
/// Longest drain deadline an operator or agent may ask for (30 days).
pub const MAX_DRAIN_DEADLINE_SECS: u64 = 30 * 86_400;
/// Task ids listed per agent in the maintenance view (the count is always exact).
const MAX_LISTED_TASKS: usize = 100;
/// Longest drain reason kept, bytes.
const MAX_REASON: usize = 256;

/// One agent under maintenance.
#[derive(Debug)]
pub(crate) struct Drain {
    pub name: String,
    pub started_unix_ms: u64,
    /// When what is left is killed (the master's clock); `None`: never.
    pub deadline: Option<Millis>,
    pub deadline_unix_ms: Option<u64>,
    pub drained: bool,
    pub reason: String,
    /// Frameworks told, with the connection they were told on (a new connection hears again).
    notified: HashMap<FrameworkId, ConnId>,
    /// When kills were last sent (deadline passed).
    killed_at: Option<Millis>,
}

impl Drain {
    fn record(&self, agent_id: AgentId) -> MaintenanceRecord {
        MaintenanceRecord {
            agent_id,
            name: self.name.clone(),
            started_unix_ms: self.started_unix_ms,
            deadline_unix_ms: self.deadline_unix_ms,
            drained: self.drained,
            reason: self.reason.clone(),
        }
    }
}

/// An operator's maintenance request (`/api/v1/agents/{id}/…`, `gantryctl drain`).
#[derive(Debug, Clone, PartialEq)]
pub enum MaintenanceCommand {
    /// Drain the agent (by id or name); kill what is left after `deadline_secs` (never when
    /// `None`). Draining an agent again replaces its deadline.
    Drain {
        agent: String,
        deadline_secs: Option<u64>,
    },
    /// Offer the agent again.
    Undrain { agent: String },
    /// Remove the agent for good (its tasks `LOST`); it may not re-register with its id.
    MarkGone { agent: String },
}

/// Why a maintenance request was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaintenanceError {
    /// No registered (or expected) agent has this id or name.
    #[error("no agent {0:?} (give its id or its name)")]
    UnknownAgent(String),
    /// Undrain of an agent that is not under maintenance.
    #[error("agent {0:?} is not draining")]
    NotDraining(String),
    /// A deadline past [`MAX_DRAIN_DEADLINE_SECS`].
    #[error("a drain deadline is at most {MAX_DRAIN_DEADLINE_SECS} s, not {0} s")]
    DeadlineTooLong(u64),
    /// Asked of a master that does not lead (answered by the shell).
    #[error("this master is not the leader")]
    NotLeader,
}

/// One agent under maintenance, as `GET /api/v1/maintenance` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MaintenanceStatus {
    pub agent_id: AgentId,
    pub name: String,
    /// `DRAINING` or `DRAINED`.
    pub state: &'static str,
    pub reason: String,
    /// Registered and connected now.
    pub connected: bool,
    pub started_unix_ms: u64,
    pub deadline_unix_ms: Option<u64>,
    /// Milliseconds until the deadline (0 once passed).
    pub deadline_in_ms: Option<u64>,
    /// Tasks on the agent not yet ended, or ended with the update not yet acknowledged.
    pub tasks_remaining: usize,
    /// Up to 100 of them.
    pub tasks: Vec<TaskId>,
    /// Frameworks sent a drain notice.
    pub frameworks_notified: Vec<FrameworkId>,
    /// True once the deadline passed and the remaining tasks were killed.
    pub killing: bool,
}

/// An agent marked gone, as `GET /api/v1/maintenance` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoneStatus {
    pub agent_id: AgentId,
    pub name: String,
    pub at_unix_ms: u64,
}

/// Everything under maintenance (`GET /api/v1/maintenance`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MaintenanceView {
    pub agents: Vec<MaintenanceStatus>,
    pub gone: Vec<GoneStatus>,
}

impl Master {
    /// Unix milliseconds at master time `t` (learned from the shell at recovery).
    fn unix_at(&self, t: Millis) -> u64 {
        (t as i128 + self.unix_offset_ms as i128).max(0) as u64
    }

    /// Restores drains and gone agents from the registry when this master becomes the leader
    /// (call before [`Master::recover`]); `unix_now` is the wall clock at `now`, used to turn
    /// persisted deadlines back into master time.
    pub fn restore_maintenance(&mut self, registry: &Registry, now: Millis, unix_now: u64) {
        self.unix_offset_ms = unix_now as i64 - now as i64;
        for m in registry.maintenance.values() {
            let deadline = m.deadline_unix_ms.map(|d| now + d.saturating_sub(unix_now));
            self.drains.insert(
                m.agent_id,
                Drain {
                    name: m.name.clone(),
                    started_unix_ms: m.started_unix_ms,
                    deadline,
                    deadline_unix_ms: m.deadline_unix_ms,
                    drained: m.drained,
                    reason: m.reason.clone(),
                    notified: HashMap::new(),
                    killed_at: None,
                },
            );
        }
        for g in registry.gone.values() {
            self.gone.insert(g.agent_id, g.clone());
        }
        if !registry.maintenance.is_empty() || !registry.gone.is_empty() {
            tracing::info!(
                draining = registry.maintenance.len(),
                gone = registry.gone.len(),
                "recovered maintenance state"
            );
        }
    }

    /// Applies an operator's maintenance request.
    pub fn maintenance(
        &mut self,
        cmd: MaintenanceCommand,
        now: Millis,
    ) -> Result<Vec<Output>, MaintenanceError> {
        let mut out = Vec::new();
        match cmd {
            MaintenanceCommand::Drain {
                agent,
                deadline_secs,
            } => {
                let (id, _) = self.resolve_agent(&agent)?;
                if let Some(s) = deadline_secs.filter(|s| *s > MAX_DRAIN_DEADLINE_SECS) {
                    return Err(MaintenanceError::DeadlineTooLong(s));
                }
                self.start_drain(
                    id,
                    deadline_secs.map(|s| s * 1000),
                    "operator".into(),
                    now,
                    &mut out,
                );
            }
            MaintenanceCommand::Undrain { agent } => {
                let (id, _) = self.resolve_agent(&agent)?;
                if self.drains.remove(&id).is_none() {
                    return Err(MaintenanceError::NotDraining(agent));
                }
                // Offered again unless an operator deactivated it as well.
                let active = self.agents.get(&id).is_none_or(|a| a.active);
                for rec in self.allocator.set_agent_active(id, active) {
                    self.send_rescind(&rec, &mut out);
                }
                self.allocation_pending = true;
                tracing::info!(agent = %id, "agent undrained: offered again");
                out.push(Output::Persist(Mutation::RemoveMaintenance(id)));
            }
            MaintenanceCommand::MarkGone { agent } => {
                let (id, name) = self.resolve_agent(&agent)?;
                let record = GoneRecord {
                    agent_id: id,
                    name: name.clone(),
                    at_unix_ms: self.unix_at(now),
                };
                self.gone.insert(id, record.clone());
                out.push(Output::Persist(Mutation::PutGone(record)));
                if self.agents.contains_key(&id) {
                    self.remove_agent(id, "agent marked gone by an operator", now, &mut out);
                } else if self
                    .recovered_agents
                    .get(&id)
                    .is_some_and(|r| r.unreachable.is_some())
                {
                    self.agent_gone(id, "marked gone by an operator", now, &mut out);
                } else if let Some(rec) = self.recovered_agents.remove(&id) {
                    if self.recovered_by_name.get(&rec.record.name) == Some(&id) {
                        self.recovered_by_name.remove(&rec.record.name);
                    }
                    for role in rec.dynamic.keys() {
                        out.push(Output::Persist(Mutation::RemoveReservation {
                            agent_id: id,
                            role: role.clone(),
                        }));
                    }
                    out.push(Output::Persist(Mutation::RemoveAgent(id)));
                }
                self.forget_drain(id, &mut out);
                tracing::warn!(agent = %name, %id, "agent marked gone");
            }
        }
        Ok(out)
    }

    /// The agent an operator named (id or name; registered, or expected back after a
    /// failover), with its name.
    fn resolve_agent(&self, agent: &str) -> Result<(AgentId, String), MaintenanceError> {
        let unknown = || MaintenanceError::UnknownAgent(truncated(agent, 128).to_string());
        let id = match agent.parse::<AgentId>() {
            Ok(id) => id,
            Err(_) => *self
                .agents_by_name
                .get(agent)
                .or_else(|| self.recovered_by_name.get(agent))
                .ok_or_else(unknown)?,
        };
        if let Some(a) = self.agents.get(&id) {
            return Ok((id, a.name.clone()));
        }
        if let Some(r) = self.recovered_agents.get(&id) {
            return Ok((id, r.record.name.clone()));
        }
        Err(unknown())
    }

    /// Starts (or re-times) a drain of `id`; `in_ms` until the kill, never when `None`.
    fn start_drain(
        &mut self,
        id: AgentId,
        in_ms: Option<u64>,
        reason: String,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let name = self
            .agents
            .get(&id)
            .map(|a| a.name.clone())
            .or_else(|| {
                self.recovered_agents
                    .get(&id)
                    .map(|r| r.record.name.clone())
            })
            .unwrap_or_default();
        let deadline = in_ms.map(|ms| now + ms);
        let deadline_unix_ms = deadline.map(|d| self.unix_at(d));
        let started_unix_ms = self.unix_at(now);
        let drain = self.drains.entry(id).or_insert_with(|| Drain {
            name: name.clone(),
            started_unix_ms,
            deadline,
            deadline_unix_ms,
            drained: false,
            reason: String::new(),
            notified: HashMap::new(),
            killed_at: None,
        });
        drain.deadline = deadline;
        drain.deadline_unix_ms = deadline_unix_ms;
        drain.reason = truncated(&reason, MAX_REASON).to_string();
        // A new deadline is news to every framework.
        drain.notified.clear();
        drain.killed_at = None;
        let record = drain.record(id);
        tracing::info!(agent = %name, %id, deadline_in_ms = ?in_ms, reason = %record.reason, "draining agent");
        for rec in self.allocator.set_agent_active(id, false) {
            self.send_rescind(&rec, out);
        }
        out.push(Output::Persist(Mutation::SetMaintenance(record)));
        self.maintenance_step(now, out);
    }

    /// A spot-termination notice from an agent: a drain with that deadline (a later deadline
    /// than one already set is not taken: the host goes away when it goes away).
    pub(super) fn termination_notice(
        &mut self,
        id: AgentId,
        in_ms: u64,
        reason: String,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let in_ms = in_ms.min(MAX_DRAIN_DEADLINE_SECS * 1000);
        if let Some(d) = self.drains.get(&id) {
            if d.deadline.is_some_and(|t| t <= now + in_ms) {
                return;
            }
        }
        let reason = if reason.trim().is_empty() {
            "termination notice".to_string()
        } else {
            format!("termination notice: {}", truncated(&reason, MAX_REASON))
        };
        self.start_drain(id, Some(in_ms), reason, now, out);
    }

    /// Keeps an agent under maintenance unoffered when it (re-)registers.
    pub(super) fn maintenance_after_register(&mut self, id: AgentId, out: &mut Vec<Output>) {
        if self.drains.contains_key(&id) {
            for rec in self.allocator.set_agent_active(id, false) {
                self.send_rescind(&rec, out);
            }
        }
    }

    /// Why an agent claiming `claimed` may not register: it was marked gone.
    pub(super) fn gone_refusal(&self, claimed: Option<AgentId>) -> Option<String> {
        let id = claimed?;
        let name = &self.gone.get(&id)?.name;
        Some(format!(
            "agent id {id} (agent {name:?}) was marked gone by an operator and may not \
             re-register; wipe the agent's work dir to join as a new agent"
        ))
    }

    /// An agent left the master for good (lost or gone): its maintenance ends.
    pub(super) fn forget_drain(&mut self, id: AgentId, out: &mut Vec<Output>) {
        if self.drains.remove(&id).is_some() {
            out.push(Output::Persist(Mutation::RemoveMaintenance(id)));
        }
    }

    /// Drives every drain: notices to frameworks not yet told (on their current connection),
    /// kills past the deadline, and `DRAINING` -> `DRAINED` once the agent holds no task.
    pub(super) fn maintenance_step(&mut self, now: Millis, out: &mut Vec<Output>) {
        let ids: Vec<AgentId> = self
            .drains
            .iter()
            .filter(|(_, d)| !d.drained)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(agent) = self.agents.get(&id) else {
                continue; // expected back after a failover
            };
            let agent_conn = agent.conn;
            let hostname = agent.hostname.clone();
            let empty = agent.tasks.is_empty();
            let mut by_framework: BTreeMap<FrameworkId, Vec<TaskId>> = BTreeMap::new();
            for tid in &agent.tasks {
                if let Some(t) = self.tasks.get(tid).filter(|t| !t.state.is_terminal()) {
                    by_framework.entry(t.framework).or_default().push(*tid);
                }
            }
            let Some(drain) = self.drains.get_mut(&id) else {
                continue;
            };
            for (fw, mut task_ids) in by_framework.clone() {
                let Some(conn) = self.frameworks.get(&fw).and_then(|f| f.conn) else {
                    continue;
                };
                if drain.notified.get(&fw) == Some(&conn) {
                    continue;
                }
                task_ids.sort();
                drain.notified.insert(fw, conn);
                out.push(Output::ToFramework(
                    conn,
                    MasterToFramework::DrainNotice(DrainNotice {
                        agent_id: id,
                        hostname: hostname.clone(),
                        deadline_in_ms: drain.deadline.map(|d| d.saturating_sub(now)),
                        deadline_unix_ms: drain.deadline_unix_ms,
                        task_ids,
                        reason: drain.reason.clone(),
                    }),
                ));
            }
            let due = drain.deadline.is_some_and(|d| now >= d)
                && drain
                    .killed_at
                    .is_none_or(|k| now.saturating_sub(k) >= DRAIN_KILL_RETRY_MS);
            if due && !by_framework.is_empty() {
                if let Some(conn) = agent_conn {
                    drain.killed_at = Some(now);
                    tracing::info!(agent = %drain.name, tasks = by_framework.values().map(Vec::len).sum::<usize>(),
                        "drain deadline passed; killing the tasks left");
                    for (fw, tids) in &by_framework {
                        for tid in tids {
                            // Its KILLED update then says why (agent_update).
                            if let Some(t) = self.tasks.get_mut(tid) {
                                t.kill_reason = Some(TaskReason::DrainDeadline);
                            }
                            out.push(Output::ToAgent(
                                conn,
                                MasterToAgent::KillTask {
                                    framework_id: *fw,
                                    task_id: *tid,
                                },
                            ));
                        }
                    }
                }
            }
            if empty {
                drain.drained = true;
                tracing::info!(agent = %drain.name, "agent drained");
                out.push(Output::Persist(Mutation::SetMaintenance(drain.record(id))));
            }
        }
    }

    /// The next time after `now` a drain needs the core (a deadline, or a kill to resend), if
    /// any. Never a time already past: a deadline that passed while its agent was away is
    /// acted on at the next tick after the agent is back (re-registration schedules one).
    pub fn next_maintenance_deadline(&self, now: Millis) -> Option<Millis> {
        self.drains
            .values()
            .filter(|d| !d.drained)
            .filter_map(|d| match d.killed_at {
                Some(k) => Some(k + DRAIN_KILL_RETRY_MS),
                None => d.deadline,
            })
            .filter(|t| *t > now)
            .min()
    }

    /// Everything under maintenance, for `GET /api/v1/maintenance`.
    pub fn maintenance_view(&self, now: Millis) -> MaintenanceView {
        let agents = self
            .drains
            .iter()
            .map(|(id, d)| {
                let agent = self.agents.get(id);
                let mut tasks: Vec<TaskId> = agent
                    .map(|a| a.tasks.iter().copied().collect())
                    .unwrap_or_default();
                tasks.sort();
                let tasks_remaining = tasks.len();
                tasks.truncate(MAX_LISTED_TASKS);
                let mut frameworks_notified: Vec<FrameworkId> =
                    d.notified.keys().copied().collect();
                frameworks_notified.sort();
                MaintenanceStatus {
                    agent_id: *id,
                    name: d.name.clone(),
                    state: if d.drained { "DRAINED" } else { "DRAINING" },
                    reason: d.reason.clone(),
                    connected: agent.is_some_and(|a| a.conn.is_some()),
                    started_unix_ms: d.started_unix_ms,
                    deadline_unix_ms: d.deadline_unix_ms,
                    deadline_in_ms: d.deadline.map(|t| t.saturating_sub(now)),
                    tasks_remaining,
                    tasks,
                    frameworks_notified,
                    killing: d.killed_at.is_some(),
                }
            })
            .collect();
        let gone = self
            .gone
            .values()
            .map(|g| GoneStatus {
                agent_id: g.agent_id,
                name: g.name.clone(),
                at_unix_ms: g.at_unix_ms,
            })
            .collect();
        MaintenanceView { agents, gone }
    }

    /// `DRAINING` / `DRAINED` for an agent under maintenance (for views).
    pub fn drain_state(&self, id: AgentId) -> Option<&'static str> {
        self.drains
            .get(&id)
            .map(|d| if d.drained { "DRAINED" } else { "DRAINING" })
    }
}
