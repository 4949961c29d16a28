//! The operator's view of the master: the JSON served at `GET /state` (see docs/operations.md).

use std::collections::BTreeMap;

use gantry_sdk::protocol::{Attributes, GpuInfo, GpuSample, TaskUsage};
use gantry_sdk::Resources;
use serde::Serialize;

use super::Master;
use crate::allocator::Millis;

#[derive(Debug, Serialize)]
pub struct StateView {
    pub epoch: u64,
    pub leader: bool,
    pub uptime_ms: Millis,
    pub agents: Vec<AgentView>,
    pub frameworks: Vec<FrameworkView>,
    pub tasks: Vec<TaskView>,
    pub completed_tasks: Vec<TaskView>,
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
}

#[derive(Debug, Serialize)]
pub struct FrameworkView {
    pub id: String,
    pub name: String,
    pub principal: String,
    pub roles: Vec<String>,
    pub capabilities: Vec<gantry_sdk::protocol::Capability>,
    pub connected: bool,
    /// Held by tasks.
    pub used: Resources,
    /// Offered plus used (what fairness counts).
    pub allocated: Resources,
    pub dominant_share: f64,
    pub active_tasks: usize,
}

#[derive(Debug, Serialize)]
pub struct TaskView {
    pub id: String,
    pub name: String,
    pub framework_id: String,
    pub agent_id: String,
    pub state: String,
    pub resources: Resources,
    pub message: String,
    pub usage: Option<TaskUsage>,
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
    /// A consistent snapshot for `/state`.
    pub fn view(&self, now: Millis) -> StateView {
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
                }
            })
            .collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
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
            .iter()
            .map(|(id, t)| TaskView {
                id: id.to_string(),
                name: t.info.name.clone(),
                framework_id: t.framework.to_string(),
                agent_id: t.agent.to_string(),
                state: t.state.as_str().to_string(),
                resources: t.info.resources.clone(),
                message: t.last_message.clone(),
                usage: t.usage.clone(),
            })
            .collect();
        tasks.sort_by(|a, b| a.id.cmp(&b.id));
        let completed_tasks = self
            .completed
            .iter()
            .map(|(id, fw, agent, state, res)| TaskView {
                id: id.to_string(),
                name: String::new(),
                framework_id: fw.to_string(),
                agent_id: agent.to_string(),
                state: state.as_str().to_string(),
                resources: res.clone(),
                message: String::new(),
                usage: None,
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
            epoch: self.config.epoch,
            leader: true,
            uptime_ms: now,
            agents,
            frameworks,
            tasks,
            completed_tasks,
            offers,
            allocator,
        }
    }
}
