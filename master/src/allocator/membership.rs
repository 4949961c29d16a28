//! Membership: adding, updating and removing agents, frameworks (with their roles, demand,
//! suppression) and roles (weights, forgetting unused ones).

use super::cycle::split_whole_tasks;
use super::*;

impl Allocator {
    /// Adds an agent. `unreserved` is the unreserved part; `reserved` adds reserved parts per
    /// role on top. An agent with `gpus` is a GPU agent. Adding an id that exists updates it
    /// (see [`Allocator::update_agent`]).
    pub fn add_agent(
        &mut self,
        id: AgentId,
        name: &str,
        unreserved: Resources,
        reserved: BTreeMap<String, Resources>,
    ) {
        if self.agent_ids.contains_key(&id) {
            let _ = self.update_agent(id, unreserved, reserved);
            return;
        }
        let total = self.bundle(&OfferResources {
            unreserved,
            reserved,
        });
        let gpu = self
            .names
            .lookup("gpus")
            .is_some_and(|g| dense::at(&total.total(), g) > 0);
        dense::add(&mut self.total, &total.total());
        dense::add(&mut self.free_unres, &total.unres);
        self.add_reserved_to_roles(&total, true);
        let agent = Agent {
            id,
            name: name.to_string(),
            gpu,
            free: total.clone(),
            total,
            inuse: Vec::new(),
            offers: Vec::new(),
            filters: AgentFilters::default(),
            stable: None,
            gpu_free: Vec::new(),
            gpu_offered: Vec::new(),
            gpu_topology: Vec::new(),
            models: 0,
            inactive: false,
        };
        let slot = self.agents.insert(agent);
        self.agent_ids.insert(id, slot);
        self.agent_order.push(slot);
        self.keys_stale = true;
        self.epoch += 1;
    }

