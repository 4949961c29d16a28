//! The autoscaler's pure core: observations and the time in, decisions out (no clock, no I/O).
//!
//! Each round the runtime calls [`Core::step`] with the time (milliseconds on any monotonic
//! clock) and an [`Observation`] (the master's unplaceable demand, and what the master says of
//! each node it knows), and carries out the [`Action`]s it returns, reporting back with
//! [`Core::created`], [`Core::create_failed`] and [`Core::deleted`]. A round decides, in order:
//!
//! 0. **Failed starts**: a node not registered within its pool's `provision_timeout` is
//!    deleted (counted in `provision_failures`).
//! 1. **Notices**: a node with a termination notice (spot) is drained with the notice's
//!    deadline (unless the master already drains it), counted as an interruption of its pool,
//!    and, when it held work (and was not already leaving), replaced by one node: of its pool, or of the pool's `fallback`
//!    once `spot_failures_before_fallback` interruptions came in a row.
//! 2. **Drained nodes** (draining, no tasks left) are deleted.
//! 3. **Scale-down**: a registered node idle (no resources in use) for the pool's
//!    `scale_down_cooldown`, whose pool keeps at least `min` nodes without it, is drained.
//!    Then **consolidation** (`consolidation = true`): a busy node whose tasks fit the other
//!    busy nodes' room is drained; else one whose tasks fit one node of a cheaper pool, or
//!    several nodes of a pool (same GPU model) that together cost less per hour, gets those
//!    nodes asked for (the biggest saving) and is drained once they register ("replace").
//! 4. **Minimum**: a pool below `min` gets nodes up to `min`.
//! 5. **Scale-up**: [`crate::plan::plan`] over the demand, with each pool's room (`max` minus
//!    every node it has, provisioning and draining ones included; none while its
//!    `scale_up_cooldown` runs) and its provisioning nodes; what no pool can hold is kept in
//!    [`Core::unfittable`] for reports, never scaled for.
//!
//! Cost: a node costs its pool's price from when its provider created it until it was
//! deleted ([`Core::report`]: node-seconds, cost, interruptions and scale events per pool).
//!
//! Module map: this file (the round, rules 0–5, and the report), `consolidation` (rule 3b).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::config::Config;
use crate::plan::{self, DemandItem, PoolShape, Unfittable};

/// Milliseconds on the runtime's monotonic clock.
pub type Millis = u64;

/// What the master says of one node (an agent whose name is the node id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeObs {
    /// The node id (the agent's name).
    pub id: String,
    /// Registered and connected.
    pub registered: bool,
    /// Some resources are in use by tasks.
    pub busy: bool,
    /// The master drains it (an operator, the autoscaler or the agent's own notice).
    pub draining: bool,
    /// A termination notice (spot) came for it.
    pub notice: bool,
}

/// One round's input.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Demand the current fleet cannot place.
    pub demand: Vec<DemandItem>,
    /// The nodes the master knows (others count as not registered).
    pub nodes: Vec<NodeObs>,
    /// The tasks active on them (for consolidation; tasks on other agents are ignored).
    pub tasks: Vec<crate::cost::TaskObs>,
}

/// What the runtime is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create `count` nodes in `pool` (report with [`Core::created`]).
    Create {
        /// The pool.
        pool: String,
        /// How many.
        count: u32,
        /// Why (`demand`, `min`, `replace`).
        reason: &'static str,
    },
    /// Drain the node's agent (`deadline_secs`: kill what is left after it).
    Drain {
        /// The node.
        node: String,
        /// The drain's deadline.
        deadline_secs: Option<u64>,
    },
    /// Delete the node (report with [`Core::deleted`]).
    Delete {
        /// The node.
        node: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Created; its agent has not registered yet.
    Provisioning,
    /// Registered.
    Ready,
    /// Drain asked for (by us or a notice).
    Draining,
    /// Delete asked for.
    Deleting,
}

