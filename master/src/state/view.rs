//! The operator's view of the master: the JSON served at `GET /state` (see docs/operations.md).

use std::collections::BTreeMap;

use gantry_proto::Resources;
use gantry_proto::{Attributes, GpuInfo, GpuSample, TaskUsage};
use serde::Serialize;

use super::{Master, TaskRecord};
use crate::allocator::Millis;

#[derive(Debug, Serialize)]
pub struct StateView {
    pub epoch: u64,
    pub leader: bool,
    pub uptime_ms: Millis,
    pub agents: Vec<AgentView>,
    /// Agents out of touch past their re-register timeout that may still come back
    /// (docs/ha.md, "Partitions"), by name.
    pub unreachable_agents: Vec<UnreachableAgentView>,
    pub frameworks: Vec<FrameworkView>,
    /// Tasks not yet completed (running, or ended with the end not yet acknowledged).
    pub tasks: Vec<TaskView>,
    /// Completed tasks of active and completed frameworks, oldest end first (bounded per
    /// framework by `--max-completed-tasks-per-framework`).
    pub completed_tasks: Vec<TaskView>,
    /// Removed frameworks, oldest first (bounded by `--max-completed-frameworks`).
    pub completed_frameworks: Vec<CompletedFrameworkView>,
    pub offers: Vec<OfferView>,
    pub allocator: serde_json::Value,
}

#[derive(Debug, Serialize)]
pub struct AgentView {
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub address: String,
    pub connected: bool,
    /// Unreserved plus reserved.
    pub total: Resources,
    pub reserved: BTreeMap<String, Resources>,
    /// Held by tasks.
    pub used: Resources,
    /// Outstanding offers.
    pub offered: Resources,
    pub attributes: Attributes,
    pub gpus: Vec<GpuInfo>,
    pub gpu_samples: Vec<GpuSample>,
    /// The user its tasks run as when their command names none (`--task-user`).
    pub task_user: String,
    /// What is free of each healthy GPU (fraction and memory), as offers show it.
    pub gpu_free: Vec<gantry_proto::GpuFree>,
    /// False while an operator has deactivated it (nothing of it is offered).
    pub active: bool,
    /// `DRAINING` or `DRAINED` while under maintenance (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<&'static str>,
}

/// An unreachable agent: its tasks are `UNREACHABLE` until it comes back or `gone_at_ms`.
#[derive(Debug, Serialize)]
pub struct UnreachableAgentView {
    pub id: String,
    pub name: String,
    pub hostname: String,
    /// When it was declared unreachable (Unix milliseconds).
    pub since_ms: u64,
    /// When its tasks become `GONE` unless it is back (Unix milliseconds).
    pub gone_at_ms: u64,
    /// Its tasks kept as `UNREACHABLE` (or ended, their update not yet acknowledged).
    pub tasks: usize,
}

#[derive(Debug, Serialize)]
pub struct FrameworkView {
    pub id: String,
    pub name: String,
    pub principal: String,
    pub roles: Vec<String>,
    pub capabilities: Vec<gantry_proto::Capability>,
    pub connected: bool,
    /// Held by tasks.
    pub used: Resources,
    /// Offered plus used (what fairness counts).
    pub allocated: Resources,
    pub dominant_share: f64,
    pub active_tasks: usize,
}

/// One task, running or completed. Times are Unix milliseconds (as the master saw them).
#[derive(Debug, Serialize)]
pub struct TaskView {
    pub id: String,
    pub name: String,
    pub framework_id: String,
    pub agent_id: String,
    /// The role whose resources the task holds.
    pub role: String,
    /// The Unix user it runs as.
    pub user: Option<String>,
    pub resources: Resources,
    /// GPUs (UUIDs) the agent gave it.
    pub gpus: Vec<String>,
    /// Host ports the agent gave it (its `ports:K`; also in its `PORT`, `PORT0`..).
    pub ports: Vec<u16>,
    pub state: String,
    /// Why it is in this state, by kind (`memory-limit`, `command-failed`, ...).
    pub reason: Option<String>,
    pub message: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub staged_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    pub usage: Option<TaskUsage>,
}

/// A framework that was removed (teardown or failover timeout).
#[derive(Debug, Serialize)]
pub struct CompletedFrameworkView {
    pub id: String,
    pub name: String,
    pub principal: String,
    pub roles: Vec<String>,
    pub removed_at_ms: u64,
    pub reason: String,
}

