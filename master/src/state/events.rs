//! Cluster events for the operator event stream (`GET /api/v1/events`, Mesos SUBSCRIBE): the
//! state machine records what changed (tasks, agents, frameworks) as it handles inputs; the
//! shell takes them after every batch ([`Master::take_events`]) and broadcasts them.
//!
//! The queue is bounded ([`MAX_PENDING_EVENTS`]): a core nobody drains (unit tests, a shell
//! that fell behind) drops the oldest and counts them, never grows without bound.

use serde::Serialize;

use super::*;

/// Events kept between two [`Master::take_events`] calls; older ones are dropped.
pub const MAX_PENDING_EVENTS: usize = 16_384;

/// One change an operator sees on the event stream (`{"type": "task_updated", ...}`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClusterEvent {
    /// A task was launched or changed state.
    TaskUpdated {
        task_id: String,
        name: String,
        framework_id: String,
        agent_id: String,
        state: String,
        reason: Option<String>,
        message: String,
        /// The role whose resources it holds, the user it runs as (when it names one) and
        /// its resources: what usage reports add up (`crate::server::usage`).
        role: String,
        user: Option<String>,
        resources: Resources,
    },
    /// An agent registered for the first time (or again after it was removed, or with a new
    /// leader). Its total resources and price (the `price_per_hour` attribute, when valid) are
    /// what usage reports attribute cost with (`crate::server::usage`).
    AgentAdded {
        agent_id: String,
        name: String,
        total: Resources,
        #[serde(skip_serializing_if = "Option::is_none")]
        price_per_hour: Option<f64>,
    },
    /// An agent changed: (re)connected, disconnected, deactivated, reactivated, a GPU's health.
    AgentUpdated {
        agent_id: String,
        name: String,
        connected: bool,
        active: bool,
        what: String,
        total: Resources,
        #[serde(skip_serializing_if = "Option::is_none")]
        price_per_hour: Option<f64>,
    },
    /// An agent was removed (lost, or marked gone by an operator).
    AgentRemoved {
        agent_id: String,
        name: String,
        reason: String,
    },
    /// A framework subscribed for the first time.
    FrameworkAdded {
        framework_id: String,
        name: String,
        principal: String,
    },
    /// A framework re-subscribed or disconnected.
    FrameworkUpdated {
        framework_id: String,
        name: String,
        connected: bool,
    },
    /// A framework was removed (teardown or failover timeout).
    FrameworkRemoved {
        framework_id: String,
        name: String,
        reason: String,
    },
    /// An operator changed a role's weight or quota, or a reservation.
    RoleUpdated { role: String, what: String },
}

/// The events recorded since the last drain.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    events: VecDeque<ClusterEvent>,
    /// Events dropped because nobody drained the queue in time.
    pub dropped: u64,
    /// Nobody listens ([`Master::record_events`]`(false)`): events are not even built.
    unheard: bool,
}

impl Master {
    /// Records an event for the stream.
    /// Whether the shell has event subscribers: when it has none, events are not built at all
    /// (a task update would otherwise format three ids and copy four strings for nothing).
    /// Recorded by default.
    pub fn record_events(&mut self, on: bool) {
        self.events.unheard = !on;
    }

    pub(super) fn emit(&mut self, e: ClusterEvent) {
        let q = &mut self.events;
        if q.unheard {
            return;
        }
        if q.events.len() >= MAX_PENDING_EVENTS {
            q.events.pop_front();
            q.dropped += 1;
        }
        q.events.push_back(e);
    }

    /// The events recorded since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<ClusterEvent> {
        self.events.events.drain(..).collect()
    }

    /// Events dropped because [`Master::take_events`] was not called in time.
    pub fn dropped_events(&self) -> u64 {
        self.events.dropped
    }

    /// Records the task's current state.
    pub(super) fn emit_task(&mut self, tid: TaskId) {
        if self.events.unheard {
            return;
        }
        let Some(t) = self.tasks.get(&tid) else {
            return;
        };
        let e = ClusterEvent::TaskUpdated {
            task_id: tid.to_string(),
            name: t.info.name.clone(),
            framework_id: t.framework.to_string(),
            agent_id: t.agent.to_string(),
            state: t.state.as_str().to_string(),
            reason: t.reason.map(|r| r.as_str().to_string()),
            message: t.last_message.clone(),
            role: t.role.clone(),
            user: t.info.command.user.clone(),
            resources: t.info.resources.clone(),
        };
        self.emit(e);
    }

    /// Records the agent's current connection and activity.
    pub(super) fn emit_agent(&mut self, id: AgentId, what: &str) {
        if self.events.unheard {
            return;
        }
        let Some(a) = self.agents.get(&id) else {
            return;
        };
        let (total, price_per_hour) = self.agent_price(id);
        let e = ClusterEvent::AgentUpdated {
            agent_id: id.to_string(),
            name: a.name.clone(),
            connected: a.conn.is_some(),
            active: a.active,
            what: what.to_string(),
            total,
            price_per_hour,
        };
        self.emit(e);
    }

    /// The agent's total resources (unreserved plus reserved) and its price per hour (the
    /// `price_per_hour` attribute; `None` when absent or not a finite number ≥ 0).
    pub(super) fn agent_price(&self, id: AgentId) -> (Resources, Option<f64>) {
        let Some(a) = self.agents.get(&id) else {
            return (Resources::new(), None);
        };
        let mut total = a.resources.clone();
        for r in a.reserved.values() {
            total.add_assign(r);
        }
        let price = a
            .attributes
            .get(gantry_placement::cost::PRICE_ATTRIBUTE)
            .and_then(|p| gantry_placement::cost::parse_price(p).ok());
        (total, price)
    }

    /// Records the framework's current connection.
    pub(super) fn emit_framework(&mut self, id: FrameworkId) {
        let Some(f) = self.frameworks.get(&id) else {
            return;
        };
        let e = ClusterEvent::FrameworkUpdated {
            framework_id: id.to_string(),
            name: f.name.clone(),
            connected: f.conn.is_some(),
        };
        self.emit(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_bounded_and_drained() {
        let mut m = Master::new(MasterConfig::default(), 1);
        for i in 0..MAX_PENDING_EVENTS + 10 {
            m.emit(ClusterEvent::RoleUpdated {
                role: format!("r{i}"),
                what: "weight".into(),
            });
        }
        assert_eq!(m.dropped_events(), 10);
        let events = m.take_events();
        assert_eq!(events.len(), MAX_PENDING_EVENTS);
        assert_eq!(
            events[0],
            ClusterEvent::RoleUpdated {
                role: "r10".into(),
                what: "weight".into()
            }
        );
        assert!(m.take_events().is_empty());
    }

    #[test]
    fn events_serialize_with_a_type_tag() {
        let e = ClusterEvent::AgentRemoved {
            agent_id: "a".into(),
            name: "n".into(),
            reason: "gone".into(),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "agent_removed");
        assert_eq!(v["reason"], "gone");
    }
}