#[derive(Debug, Clone)]
struct NodeRec {
    pool: usize,
    created: Millis,
    phase: Phase,
    idle_since: Option<Millis>,
    /// A notice was handled for it.
    noticed: bool,
    /// Since when its tasks would fit in the other nodes' room (consolidation).
    removable_since: Option<Millis>,
    /// Since when its tasks would fit cheaper nodes (replacement).
    replaceable_since: Option<Millis>,
}

/// A replacement under way (consolidation's "replace"): `count` nodes of a cheaper pool (or
/// several of a pool whose nodes together cost less) were asked for `old`'s tasks; once they
/// all register, `old` is drained.
#[derive(Debug, Clone)]
struct Replacement {
    /// The node being replaced.
    old: String,
    /// The cheaper pool.
    pool: usize,
    /// How many nodes were asked for.
    count: u32,
    /// The new nodes, as the provider names them.
    new: Vec<String>,
    /// When it was asked for.
    at: Millis,
}

#[derive(Debug, Clone, Default)]
struct PoolState {
    last_up: Option<Millis>,
    interruptions: u64,
    /// Interruptions since the last node of the pool that went without one.
    failures_in_a_row: u32,
    scale_ups: u64,
    scale_downs: u64,
    consolidations: u64,
    replaced_by_cheaper: u64,
    nodes_created: u64,
    provision_failures: u64,
    /// Node-milliseconds of deleted nodes.
    closed_node_ms: u64,
}

/// The autoscaler's state between rounds.
#[derive(Debug, Clone)]
pub struct Core {
    config: Config,
    nodes: BTreeMap<String, NodeRec>,
    pools: Vec<PoolState>,
    unfittable: Vec<Unfittable>,
    capped: u64,
    replacement: Option<Replacement>,
}

/// Per-pool figures ([`Core::report`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolReport {
    /// The pool.
    pub name: String,
    /// Its price per node-hour.
    pub price_per_hour: f64,
    /// Spot capacity.
    pub spot: bool,
    /// Nodes it has now (any phase).
    pub nodes: u32,
    /// Of those, not yet registered.
    pub provisioning: u32,
    /// Of those, draining or being deleted.
    pub draining: u32,
    /// Node-seconds so far, deleted nodes included.
    pub node_seconds: f64,
    /// `node_seconds × price_per_hour / 3600`.
    pub cost: f64,
    /// Of that, what tasks were charged ([`crate::cost`]; the runtime fills it in).
    pub task_cost: f64,
    /// The rest: `cost − task_cost`, never below zero.
    pub idle_cost: f64,
    /// Termination notices of its nodes.
    pub interruptions: u64,
    /// Scale-up decisions (any count).
    pub scale_ups: u64,
    /// Nodes drained for being idle.
    pub scale_downs: u64,
    /// Busy nodes drained because their tasks fit in the other nodes' room, or on a cheaper
    /// node asked for them.
    pub consolidations: u64,
    /// Of those, nodes replaced by cheaper nodes (one, or several that cost less together).
    pub replaced_by_cheaper: u64,
    /// Nodes created since start.
    pub nodes_created: u64,
    /// Nodes deleted for not registering within `provision_timeout`.
    pub provision_failures: u64,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Per pool, in the configuration's order.
    pub pools: Vec<PoolReport>,
    /// Sum of the pools' costs.
    pub total_cost: f64,
    /// Demand no pool can hold (last round).
    pub unfittable: Vec<Unfittable>,
    /// Tasks that fit a pool but none with room (last round).
    pub capped: u64,
    /// Node ids per pool.
    pub node_ids: BTreeMap<String, Vec<String>>,
    /// Cost attributed to roles, frameworks and users ([`crate::cost`]; the runtime fills it
    /// in with [`Report::attribute`]).
    pub costs: crate::cost::Costs,
}

impl Report {
    /// Fills in what tasks were charged per pool, the pools' idle cost and the attribution.
    pub fn attribute(&mut self, costs: &crate::cost::Costs) {
        for p in &mut self.pools {
            p.task_cost = costs.by_pool.get(&p.name).copied().unwrap_or(0.0);
            p.idle_cost = (p.cost - p.task_cost).max(0.0);
        }
        self.costs = costs.clone();
    }
}

