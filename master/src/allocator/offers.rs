//! Offers and what frameworks do with them: accept, decline (with filters), rescind, recover,
//! reservations, allocations restored after failover, offer and filter expiry.

use super::cycle::split_whole_tasks;
use super::*;

impl Allocator {
    pub(super) fn add_filter(
        &mut self,
        a: u32,
        f: u32,
        refused: Bundle,
        refuse_ms: Option<Millis>,
        now: Millis,
    ) {
        let ms = refuse_ms.unwrap_or(self.config.default_refuse_ms);
        if ms == 0 || refused.is_zero() {
            return;
        }
        let expires = now.saturating_add(ms);
        let id = self.refused.intern(refused);
        let Some(agent) = self.agents.get_mut(a) else {
            self.refused.release(id);
            return;
        };
        let new_pair = !agent.filters.has(f);
        agent.filters.add(
            f,
            Filter {
                refused: id,
                expires,
                covers: false,
            },
            &agent.total,
            &self.refused,
        );
        if new_pair {
            self.fw_mut(f).filtered_agents += 1;
        }
        self.filter_heap.push(Reverse((expires, a, f)));
    }

    pub(super) fn clear_filters(&mut self, f: u32) {
        if self.fw(f).filtered_agents == 0 {
            return;
        }
        for i in 0..self.agent_order.len() {
            let a = self.agent_order[i];
            if let Some(agent) = self.agents.get_mut(a) {
                if agent.filters.remove(f, &mut self.refused) {
                    agent.stable = None;
                }
            }
        }
        self.fw_mut(f).filtered_agents = 0;
    }

    pub(super) fn expire_filters(&mut self, now: Millis) {
        while let Some(Reverse((expires, a, f))) = self.filter_heap.peek().copied() {
            if expires > now {
                break;
            }
            self.filter_heap.pop();
            let Some(agent) = self.agents.get_mut(a) else {
                continue;
            };
            let (changed, emptied) = agent
                .filters
                .expire(f, now, &agent.total, &mut self.refused);
            if changed {
                agent.stable = None;
            }
            if emptied {
                if let Some(fw) = self.frameworks.get_mut(f) {
                    fw.filtered_agents = fw.filtered_agents.saturating_sub(1);
                }
            }
        }
    }

    /// An outstanding offer.
    pub fn offer(&self, id: OfferId) -> Option<&OfferRecord> {
        self.offers.get(&id).map(|s| self.record_of(s))
    }

    /// All outstanding offers, oldest first.
    pub fn outstanding_offers(&self) -> impl Iterator<Item = &OfferRecord> {
        let mut v: Vec<&OfferRecord> = self.offers.values().map(|s| self.record_of(s)).collect();
        v.sort_unstable_by_key(|r| r.id);
        v.into_iter()
    }