    /// Deactivates (`active` false) or reactivates an agent: a deactivated agent is never
    /// offered and its outstanding offers are rescinded (returned); what runs there stays
    /// allocated. Returns the rescinded offers (nothing for an unknown agent).
    pub fn set_agent_active(&mut self, id: AgentId, active: bool) -> Vec<OfferRecord> {
        let Some(&a) = self.agent_ids.get(&id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if !active {
            for o in self.ag(a).offers.clone() {
                if let Some(st) = self.drop_offer(o) {
                    self.counters.rescinded += 1;
                    out.push(self.take_record(st));
                }
            }
        }
        let agent = self.ag_mut(a);
        agent.inactive = !active;
        agent.stable = None;
        self.epoch += 1;
        out
    }

    /// True unless an operator deactivated the agent ([`Allocator::set_agent_active`]).
    pub fn agent_active(&self, id: AgentId) -> bool {
        self.agent_ids
            .get(&id)
            .is_some_and(|a| !self.ag(*a).inactive)
    }

    /// Removes an agent: its outstanding offers are rescinded (returned), allocations on it
    /// vanish, filters on it are dropped.
    pub fn remove_agent(&mut self, id: AgentId) -> Vec<OfferRecord> {
        let Some(&a) = self.agent_ids.get(&id) else {
            return Vec::new();
        };
        let offers = self.ag(a).offers.clone();
        let mut out = Vec::new();
        for o in offers {
            if let Some(st) = self.drop_offer(o) {
                self.counters.rescinded += 1;
                out.push(self.take_record(st));
            }
        }
        let inuse = std::mem::take(&mut self.ag_mut(a).inuse);
        for (f, role, b) in inuse {
            self.charge(f, role, &b, false);
            self.fw_mut(f).inuse_agents.remove(&a);
        }
        let Some(agent) = self.agents.remove(a) else {
            return out;
        };
        let mut agent = agent;
        for f in agent.filters.frameworks() {
            if let Some(fw) = self.frameworks.get_mut(*f) {
                fw.filtered_agents = fw.filtered_agents.saturating_sub(1);
            }
        }
        agent.filters.clear(&mut self.refused);
        dense::sub(&mut self.total, &agent.total.total());
        dense::sub(&mut self.free_unres, &agent.free.unres);
        self.add_reserved_to_roles(&agent.total, false);
        self.agent_ids.remove(&id);
        self.agent_order.retain(|x| *x != a);
        self.keys_stale = true;
        self.epoch += 1;
        out
    }

    /// Replaces an agent's resources (e.g. a GPU withdrawn). Allocations in use stay; offers
    /// that no longer fit are rescinded (returned), in offer order.
    pub fn update_agent(
        &mut self,
        id: AgentId,
        unreserved: Resources,
        reserved: BTreeMap<String, Resources>,
    ) -> Vec<OfferRecord> {
        let Some(&a) = self.agent_ids.get(&id) else {
            return Vec::new();
        };
        let new_total = self.bundle(&OfferResources {
            unreserved,
            reserved,
        });
        let mut avail = new_total.clone();
        for (_, _, b) in &self.ag(a).inuse {
            avail.sub(b);
        }
        let mut out = Vec::new();
        for o in self.ag(a).offers.clone() {
            let Some(st) = self.offers.get(&o) else {
                continue;
            };
            if avail.contains(&st.bundle) {
                avail.sub(&st.bundle);
            } else if let Some(st) = self.offers.remove(&o) {
                self.release_gpus(a, &st.gpus);
                self.charge(st.fw, st.role, &st.bundle, false);
                let fw = self.fw_mut(st.fw);
                release_tasks(&mut fw.offered_tasks, &st.tasks);
                self.ag_mut(a).offers.retain(|x| *x != o);
                self.counters.rescinded += 1;
                out.push(self.take_record(st));
            }
        }
        let old_total = self.ag(a).total.clone();
        let old_free = self.ag(a).free.clone();
        dense::sub(&mut self.total, &old_total.total());
        dense::add(&mut self.total, &new_total.total());
        dense::sub(&mut self.free_unres, &old_free.unres);
        dense::add(&mut self.free_unres, &avail.unres);
        self.add_reserved_to_roles(&old_total, false);
        self.add_reserved_to_roles(&new_total, true);
        let gpu = self
            .names
            .lookup("gpus")
            .is_some_and(|g| dense::at(&new_total.total(), g) > 0);
        let agent = self
            .agents
            .get_mut(a)
            .expect("allocator invariant: live agent slot");
        agent.filters.rebuild(&new_total, &self.refused);
        agent.total = new_total;
        agent.free = avail;
        agent.gpu = gpu;
        agent.stable = None;
        self.keys_stale = true;
        self.epoch += 1;
        out
    }

    /// Adds a framework subscribed to `roles` (an empty role name means `*`). Adding an id that
    /// exists updates its capability and demand and subscribes it to any new roles.
    pub fn add_framework(
        &mut self,
        id: FrameworkId,
        name: &str,
        roles: &[String],
        gpu_capable: bool,
        demand: Option<Demand>,
    ) {
        let f = match self.fw_ids.get(&id) {
            Some(&f) => {
                self.fw_mut(f).gpu_capable = gpu_capable;
                f
            }
            None => {
                let fw = Framework {
                    id,
                    name: Arc::from(name),
                    gpu_capable,
                    demand: Vec::new(),
                    demand_models: Vec::new(),
                    demand_masks: Vec::new(),
                    offered_tasks: ShapeCounts::new(),
                    roles: Vec::new(),
                    alloc: Bundle::default(),
                    offers_made: 0,
                    offer_ids: HashSet::default(),
                    inuse_agents: HashSet::default(),
                    filtered_agents: 0,
                    min_allocatable: Vec::new(),
                    min_rv: Vec::new(),
                };
                let slot = self.frameworks.insert(fw);
                self.fw_ids.insert(id, slot);
                if self.fw_flags.len() <= slot as usize {
                    self.fw_flags.resize(slot as usize + 1, 0);
                }
                slot
            }
        };
        let min = self.fw_flags[f as usize] & FW_MIN;
        self.fw_flags[f as usize] = min | if gpu_capable { FW_GPU } else { 0 };
        let mut role_list: Vec<&str> = if roles.is_empty() {
            vec![DEFAULT_ROLE]
        } else {
            roles.iter().map(|r| norm_role(r)).collect()
        };
        role_list.dedup();
        for role in role_list {
            let r = self.role_index(role);
            if self.fw(f).roles.iter().any(|x| x.role == r) {
                continue;
            }
            let placeholder = SortKey {
                share: Share::ZERO,
                offers: 0,
                prefix: name_prefix(&self.fw(f).name),
                name: self.fw(f).name.clone(),
                idx: f,
            };
            self.fw_mut(f).roles.push(FwRole {
                role: r,
                alloc: Rv::new(),
                offers: 0,
                suppressed: false,
                paused: false,
                key: placeholder.clone(),
            });
            let ri = self.fw(f).roles.len() - 1;
            self.refresh_fw_singleton(r);
            self.roles[r as usize].frameworks.insert(placeholder);
            self.refresh_fw_key(f, ri);
            for n in self.chain(r).collect::<Vec<_>>() {
                self.roles[n as usize].fw_count += 1;
            }
            if self.roles[r as usize].self_key.is_none() {
                self.refresh_sorted_singleton(r);
                let sk = self.self_key(r);
                self.roles[r as usize].sorted.insert(sk.clone());
                self.roles[r as usize].self_key = Some(sk);
            }
        }
        self.set_demand_inner(f, demand.into_iter().collect());
        self.epoch += 1;
    }

    /// Removes a framework: outstanding offers are dropped (returned), its allocations freed,
    /// its filters forgotten.
    pub fn remove_framework(&mut self, id: FrameworkId) -> Vec<OfferRecord> {
        let Some(&f) = self.fw_ids.get(&id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut mine: Vec<OfferId> = self.fw(f).offer_ids.iter().copied().collect();
        mine.sort_unstable();
        for o in mine {
            if let Some(st) = self.drop_offer(o) {
                out.push(self.take_record(st));
            }
        }
        for a in self.fw(f).inuse_agents.iter().copied().collect::<Vec<_>>() {
            let entries: Vec<(u32, u32, Bundle)> = {
                let agent = self.ag_mut(a);
                let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut agent.inuse)
                    .into_iter()
                    .partition(|(x, _, _)| *x == f);
                agent.inuse = rest;
                mine
            };
            for (_, role, b) in entries {
                self.charge(f, role, &b, false);
                self.return_to_agent(a, &b);
            }
        }
        self.clear_filters(f);
        let roles: Vec<(u32, SortKey)> = self
            .fw(f)
            .roles
            .iter()
            .map(|x| (x.role, x.key.clone()))
            .collect();
        for (r, key) in roles {
            self.roles[r as usize].frameworks.remove(&key);
            for n in self.chain(r).collect::<Vec<_>>() {
                self.roles[n as usize].fw_count -= 1;
            }
            if self.roles[r as usize].frameworks.is_empty() {
                if let Some(sk) = self.roles[r as usize].self_key.take() {
                    self.roles[r as usize].sorted.remove(&sk);
                }
            }
        }
        self.frameworks.remove(f);
        self.fw_flags[f as usize] = 0;
        self.fw_ids.remove(&id);
        self.forget_framework_usage(id);
        self.epoch += 1;
        out
    }

    pub(super) fn set_demand_inner(&mut self, f: u32, demands: Vec<Demand>) {
        let demands: Vec<Demand> = demands.into_iter().filter(|d| !d.task.is_empty()).collect();
        let models: Vec<Option<String>> = demands.iter().map(|d| d.gpu_model.clone()).collect();
        let d: Vec<(Rv, u64)> = demands
            .into_iter()
            .map(|d| (self.rv(&d.task), d.count as u64))
            .collect();
        let masks = models
            .iter()
            .map(|m| self.model_mask(m.as_deref()))
            .collect();
        self.fw_mut(f).demand_models = models;
        self.fw_mut(f).demand_masks = masks;
        let flag = if d.is_empty() { 0 } else { FW_DEMAND };
        let old = &self.fw(f).demand;
        let same_shape = old.len() == d.len() && old.iter().zip(&d).all(|((a, _), (b, _))| a == b);
        self.fw_mut(f).demand = d;
        self.fw_flags[f as usize] = (self.fw_flags[f as usize] & !FW_DEMAND) | flag;
        if !same_shape {
            self.recount_offered_tasks(f);
        }
    }

    /// Recounts the whole tasks' worth (of the current demand's shapes) in each of the
    /// framework's outstanding offers, whatever made them: eligibility for more compares the
    /// declared counts with that. Several shapes are counted greedily in their declared order
    /// ([`split_whole_tasks`]).
    pub(super) fn recount_offered_tasks(&mut self, f: u32) {
        let shapes: Vec<Rv> = self.fw(f).demand.iter().map(|(t, _)| t.clone()).collect();
        let mine: Vec<OfferId> = self
            .offers
            .values()
            .filter(|st| st.fw == f)
            .map(|st| st.id)
            .collect();
        let mut sum: ShapeCounts = shapes.iter().map(|_| 0).collect();
        for id in mine {
            if let Some(st) = self.offers.get_mut(&id) {
                st.tasks = split_whole_tasks(&st.bundle.total(), &shapes, None);
                for (s, t) in sum.iter_mut().zip(&st.tasks) {
                    *s = s.saturating_add(*t);
                }
            }
        }
        self.fw_mut(f).offered_tasks = sum;
    }

    /// Replaces a framework's declared demand (`None`: Mesos behaviour, whole agents).
    pub fn set_demand(&mut self, framework: FrameworkId, demand: Option<Demand>) {
        self.set_demands(framework, demand.into_iter().collect());
    }

    /// Replaces a framework's declared demand with several task shapes, each with its count
    /// (empty: Mesos behaviour, whole agents). Demand-aware offers are split into tasks' worth
    /// of any shape still wanted, the shapes tried in the order given.
    pub fn set_demands(&mut self, framework: FrameworkId, demands: Vec<Demand>) {
        let Some(&f) = self.fw_ids.get(&framework) else {
            return;
        };
        self.set_demand_inner(f, demands);
        self.epoch += 1;
    }

    /// The framework is offered only resources holding at least one of `quantities` (Mesos's
    /// `min_allocatable_resources`; empty quantities are ignored, none at all: any offer).
    /// A GPU framework listing its task shape is not offered what is left of an agent whose
    /// GPUs are taken. A quantity naming a resource no agent has is not held until such an
    /// agent registers (frameworks' names are not interned: they would grow every resource
    /// vector of the allocator).
    pub fn set_min_allocatable(&mut self, framework: FrameworkId, quantities: &[Resources]) {
        let Some(&f) = self.fw_ids.get(&framework) else {
            return;
        };
        let given: Vec<Resources> = quantities
            .iter()
            .filter(|q| !q.is_empty())
            .cloned()
            .collect();
        let flag = if given.is_empty() { 0 } else { FW_MIN };
        self.fw_mut(f).min_rv = self.names.try_rvs(&given);
        self.fw_mut(f).min_allocatable = given;
        self.fw_flags[f as usize] = (self.fw_flags[f as usize] & !FW_MIN) | flag;
        self.epoch += 1;
    }

    /// Stops offers to the framework (in `role`, or all its roles) until revived.
    pub fn suppress(&mut self, framework: FrameworkId, role: Option<&str>) {
        let Some(&f) = self.fw_ids.get(&framework) else {
            return;
        };
        let target = role
            .map(norm_role)
            .and_then(|r| self.role_ids.get(r).copied());
        if role.is_some() && target.is_none() {
            return;
        }
        // Suppressed frameworks leave their roles' fair-order sets (the scan never sees them).
        let mut removed = Vec::new();
        for fr in &mut self.fw_mut(f).roles {
            if (target.is_none() || target == Some(fr.role)) && !fr.suppressed {
                fr.suppressed = true;
                if !fr.paused {
                    removed.push((fr.role, fr.key.clone()));
                }
            }
        }
        for (r, key) in removed {
            self.roles[r as usize].frameworks.remove(&key);
        }
    }

    /// Resumes offers (in `role`, or all its roles) and clears the framework's filters.
    pub fn revive(&mut self, framework: FrameworkId, role: Option<&str>) {
        let Some(&f) = self.fw_ids.get(&framework) else {
            return;
        };
        let target = role
            .map(norm_role)
            .and_then(|r| self.role_ids.get(r).copied());
        let mut revived = Vec::new();
        for (ri, fr) in self.fw_mut(f).roles.iter_mut().enumerate() {
            if (role.is_none() || target == Some(fr.role)) && fr.suppressed {
                fr.suppressed = false;
                if !fr.paused {
                    revived.push(ri);
                }
            }
        }
        for ri in revived {
            self.rejoin(f, ri);
        }
        self.clear_filters(f);
        self.epoch += 1;
    }

    /// Pauses (or resumes) offers to a framework that is not reading what it was sent (its
    /// connection's queue is backed up): out of every role's fair order while paused, so the
    /// others get what it would have been offered; its filters, suppression and allocations
    /// stay as they are. The master decides (`state::pacing`).
    pub fn set_paused(&mut self, framework: FrameworkId, paused: bool) {
        let Some(&f) = self.fw_ids.get(&framework) else {
            return;
        };
        let mut changed = Vec::new();
        for (ri, fr) in self.fw_mut(f).roles.iter_mut().enumerate() {
            if fr.paused != paused {
                fr.paused = paused;
                if !fr.suppressed {
                    changed.push((ri, fr.role, fr.key.clone()));
                }
            }
        }
        if changed.is_empty() {
            return;
        }
        for (ri, r, key) in changed {
            if paused {
                self.roles[r as usize].frameworks.remove(&key);
            } else {
                self.rejoin(f, ri);
            }
        }
        if !paused {
            // Agents found to have nothing for anyone may have something for it.
            self.epoch += 1;
        }
    }

    /// True while [`Allocator::set_paused`] holds offers to the framework back.
    pub fn paused(&self, framework: FrameworkId) -> bool {
        self.fw_ids
            .get(&framework)
            .is_some_and(|&f| self.fw(f).roles.iter().any(|r| r.paused))
    }

    /// Puts framework `f`'s role entry `ri` back into its role's fair order (revived or
    /// resumed), its key up to date.
    fn rejoin(&mut self, f: u32, ri: usize) {
        let key = self.fw_key(f, ri);
        let r = self.fw(f).roles[ri].role;
        self.refresh_fw_singleton(r);
        self.roles[r as usize].frameworks.insert(key.clone());
        self.fw_mut(f).roles[ri].key = key;
        if self.roles[r as usize].self_key.is_none() {
            self.refresh_sorted_singleton(r);
            let sk = self.self_key(r);
            self.roles[r as usize].sorted.insert(sk.clone());
            self.roles[r as usize].self_key = Some(sk);
        }
    }

    /// Sets a role's weight (its dominant share is divided by it). Non-positive or non-finite
    /// weights are ignored.
    pub fn set_weight(&mut self, role: &str, weight: f64) {
        if !(weight.is_finite() && weight > 0.0) {
            return;
        }
        let r = self.role_index(role);
        self.roles[r as usize].weight = weight;
        self.refresh_role_chain(r);
        self.epoch += 1;
    }

    /// Forgets `role`, then each of its ancestors, while nothing uses it: no framework
    /// subscribed to it, no child role, no quota, no weight other than 1, no reservation, and
    /// nothing allocated or offered in it. Returns the names forgotten (none if it is in use or
    /// unknown). Its slot is reused by the next new role, so roles that came and went cost
    /// nothing.
    pub fn forget_role(&mut self, role: &str) -> Vec<String> {
        let mut forgotten = Vec::new();
        let mut name = norm_role(role).to_string();
        while let Some(&r) = self.role_ids.get(name.as_str()) {
            let node = &self.roles[r as usize];
            let unused = r != 0
                && node.fw_count == 0
                && node.frameworks.is_empty()
                && node.self_key.is_none()
                && node.sorted.is_empty()
                && node.guarantee.is_none()
                && node.limit.is_none()
                && node.weight == 1.0
                && node.alloc.iter().all(|x| *x == 0)
                && node.reserved.iter().all(|x| *x == 0);
            if !unused {
                break;
            }
            let parent = node.parent.unwrap_or(0);
            if let Some(key) = self.roles[r as usize].key.take() {
                self.roles[parent as usize].sorted.remove(&key);
            }
            self.role_ids.remove(name.as_str());
            self.forget_role_usage(&name);
            // A dead slot: no parent, so no cycle, sort or view ever reaches it.
            self.roles[r as usize] = Role::new("", None);
            self.free_role_slots.push(r);
            let next = match name.rsplit_once('/') {
                Some((p, _)) if !p.is_empty() => Some(p.to_string()),
                _ => None,
            };
            forgotten.push(std::mem::replace(&mut name, next.unwrap_or_default()));
            if name.is_empty() {
                break;
            }
        }
        if !forgotten.is_empty() {
            self.epoch += 1;
        }
        forgotten
    }
}