/// The most nodes one node is replaced by (consolidation's "replace").
pub const MAX_REPLACEMENT_NODES: u32 = 8;

fn ms(d: std::time::Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Core {
    /// A core for `config` (checked by [`Config::check`]) with no nodes.
    pub fn new(config: Config) -> Core {
        let pools = vec![PoolState::default(); config.pools.len()];
        Core {
            config,
            nodes: BTreeMap::new(),
            pools,
            unfittable: Vec::new(),
            capped: 0,
            replacement: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn pool_index(&self, name: &str) -> Option<usize> {
        self.config.pools.iter().position(|p| p.name == name)
    }

    /// Adopts a node that exists already (a provider's `list` at start), created `at`.
    pub fn adopt(&mut self, pool: &str, node: &str, at: Millis) -> bool {
        let Some(p) = self.pool_index(pool) else {
            return false;
        };
        self.nodes.entry(node.to_string()).or_insert(NodeRec {
            pool: p,
            created: at,
            phase: Phase::Provisioning,
            idle_since: None,
            noticed: false,
            removable_since: None,
            replaceable_since: None,
        });
        true
    }

    /// The provider created `nodes` in `pool` at `now`.
    pub fn created(&mut self, pool: &str, nodes: &[String], now: Millis) {
        let Some(p) = self.pool_index(pool) else {
            return;
        };
        for n in nodes {
            if self.adopt(pool, n, now) {
                self.pools[p].nodes_created += 1;
            }
        }
        if let Some(r) = &mut self.replacement {
            if r.pool == p && (r.new.len() as u32) < r.count {
                let want = (r.count as usize).saturating_sub(r.new.len());
                r.new.extend(nodes.iter().take(want).cloned());
            }
        }
    }

    /// The provider could not create nodes in `pool`: the pool's scale-up cooldown starts
    /// again (so a failing provider is not called every round).
    pub fn create_failed(&mut self, pool: &str, now: Millis) {
        if let Some(p) = self.pool_index(pool) {
            self.pools[p].last_up = Some(now);
            if self
                .replacement
                .as_ref()
                .is_some_and(|r| r.pool == p && (r.new.len() as u32) < r.count)
            {
                self.replacement = None;
            }
        }
    }

    /// The provider deleted `node` at `now`: its cost stops.
    pub fn deleted(&mut self, node: &str, now: Millis) {
        if let Some(rec) = self.nodes.remove(node) {
            let st = &mut self.pools[rec.pool];
            st.closed_node_ms = st
                .closed_node_ms
                .saturating_add(now.saturating_sub(rec.created));
            if !rec.noticed {
                st.failures_in_a_row = 0;
            }
        }
    }

    /// Nodes of pool `p` that count against its max (every phase).
    fn count(&self, p: usize) -> u32 {
        self.nodes.values().filter(|n| n.pool == p).count() as u32
    }

    /// Nodes of pool `p` that count toward its min (not draining or deleting).
    fn staying(&self, p: usize) -> u32 {
        self.nodes
            .values()
            .filter(|n| n.pool == p && matches!(n.phase, Phase::Provisioning | Phase::Ready))
            .count() as u32
    }

    fn room(&self, p: usize) -> u32 {
        self.config.pools[p].max.saturating_sub(self.count(p))
    }

    /// One round (see the module docs).
    pub fn step(&mut self, now: Millis, obs: &Observation) -> Vec<Action> {
        let mut actions = Vec::new();
        let seen: BTreeMap<&str, &NodeObs> = obs.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
        let notice_deadline = self.config.autoscaler.notice_deadline.as_secs();
        let fallback_after = self.config.autoscaler.spot_failures_before_fallback;

        // What the master says.
        let ids: Vec<String> = self.nodes.keys().cloned().collect();
        let mut replace: Vec<usize> = Vec::new();
        for id in &ids {
            let Some(rec) = self.nodes.get_mut(id) else {
                continue;
            };
            let o = seen.get(id.as_str()).copied();
            let registered = o.is_some_and(|o| o.registered);
            let busy = o.is_some_and(|o| o.busy);
            if registered && rec.phase == Phase::Provisioning {
                rec.phase = Phase::Ready;
            }
            rec.idle_since = if registered && !busy {
                Some(rec.idle_since.unwrap_or(now))
            } else {
                None
            };
            // A node that never registered: deleted as failed (its provider is told).
            let timeout = ms(self.config.pools[rec.pool].provision_timeout);
            if rec.phase == Phase::Provisioning && now.saturating_sub(rec.created) >= timeout {
                rec.phase = Phase::Deleting;
                self.pools[rec.pool].provision_failures += 1;
                actions.push(Action::Delete { node: id.clone() });
                continue;
            }
            // 1. Notices.
            if o.is_some_and(|o| o.notice) && !rec.noticed && rec.phase != Phase::Deleting {
                rec.noticed = true;
                let st = &mut self.pools[rec.pool];
                st.interruptions += 1;
                st.failures_in_a_row = st.failures_in_a_row.saturating_add(1);
                // Work on a node we were not already removing needs room elsewhere.
                if busy && rec.phase == Phase::Ready {
                    replace.push(rec.pool);
                }
                if !o.is_some_and(|o| o.draining) {
                    actions.push(Action::Drain {
                        node: id.clone(),
                        deadline_secs: Some(notice_deadline),
                    });
                }
                rec.phase = Phase::Draining;
                continue;
            }
            // An agent drained by someone else (an operator, or its own notice) is left to
            // them until it is idle; then it goes like ours.
            if o.is_some_and(|o| o.draining) && rec.phase == Phase::Ready {
                rec.phase = Phase::Draining;
            }
            // 2. Drained: no tasks left.
            if rec.phase == Phase::Draining && !busy {
                rec.phase = Phase::Deleting;
                actions.push(Action::Delete { node: id.clone() });
            }
        }
        for p in replace {
            let pool = &self.config.pools[p];
            let target = match &pool.fallback {
                Some(f)
                    if fallback_after > 0 && self.pools[p].failures_in_a_row >= fallback_after =>
                {
                    self.pool_index(f).unwrap_or(p)
                }
                _ => p,
            };
            if self.room(target) > 0 {
                actions.push(Action::Create {
                    pool: self.config.pools[target].name.clone(),
                    count: 1,
                    reason: "replace",
                });
                self.reserve(target, 1, now);
            }
        }

        // 3. Scale-down of idle nodes, oldest idle first, keeping min.
        let incoming: Vec<String> = self
            .replacement
            .as_ref()
            .map(|r| r.new.clone())
            .unwrap_or_default();
        let mut idle: Vec<(Millis, String, usize)> = self
            .nodes
            .iter()
            .filter(|(id, n)| n.phase == Phase::Ready && !incoming.contains(*id))
            .filter_map(|(id, n)| {
                let since = n.idle_since?;
                let cooldown = ms(self.config.pools[n.pool].scale_down_cooldown);
                (now.saturating_sub(since) >= cooldown).then(|| (since, id.clone(), n.pool))
            })
            .collect();
        idle.sort();
        for (_, id, p) in idle {
            if self.staying(p) <= self.config.pools[p].min {
                continue;
            }
            if let Some(rec) = self.nodes.get_mut(&id) {
                rec.phase = Phase::Draining;
            }
            self.pools[p].scale_downs += 1;
            actions.push(Action::Drain {
                node: id,
                deadline_secs: None,
            });
        }

        // 3b. Consolidation.
        if self.config.autoscaler.consolidation {
            if let Some(a) = self.consolidate(now, obs) {
                actions.push(a);
            }
        }

        // 4. Minimum sizes.
        for p in 0..self.config.pools.len() {
            let want = self.config.pools[p]
                .min
                .saturating_sub(self.staying(p))
                .min(self.room(p));
            if want > 0 {
                actions.push(Action::Create {
                    pool: self.config.pools[p].name.clone(),
                    count: want,
                    reason: "min",
                });
                self.reserve(p, want, now);
            }
        }

        // 5. Scale-up from demand.
        let shapes: Vec<PoolShape> = (0..self.config.pools.len())
            .map(|p| {
                let spec = &self.config.pools[p];
                let cooling = self.pools[p]
                    .last_up
                    .is_some_and(|t| now.saturating_sub(t) < ms(spec.scale_up_cooldown));
                PoolShape {
                    name: spec.name.clone(),
                    cpu_milli: (spec.cpus * 1000.0).round() as u64,
                    mem_mib: spec.mem,
                    gpus: spec.gpus,
                    gpu_model: spec.gpu_model.clone().unwrap_or_default(),
                    price_per_hour: spec.price_per_hour,
                    spot: spec.spot,
                    room: if cooling { 0 } else { self.room(p) },
                    // A replacement's node is for the tasks it replaces, not for demand.
                    provisioning: self
                        .nodes
                        .iter()
                        .filter(|(id, n)| {
                            n.pool == p && n.phase == Phase::Provisioning && !incoming.contains(*id)
                        })
                        .count() as u32,
                }
            })
            .collect();
        let planned = plan::plan(&shapes, &obs.demand);
        self.unfittable = planned.unfittable;
        self.capped = planned.capped;
        for (pool, count) in planned.add {
            if let Some(p) = self.pool_index(&pool) {
                self.pools[p].scale_ups += 1;
                self.reserve(p, count, now);
                actions.push(Action::Create {
                    pool,
                    count,
                    reason: "demand",
                });
            }
        }
        self.release_reservations();
        actions
    }

    /// The demand no pool can hold, as of the last round.
    pub fn unfittable(&self) -> &[Unfittable] {
        &self.unfittable
    }

    /// Node ids per pool.
    pub fn node_ids(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, n) in &self.nodes {
            out.entry(self.config.pools[n.pool].name.clone())
                .or_default()
                .push(id.clone());
        }
        out
    }

    /// Node ids that are draining or being deleted.
    pub fn leaving(&self) -> BTreeSet<String> {
        self.nodes
            .iter()
            .filter(|(_, n)| matches!(n.phase, Phase::Draining | Phase::Deleting))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Cost and counts per pool at `now`.
    pub fn report(&self, now: Millis) -> Report {
        let pools: Vec<PoolReport> = self
            .config
            .pools
            .iter()
            .enumerate()
            .map(|(p, spec)| {
                let st = &self.pools[p];
                let live = self.nodes.values().filter(|n| n.pool == p);
                let open_ms: u64 = live.clone().map(|n| now.saturating_sub(n.created)).sum();
                let node_seconds = (st.closed_node_ms + open_ms) as f64 / 1000.0;
                PoolReport {
                    name: spec.name.clone(),
                    price_per_hour: spec.price_per_hour,
                    spot: spec.spot,
                    nodes: live.clone().count() as u32,
                    provisioning: live
                        .clone()
                        .filter(|n| n.phase == Phase::Provisioning)
                        .count() as u32,
                    draining: live
                        .filter(|n| matches!(n.phase, Phase::Draining | Phase::Deleting))
                        .count() as u32,
                    node_seconds,
                    cost: node_seconds * spec.price_per_hour / 3600.0,
                    task_cost: 0.0,
                    idle_cost: node_seconds * spec.price_per_hour / 3600.0,
                    interruptions: st.interruptions,
                    scale_ups: st.scale_ups,
                    scale_downs: st.scale_downs,
                    consolidations: st.consolidations,
                    replaced_by_cheaper: st.replaced_by_cheaper,
                    nodes_created: st.nodes_created,
                    provision_failures: st.provision_failures,
                }
            })
            .collect();
        Report {
            total_cost: pools.iter().map(|p| p.cost).sum(),
            pools,
            unfittable: self.unfittable.clone(),
            capped: self.capped,
            node_ids: self.node_ids(),
            costs: crate::cost::Costs::default(),
        }
    }
}

mod consolidation;

#[cfg(test)]
mod tests;