impl TaskView {
    /// `wall` converts the master's clock to Unix milliseconds.
    fn new(r: &TaskRecord, usage: Option<TaskUsage>, wall: impl Fn(Millis) -> u64) -> Self {
        TaskView {
            id: r.id.to_string(),
            name: r.name.clone(),
            framework_id: r.framework.to_string(),
            agent_id: if r.agent == super::NO_AGENT {
                String::new()
            } else {
                r.agent.to_string()
            },
            role: r.role.clone(),
            user: r.user.clone(),
            resources: r.resources.clone(),
            gpus: r.gpus.clone(),
            ports: r.ports.clone(),
            state: r.state.as_str().to_string(),
            reason: r.reason.map(|r| r.as_str().to_string()),
            message: r.message.clone(),
            exit_code: r.exit_code,
            signal: r.signal,
            staged_at_ms: wall(r.staged_at),
            started_at_ms: r.started_at.map(&wall),
            ended_at_ms: r.ended_at.map(&wall),
            usage,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct OfferView {
    pub id: String,
    pub framework_id: String,
    pub agent_id: String,
    pub role: String,
    pub resources: Resources,
    pub reserved: BTreeMap<String, Resources>,
    pub age_ms: Millis,
}

impl Master {
    /// A consistent snapshot for `/state`. `unix_now_ms` is the wall clock at `now` (the core
    /// keeps its own clock; the view shows task times as Unix milliseconds).
    pub fn view(&self, now: Millis, unix_now_ms: u64) -> StateView {
        let wall = |t: Millis| unix_now_ms.saturating_sub(now.saturating_sub(t));
        // Offered resources per agent in one pass over the offers (not one sorted pass per
        // agent: with 10,000 agents and as many offers that blocked the core loop for seconds).
        let mut offered_on: std::collections::HashMap<_, Resources> =
            std::collections::HashMap::new();
        for o in self.allocator.outstanding_offers() {
            offered_on
                .entry(o.agent)
                .or_default()
                .add_assign(&o.resources.total());
        }
        let mut agents: Vec<AgentView> = self
            .agents
            .values()
            .map(|a| {
                let mut total = a.resources.clone();
                for r in a.reserved.values() {
                    total.add_assign(r);
                }
                let used = a
                    .tasks
                    .iter()
                    .filter_map(|t| self.tasks.get(t))
                    .filter(|t| !t.recovered)
                    .fold(Resources::new(), |acc, t| acc.plus(&t.info.resources));
                let offered = offered_on.get(&a.id).cloned().unwrap_or_default();
                AgentView {
                    id: a.id.to_string(),
                    name: a.name.clone(),
                    hostname: a.hostname.clone(),
                    address: a.address.clone(),
                    connected: a.conn.is_some(),
                    total,
                    reserved: a.reserved.clone(),
                    used,
                    offered,
                    attributes: a.attributes.clone(),
                    gpus: a.gpus.clone(),
                    gpu_samples: a.gpu_samples.clone(),
                    drain: self.drain_state(a.id),
                    task_user: a.task_user.clone(),
                    gpu_free: self.gpu_free(a.id),
                    active: a.active,
                }
            })
            .collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        let mut unreachable_agents: Vec<UnreachableAgentView> = self
            .recovered_agents
            .iter()
            .filter_map(|(id, r)| {
                let u = r.unreachable.as_ref()?;
                Some(UnreachableAgentView {
                    id: id.to_string(),
                    name: r.record.name.clone(),
                    hostname: r.record.hostname.clone(),
                    since_ms: wall(u.since),
                    gone_at_ms: unix_now_ms.saturating_add(r.deadline.saturating_sub(now)),
                    tasks: u.tasks.len(),
                })
            })
            .collect();
        unreachable_agents.sort_by(|a, b| a.name.cmp(&b.name));
        let mut frameworks: Vec<FrameworkView> = self
            .frameworks
            .values()
            .map(|f| {
                let used = f
                    .tasks
                    .iter()
                    .filter_map(|t| self.tasks.get(t))
                    .filter(|t| !t.recovered)
                    .fold(Resources::new(), |acc, t| acc.plus(&t.info.resources));
                FrameworkView {
                    id: f.id.to_string(),
                    name: f.name.clone(),
                    principal: f.principal.clone(),
                    roles: f.roles.clone(),
                    capabilities: f.capabilities.clone(),
                    connected: f.conn.is_some(),
                    used,
                    allocated: self.allocator.framework_allocated(f.id).total(),
                    dominant_share: self.allocator.framework_share(f.id),
                    active_tasks: f
                        .tasks
                        .iter()
                        .filter(|t| self.tasks.get(t).is_some_and(|t| !t.state.is_terminal()))
                        .count(),
                }
            })
            .collect();
        frameworks.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        let mut tasks: Vec<TaskView> = self
            .tasks
            .values()
            .map(|t| TaskView::new(&t.record(), t.usage.clone(), wall))
            .collect();
        tasks.sort_by(|a, b| a.id.cmp(&b.id));
        let mut completed: Vec<&TaskRecord> = self.completed.values().flatten().collect();
        completed.sort_by_key(|r| (r.ended_at, r.staged_at));
        let completed_tasks = completed
            .into_iter()
            .map(|r| TaskView::new(r, None, wall))
            .collect();
        let completed_frameworks = self
            .completed_frameworks
            .iter()
            .map(|f| CompletedFrameworkView {
                id: f.id.to_string(),
                name: f.name.clone(),
                principal: f.principal.clone(),
                roles: f.roles.clone(),
                removed_at_ms: wall(f.removed_at),
                reason: f.reason.clone(),
            })
            .collect();
        let offers = self
            .allocator
            .outstanding_offers()
            .map(|o| OfferView {
                id: o.id.to_string(),
                framework_id: o.framework.to_string(),
                agent_id: o.agent.to_string(),
                role: o.role.clone(),
                resources: o.resources.unreserved.clone(),
                reserved: o.resources.reserved.clone(),
                age_ms: now.saturating_sub(o.created_at),
            })
            .collect();
        let mut allocator =
            serde_json::to_value(self.allocator.metrics()).unwrap_or(serde_json::Value::Null);
        if let serde_json::Value::Object(m) = &mut allocator {
            m.insert("last_cycle_us".into(), self.last_cycle_us.into());
        }
        StateView {
            unreachable_agents,
            epoch: self.config.epoch,
            leader: true,
            uptime_ms: now,
            agents,
            frameworks,
            tasks,
            completed_tasks,
            completed_frameworks,
            offers,
            allocator,
        }
    }
}
