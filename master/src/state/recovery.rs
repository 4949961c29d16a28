//! Recovery: restoring the persistent registry when this master becomes the leader.

use super::*;

/// An agent known from the registry (after a failover) that has not re-registered yet.
#[derive(Debug)]
pub(super) struct RecoveredAgent {
    /// What the registry holds about it.
    pub(super) record: AgentRecord,
    /// Its dynamic reservations, per role.
    pub(super) dynamic: BTreeMap<String, Resources>,
    /// When it must be back by: then an agent awaited after a failover becomes unreachable,
    /// and an unreachable one is gone.
    pub(super) deadline: Millis,
    /// Set once it is out of touch past its re-register timeout (docs/ha.md, "Partitions").
    pub(super) unreachable: Option<Unreachable>,
    /// Whether the tasks it reports when it comes back may be adopted: this master never knew
    /// its tasks (it is in the registry from before a failover). An agent that became
    /// unreachable under this master has its tasks in the master already; anything else it
    /// reports is killed.
    pub(super) adopt: bool,
}

/// An agent out of touch past its re-register timeout.
#[derive(Debug, Default)]
pub(super) struct Unreachable {
    /// When it was declared unreachable.
    pub(super) since: Millis,
    /// Its tasks the master keeps as `UNREACHABLE` (those of partition-aware frameworks, and
    /// terminal ones whose update is not acknowledged yet).
    pub(super) tasks: HashSet<TaskId>,
    /// Of those, the ones their framework asked to kill while the agent was away (sent when
    /// it comes back).
    pub(super) kills: HashSet<TaskId>,
}

impl Master {
    /// Agents expected back after a failover (not yet unreachable).
    pub(super) fn awaited_agents(&self) -> usize {
        self.recovered_agents
            .values()
            .filter(|r| r.unreachable.is_none())
            .count()
    }

    /// Agents out of touch past their re-register timeout, still expected back within the
    /// unreachable timeout.
    pub(super) fn unreachable_agents(&self) -> usize {
        self.recovered_agents.len() - self.awaited_agents()
    }

    /// Restores the persistent registry when this master becomes the leader: frameworks (as
    /// disconnected, so their failover timeouts run from now), weights, quotas, and the agents
    /// expected to re-register (with their dynamic reservations) within the re-register
    /// timeout. Tasks are rebuilt from the agents' re-registrations.
    pub fn recover(&mut self, registry: Registry, now: Millis) {
        // Resource-seconds start here: what this master allocates from now on.
        self.allocator.accrue(now);
        for (role, weight) in &registry.weights {
            self.allocator.set_weight(role, *weight);
        }
        for (role, q) in &registry.quotas {
            let g = Some(q.guarantee.clone()).filter(|g| !g.is_empty());
            let l = Some(q.limit.clone()).filter(|l| !l.is_empty());
            if let Err(e) = self.allocator.set_quota(role, g, l) {
                tracing::error!(%role, "persisted quota not applied: {e}");
            }
        }
        for f in registry.frameworks.values() {
            let gpu = false;
            self.allocator
                .add_framework(f.id, &f.name, &f.roles, gpu, None);
            self.allocator.suppress(f.id, None);
            self.frameworks.insert(
                f.id,
                FrameworkRec {
                    id: f.id,
                    name: f.name.clone(),
                    principal: f.principal.clone(),
                    roles: f.roles.clone(),
                    capabilities: if f.partition_aware {
                        vec![Capability::PartitionAware]
                    } else {
                        Vec::new()
                    },
                    failover_timeout_ms: (f.failover_timeout_secs.clamp(0.0, 365.0 * 86400.0)
                        * 1000.0) as u64,
                    conn: None,
                    disconnected_at: Some(now),
                    tasks: HashSet::new(),
                },
            );
        }
        let deadline = now + self.config.agent_reregister_timeout_ms;
        for a in registry.agents.values() {
            let dynamic = registry
                .reservations
                .get(&a.id)
                .cloned()
                .unwrap_or_default();
            self.recovered_by_name.insert(a.name.clone(), a.id);
            self.recovered_agents.insert(
                a.id,
                RecoveredAgent {
                    record: a.clone(),
                    dynamic,
                    deadline,
                    unreachable: None,
                    adopt: true,
                },
            );
        }
        self.agent_timers_changed();
        tracing::info!(
            frameworks = registry.frameworks.len(),
            agents = registry.agents.len(),
            weights = registry.weights.len(),
            quotas = registry.quotas.len(),
            "recovered the registry; waiting for agents to re-register"
        );
    }
}

/// Moves an agent's dynamic reservations out of its unreserved resources into `reserved`.
pub(super) fn with_dynamic(
    mut resources: Resources,
    mut reserved: BTreeMap<String, Resources>,
    dynamic: &BTreeMap<String, Resources>,
) -> (Resources, BTreeMap<String, Resources>) {
    for (role, r) in dynamic {
        let take = resources.elementwise_min(r);
        resources = resources.saturating_sub(&take);
        reserved.entry(role.clone()).or_default().add_assign(&take);
    }
    (resources, reserved)
}
