//! What `/metrics` shows of the state machine: a pure snapshot (counts by state, resources by
//! kind and state, shares, quotas, counters and resource-seconds). The shell renders it in the
//! Prometheus text format (`server/metrics.rs`); nothing here knows that format.

use std::collections::BTreeMap;

use gantry_proto::Resources;
use gantry_proto::TaskState;

use super::Master;
use crate::allocator::{AllocatorMetrics, Millis, ResourceSeconds};

/// Every task state, so a state with no task shows as 0 (not as a missing series).
const TASK_STATES: [TaskState; 10] = [
    TaskState::Staging,
    TaskState::Starting,
    TaskState::Running,
    TaskState::Finished,
    TaskState::Failed,
    TaskState::Killed,
    TaskState::Lost,
    TaskState::Error,
    TaskState::Unreachable,
    TaskState::Gone,
];

/// A framework's dominant share in one of its roles.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameworkShare {
    pub id: String,
    pub name: String,
    pub role: String,
    pub share: f64,
}

/// The state machine's numbers for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct MetricsSnapshot {
    /// Tasks the master tracks (running, or ended and not yet acknowledged), by state.
    pub tasks: BTreeMap<&'static str, u64>,
    /// Agents by state: `connected`, `disconnected` (within the re-register timeout),
    /// `recovering` (known from the registry after a failover, not back yet).
    pub agents: BTreeMap<&'static str, u64>,
    /// Frameworks by state: `connected`, `disconnected` (within their failover timeout),
    /// `completed` (removed, kept in the bounded history).
    pub frameworks: BTreeMap<&'static str, u64>,
    /// Per state (`total`, `offered`, `used`, `reserved`): resources summed over agents.
    pub resources: BTreeMap<&'static str, Resources>,
    /// Shares, quotas and offer counters of the allocator.
    pub allocator: AllocatorMetrics,
    /// Per framework and role.
    pub framework_shares: Vec<FrameworkShare>,
    /// Allocations integrated over time.
    pub resource_seconds: Vec<ResourceSeconds>,
    /// Status updates agents sent again that the master already had (retransmissions).
    pub status_update_retries: u64,
    /// Tasks completed since this master leads, by final state (every terminal state listed).
    pub tasks_completed: BTreeMap<&'static str, u64>,
}

impl Master {
    /// A snapshot for `/metrics` at `now` (accrues resource-seconds up to `now` first).
    pub fn metrics(&mut self, now: Millis) -> MetricsSnapshot {
        self.allocator.accrue(now);
        let mut tasks: BTreeMap<&'static str, u64> =
            TASK_STATES.iter().map(|s| (s.as_str(), 0)).collect();
        let mut used = Resources::new();
        for t in self.tasks.values() {
            *tasks.entry(t.state.as_str()).or_default() += 1;
            if !t.recovered {
                used.add_assign(&t.info.resources);
            }
        }
        let mut agents: BTreeMap<&'static str, u64> = [
            ("connected", 0),
            ("disconnected", 0),
            ("recovering", self.awaited_agents() as u64),
            ("unreachable", self.unreachable_agents() as u64),
        ]
        .into();
        let mut total = Resources::new();
        let mut reserved = Resources::new();
        for a in self.agents.values() {
            let state = if a.conn.is_some() {
                "connected"
            } else {
                "disconnected"
            };
            *agents.entry(state).or_default() += 1;
            total.add_assign(&a.resources);
            for r in a.reserved.values() {
                total.add_assign(r);
                reserved.add_assign(r);
            }
        }
        let mut offered = Resources::new();
        for o in self.allocator.outstanding_offers() {
            offered.add_assign(&o.resources.total());
        }
        let mut frameworks: BTreeMap<&'static str, u64> = [
            ("connected", 0),
            ("disconnected", 0),
            ("completed", self.completed_frameworks.len() as u64),
        ]
        .into();
        let mut framework_shares = Vec::new();
        for f in self.frameworks.values() {
            let state = if f.conn.is_some() {
                "connected"
            } else {
                "disconnected"
            };
            *frameworks.entry(state).or_default() += 1;
            for (role, share) in self.allocator.framework_role_shares(f.id) {
                framework_shares.push(FrameworkShare {
                    id: f.id.to_string(),
                    name: f.name.clone(),
                    role,
                    share,
                });
            }
        }
        framework_shares.sort_by(|a, b| (&a.name, &a.id, &a.role).cmp(&(&b.name, &b.id, &b.role)));
        MetricsSnapshot {
            tasks,
            agents,
            frameworks,
            resources: [
                ("total", total),
                ("offered", offered),
                ("used", used),
                ("reserved", reserved),
            ]
            .into(),
            allocator: self.allocator.metrics(),
            framework_shares,
            resource_seconds: self.allocator.resource_seconds(),
            status_update_retries: self.status_update_retries,
            tasks_completed: TASK_STATES
                .iter()
                .filter(|s| s.is_terminal())
                .map(|s| {
                    let name = s.as_str();
                    (name, self.tasks_completed.get(name).copied().unwrap_or(0))
                })
                .collect(),
        }
    }
}