    /// Outstanding offers of `framework`, oldest first (from the per-framework index: the cost
    /// is its offers, not all offers).
    pub fn framework_offers(&self, framework: FrameworkId) -> Vec<OfferId> {
        let Some(&f) = self.fw_ids.get(&framework) else {
            return Vec::new();
        };
        let mut v: Vec<OfferId> = self.fw(f).offer_ids.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// Outstanding offers on `agent`, oldest first (from the per-agent index).
    pub fn agent_offers(&self, agent: AgentId) -> Vec<OfferId> {
        match self.agent_ids.get(&agent) {
            Some(&a) => self.ag(a).offers.clone(),
            None => Vec::new(),
        }
    }

    /// Outstanding offers of `framework` on `agent`, oldest first.
    pub fn offers_on(&self, framework: FrameworkId, agent: AgentId) -> Vec<OfferId> {
        let Some(&a) = self.agent_ids.get(&agent) else {
            return Vec::new();
        };
        self.ag(a)
            .offers
            .iter()
            .copied()
            .filter(|o| self.offers.get(o).is_some_and(|s| s.framework == framework))
            .collect()
    }

    /// The offer is used up: `used` stays allocated to the framework (in use by tasks); the rest
    /// returns to the pool and is filtered for `refuse_ms` (see [`Allocator::accept_offers`]).
    pub fn accept(
        &mut self,
        offer: OfferId,
        used: &OfferResources,
        refuse_ms: Option<Millis>,
        now: Millis,
    ) -> Result<OfferRecord, AllocError> {
        let mut done = self.accept_offers(&[(offer, used.clone())], refuse_ms, now)?;
        Ok(done.remove(0))
    }

    /// Accepts offers of one framework on one agent as ONE accept: each offer's `used` part
    /// stays allocated (in use by tasks); the unused parts return to the pool under ONE filter
    /// over their union for `refuse_ms` (None = default, Some(0) = no filter). Declared demand
    /// shrinks by the whole tasks' worth in the used parts. Nothing changes when an offer is
    /// unknown, the offers are mixed, or a `used` does not fit its offer (pool by pool). Returns
    /// the offers' records in the order given (duplicates once).
    pub fn accept_offers(
        &mut self,
        offers: &[(OfferId, OfferResources)],
        refuse_ms: Option<Millis>,
        now: Millis,
    ) -> Result<Vec<OfferRecord>, AllocError> {
        let mut owner: Option<(u32, u32)> = None;
        let mut parts: Vec<(OfferId, Bundle)> = Vec::with_capacity(offers.len());
        for (offer, used) in offers {
            let st = self
                .offers
                .get(offer)
                .ok_or(AllocError::UnknownOffer(*offer))?;
            if *owner.get_or_insert((st.fw, st.agent)) != (st.fw, st.agent) {
                return Err(AllocError::MixedOffers("accept"));
            }
            if parts.iter().any(|(o, _)| o == offer) {
                continue;
            }
            match self.try_bundle(used) {
                Some(b) if st.bundle.contains(&b) => parts.push((*offer, b)),
                _ => {
                    return Err(AllocError::ExceedsOffer {
                        offer: *offer,
                        requested: used.clone(),
                        offered: self.offer_resources(&st.bundle),
                    });
                }
            }
        }
        let Some((f, a)) = owner else {
            return Ok(Vec::new());
        };
        let mut done = Vec::with_capacity(parts.len());
        let mut returned = Bundle::default();
        for (offer, used_b) in parts {
            let Some(st) = self.offers.remove(&offer) else {
                continue;
            };
            self.release_gpus(a, &st.gpus);
            let role = st.role;
            let mut rest = st.bundle.clone();
            rest.sub(&used_b);
            self.charge(f, role, &rest, false);
            self.return_to_agent(a, &rest);
            returned.add(&rest);
            if !used_b.is_zero() {
                let agent = self.ag_mut(a);
                match agent
                    .inuse
                    .iter_mut()
                    .find(|(x, r, _)| *x == f && *r == role)
                {
                    Some((_, _, b)) => b.add(&used_b),
                    None => agent.inuse.push((f, role, used_b.clone())),
                }
                self.fw_mut(f).inuse_agents.insert(a);
            }
            {
                let fw = self.fw_mut(f);
                release_tasks(&mut fw.offered_tasks, &st.tasks);
                fw.offer_ids.remove(&offer);
                if !fw.demand.is_empty() {
                    let shapes: Vec<Rv> = fw.demand.iter().map(|(t, _)| t.clone()).collect();
                    let used = split_whole_tasks(&used_b.total(), &shapes, Some(&st.tasks));
                    for ((_, count), n) in fw.demand.iter_mut().zip(used) {
                        *count = count.saturating_sub(n);
                    }
                }
            }
            if st.tasks.iter().any(|t| *t > 0) {
                self.epoch += 1;
            }
            self.ag_mut(a).offers.retain(|o| *o != offer);
            self.counters.accepted += 1;
            done.push(self.take_record(st));
        }
        self.add_filter(a, f, returned, refuse_ms, now);
        Ok(done)
    }

    /// Declines an offer: everything returns to the pool and is filtered for that framework on
    /// that agent for `refuse_ms` (see [`Allocator::decline_offers`]).
    pub fn decline(
        &mut self,
        offer: OfferId,
        refuse_ms: Option<Millis>,
        now: Millis,
    ) -> Result<OfferRecord, AllocError> {
        let mut done = self.decline_offers(&[offer], refuse_ms, now)?;
        Ok(done.remove(0))
    }

    /// Declines offers of one framework as ONE decline: everything returns to the pool and, on
    /// each of their agents, ONE filter over the union of the offers declined there is installed
    /// for `refuse_ms` (None = default, Some(0) = no filter): declining all of its offers on an
    /// agent keeps the framework from being offered their union again until it expires (with a
    /// filter per offer, no single filter would cover the union). Nothing changes when an offer
    /// is unknown or the offers belong to several frameworks. Returns the offers' records in the
    /// order given (duplicates once).
    pub fn decline_offers(
        &mut self,
        offers: &[OfferId],
        refuse_ms: Option<Millis>,
        now: Millis,
    ) -> Result<Vec<OfferRecord>, AllocError> {
        let mut framework: Option<u32> = None;
        for offer in offers {
            let st = self
                .offers
                .get(offer)
                .ok_or(AllocError::UnknownOffer(*offer))?;
            if *framework.get_or_insert(st.fw) != st.fw {
                return Err(AllocError::MixedOffers("decline"));
            }
        }
        let Some(f) = framework else {
            return Ok(Vec::new());
        };
        let mut done = Vec::with_capacity(offers.len());
        let mut refused: Vec<(u32, Bundle)> = Vec::new();
        for offer in offers {
            let Some(st) = self.drop_offer(*offer) else {
                continue;
            };
            match refused.iter_mut().find(|(a, _)| *a == st.agent) {
                Some((_, b)) => b.add(&st.bundle),
                None => refused.push((st.agent, st.bundle.clone())),
            }
            self.counters.declined += 1;
            done.push(self.take_record(st));
        }
        for (a, b) in refused {
            self.add_filter(a, f, b, refuse_ms, now);
        }
        Ok(done)
    }

    /// Takes an offer back (no filter).
    pub fn rescind(&mut self, offer: OfferId) -> Option<OfferRecord> {
        let st = self.drop_offer(offer)?;
        self.counters.rescinded += 1;
        Some(self.take_record(st))
    }

    /// Tasks of `framework` on `agent` ended: `resources` (at most what it has in use there)
    /// return to the pool. Unknown framework or agent: nothing happens.
    pub fn recover(&mut self, framework: FrameworkId, agent: AgentId, resources: &OfferResources) {
        let (Some(&f), Some(&a)) = (self.fw_ids.get(&framework), self.agent_ids.get(&agent)) else {
            return;
        };
        let Some(mut remaining) = self.try_bundle(resources).or_else(|| {
            // Unknown names can not be in use; recover the known part.
            let known = OfferResources {
                unreserved: resources
                    .unreserved
                    .filter(|n| self.names.lookup(n).is_some()),
                reserved: resources
                    .reserved
                    .iter()
                    .filter(|(r, _)| self.role_ids.contains_key(norm_role(r)))
                    .map(|(r, v)| (r.clone(), v.filter(|n| self.names.lookup(n).is_some())))
                    .collect(),
            };
            self.try_bundle(&known)
        }) else {
            return;
        };
        let mut freed: Vec<(u32, Bundle)> = Vec::new();
        {
            let agent = self.ag_mut(a);
            for (x, role, b) in agent.inuse.iter_mut() {
                if *x != f {
                    continue;
                }
                let take = b.min(&remaining);
                if take.is_zero() {
                    continue;
                }
                b.sub(&take);
                remaining.sub(&take);
                freed.push((*role, take));
            }
            agent.inuse.retain(|(_, _, b)| !b.is_zero());
            if !agent.inuse.iter().any(|(x, _, _)| *x == f) {
                if let Some(fw) = self.frameworks.get_mut(f) {
                    fw.inuse_agents.remove(&a);
                }
            }
        }
        for (role, take) in freed {
            self.charge(f, role, &take, false);
            self.return_to_agent(a, &take);
        }
    }

    /// RESERVE inside an offer: `resources`, unreserved in the offer, become reserved for `role`
    /// (the offer's role or one of its ancestors). The offer stays outstanding with the new
    /// shape; whatever of it is not used later returns to the pool as a reservation.
    pub fn reserve(
        &mut self,
        offer: OfferId,
        role: &str,
        resources: &Resources,
    ) -> Result<OfferRecord, AllocError> {
        self.change_reservation(offer, role, resources, true)
    }

    /// UNRESERVE inside an offer: `resources` reserved for `role` in the offer become unreserved.
    pub fn unreserve(
        &mut self,
        offer: OfferId,
        role: &str,
        resources: &Resources,
    ) -> Result<OfferRecord, AllocError> {
        self.change_reservation(offer, role, resources, false)
    }

    pub(super) fn change_reservation(
        &mut self,
        offer: OfferId,
        role: &str,
        resources: &Resources,
        reserve: bool,
    ) -> Result<OfferRecord, AllocError> {
        let st = self
            .offers
            .get(&offer)
            .ok_or(AllocError::UnknownOffer(offer))?;
        let (f, a, offer_role) = (st.fw, st.agent, st.role);
        let exceeds = || AllocError::ExceedsOffer {
            offer,
            requested: if reserve {
                OfferResources::unreserved(resources.clone())
            } else {
                OfferResources {
                    unreserved: Resources::new(),
                    reserved: BTreeMap::from([(role.to_string(), resources.clone())]),
                }
            },
            offered: self.offer_resources(&st.bundle),
        };
        let Some(amount) = self.names.try_rv(resources) else {
            return Err(exceeds());
        };
        let target = self.role_ids.get(norm_role(role)).copied();
        let Some(r) = target.filter(|r| *r != 0 && self.chain(offer_role).any(|n| n == *r)) else {
            return Err(AllocError::ReservationRole {
                offer,
                role: role.to_string(),
            });
        };
        let fits = if reserve {
            dense::contains(&st.bundle.unres, &amount)
        } else {
            dense::contains(st.bundle.resv_of(r), &amount)
        };
        if !fits {
            return Err(exceeds());
        }
        let mut delta_from = Bundle::default();
        let mut delta_to = Bundle::default();
        if reserve {
            delta_from.unres = amount.clone();
            delta_to.add_resv(r, &amount);
        } else {
            delta_from.add_resv(r, &amount);
            delta_to.unres = amount.clone();
        }
        let old = st.bundle.clone();
        let mut new = old.clone();
        new.sub(&delta_from);
        new.add(&delta_to);
        self.charge(f, offer_role, &old, false);
        // Reservations count toward the role's quota consumption whether allocated or not.
        self.add_reserved_to_roles(&delta_from, false);
        self.add_reserved_to_roles(&delta_to, true);
        self.charge(f, offer_role, &new, true);
        {
            let agent = self
                .agents
                .get_mut(a)
                .expect("allocator invariant: live agent slot");
            agent.total.sub(&delta_from);
            agent.total.add(&delta_to);
            agent.filters.rebuild(&agent.total, &self.refused);
            agent.stable = None;
        }
        let st = self
            .offers
            .get_mut(&offer)
            .ok_or(AllocError::UnknownOffer(offer))?;
        st.bundle = new;
        st.rec = std::sync::OnceLock::new();
        self.epoch += 1;
        let st = self
            .offers
            .get(&offer)
            .ok_or(AllocError::UnknownOffer(offer))?;
        Ok(self.record_of(st).clone())
    }

    /// Records resources already in use by `framework` (in `role`) on `agent`: tasks that were
    /// running before this allocator saw them (agent re-registration, master failover).
    pub fn add_allocation(
        &mut self,
        framework: FrameworkId,
        agent: AgentId,
        role: &str,
        resources: &OfferResources,
    ) -> Result<(), AllocError> {
        let f = *self
            .fw_ids
            .get(&framework)
            .ok_or(AllocError::UnknownFramework(framework))?;
        let a = *self
            .agent_ids
            .get(&agent)
            .ok_or(AllocError::UnknownAgent(agent))?;
        let r = self.role_index(role);
        let b = self.bundle(resources);
        let free = &self.ag(a).free;
        if !free.contains(&b) {
            return Err(AllocError::ExceedsAgent {
                agent,
                requested: resources.clone(),
                free: self.offer_resources(free),
            });
        }
        if !self.fw(f).roles.iter().any(|x| x.role == r) {
            self.add_framework(
                framework,
                "",
                &[role.to_string()],
                self.fw(f).gpu_capable,
                self.demand(framework),
            );
        }
        dense::sub(&mut self.free_unres, &b.unres);
        {
            let agent = self.ag_mut(a);
            agent.free.sub(&b);
            agent.stable = None;
            match agent.inuse.iter_mut().find(|(x, y, _)| *x == f && *y == r) {
                Some((_, _, v)) => v.add(&b),
                None => agent.inuse.push((f, r, b.clone())),
            }
        }
        self.fw_mut(f).inuse_agents.insert(a);
        self.charge(f, r, &b, true);
        Ok(())
    }

    /// What `framework` has in use (accepted, not recovered) on `agent`.
    pub fn in_use(&self, framework: FrameworkId, agent: AgentId) -> OfferResources {
        let (Some(&f), Some(&a)) = (self.fw_ids.get(&framework), self.agent_ids.get(&agent)) else {
            return OfferResources::default();
        };
        let mut b = Bundle::default();
        for (x, _, v) in &self.ag(a).inuse {
            if *x == f {
                b.add(v);
            }
        }
        self.offer_resources(&b)
    }

    /// The roles a framework is subscribed to.
    pub fn framework_roles(&self, framework: FrameworkId) -> Vec<String> {
        match self.fw_ids.get(&framework) {
            Some(&f) => self
                .fw(f)
                .roles
                .iter()
                .map(|r| self.roles[r.role as usize].name.to_string())
                .collect(),
            None => Vec::new(),
        }
    }

    /// A framework's remaining declared demand as (task shape, count): its first shape.
    pub fn demand(&self, framework: FrameworkId) -> Option<Demand> {
        self.demands(framework).into_iter().next()
    }

    /// A framework's remaining declared demand: every shape with its remaining count.
    pub fn demands(&self, framework: FrameworkId) -> Vec<Demand> {
        let Some(&f) = self.fw_ids.get(&framework) else {
            return Vec::new();
        };
        let fw = self.fw(f);
        fw.demand
            .iter()
            .enumerate()
            .map(|(i, (task, count))| Demand {
                task: self.names.res(task),
                count: (*count).min(u32::MAX as u64) as u32,
                gpu_model: fw.demand_models.get(i).cloned().flatten(),
            })
            .collect()
    }

    /// Rescinds offers older than the configured offer timeout (none when it is off). With
    /// `filter_expired_offers`, what expired is filtered for its framework on its agent for
    /// `default_refuse_ms`, as a decline would be (one filter over the union per agent).
    pub fn expire_offers(&mut self, now: Millis) -> Vec<OfferRecord> {
        let Some(timeout) = self.config.offer_timeout_ms else {
            return Vec::new();
        };
        let mut due: Vec<OfferId> = self
            .offers
            .values()
            .filter(|s| s.created_at.saturating_add(timeout) <= now)
            .map(|s| s.id)
            .collect();
        due.sort_unstable();
        let mut out = Vec::new();
        let mut refused: Vec<(u32, u32, Bundle)> = Vec::new();
        for id in due {
            if let Some(st) = self.drop_offer(id) {
                self.counters.rescinded += 1;
                self.counters.expired += 1;
                if self.config.filter_expired_offers {
                    match refused
                        .iter_mut()
                        .find(|(a, f, _)| *a == st.agent && *f == st.fw)
                    {
                        Some((_, _, b)) => b.add(&st.bundle),
                        None => refused.push((st.agent, st.fw, st.bundle.clone())),
                    }
                }
                out.push(self.take_record(st));
            }
        }
        for (a, f, b) in refused {
            self.add_filter(a, f, b, None, now);
        }
        out
    }

    /// The earliest time a decline filter may expire (None when there are no filters). May be
    /// early (a filter dropped by a revive), never late.
    pub fn next_filter_expiry(&self) -> Option<Millis> {
        self.filter_heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// When the oldest outstanding offer times out (None when the timeout is off or no offers).
    pub fn next_offer_expiry(&self) -> Option<Millis> {
        let t = self.config.offer_timeout_ms?;
        self.offers
            .values()
            .map(|s| s.created_at.saturating_add(t))
            .min()
    }
}
