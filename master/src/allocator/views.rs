//! Read-only views for the state machine and the operator: shares, allocations, metrics.

use super::*;

impl Allocator {
    /// What the framework holds: outstanding offers plus resources in use.
    pub fn framework_allocated(&self, framework: FrameworkId) -> OfferResources {
        match self.fw_ids.get(&framework) {
            Some(&f) => self.offer_resources(&self.fw(f).alloc),
            None => OfferResources::default(),
        }
    }

    /// The framework's dominant share of the cluster (not divided by any weight).
    pub fn framework_share(&self, framework: FrameworkId) -> f64 {
        match self.fw_ids.get(&framework) {
            Some(&f) => self.share_now(&self.fw(f).alloc.total()),
            None => 0.0,
        }
    }

    /// The framework's dominant share of the cluster in each of its roles (what it holds in
    /// that role; not divided by any weight), in subscription order.
    pub fn framework_role_shares(&self, framework: FrameworkId) -> Vec<(String, f64)> {
        match self.fw_ids.get(&framework) {
            Some(&f) => self
                .fw(f)
                .roles
                .iter()
                .map(|fr| {
                    let name = self.roles[fr.role as usize].name.to_string();
                    (name, self.share_now(&fr.alloc))
                })
                .collect(),
            None => Vec::new(),
        }
    }

    /// The role's dominant share (its subtree's allocation) divided by its weight.
    pub fn role_share(&self, role: &str) -> f64 {
        match self.role_ids.get(norm_role(role)) {
            Some(&r) if r != 0 => {
                let role = &self.roles[r as usize];
                self.share_now(&role.alloc) / role.weight
            }
            _ => 0.0,
        }
    }

    /// The role's allocation (its subtree: offered + in use), all pools summed.
    pub fn role_allocated(&self, role: &str) -> Resources {
        match self.role_ids.get(norm_role(role)) {
            Some(&r) if r != 0 => self.names.res(&self.roles[r as usize].alloc),
            _ => Resources::new(),
        }
    }

    /// Names of all roles known to the allocator (declared, used or reserved for).
    pub fn role_names(&self) -> impl Iterator<Item = &str> {
        self.roles
            .iter()
            .skip(1)
            .filter(|r| r.parent.is_some())
            .map(|r| &*r.name)
    }

    /// The name an agent was added with.
    pub fn agent_name(&self, id: AgentId) -> Option<&str> {
        self.agent_ids.get(&id).map(|a| self.ag(*a).name.as_str())
    }

    /// The sum of all agents' resources.
    pub fn cluster_total(&self) -> Resources {
        self.names.res(&self.total)
    }

    /// Share computed against the current total (does not depend on cached sort state).
    pub(super) fn share_now(&self, v: &[u64]) -> f64 {
        let mut s = 0.0f64;
        for (i, x) in v.iter().enumerate() {
            let t = dense::at(&self.total, i);
            if *x == 0 || t == 0 || self.excluded.get(i).copied().unwrap_or(false) {
                continue;
            }
            s = s.max(*x as f64 / t as f64);
        }
        s
    }

    /// Agents whose frameworks allocation cycles walked since start (`metrics().agent_visits`
    /// without building the rest).
    pub fn agent_visits(&self) -> u64 {
        self.counters.visits
    }

    /// Shares, counters and filters for the operator view.
    pub fn metrics(&self) -> AllocatorMetrics {
        let mut m = AllocatorMetrics {
            offers_outstanding: self.offers.len(),
            offers_made: self.counters.made,
            offers_accepted: self.counters.accepted,
            offers_declined: self.counters.declined,
            offers_rescinded: self.counters.rescinded,
            offers_expired: self.counters.expired,
            allocation_cycles: self.counters.cycles,
            agent_visits: self.counters.visits,
            ..Default::default()
        };
        for (i, role) in self.roles.iter().enumerate().skip(1) {
            if role.parent.is_none() {
                continue; // a forgotten role's slot
            }
            m.roles.insert(
                role.name.to_string(),
                RoleMetrics {
                    dominant_share: self.share_now(&role.alloc) / role.weight,
                    weight: role.weight,
                    allocated: self.names.res(&role.alloc),
                    offers_made: role.offers,
                    quota_guarantee: role.guarantee.as_ref().map(|g| self.names.res(g)),
                    quota_limit: role.limit.as_ref().map(|l| {
                        let mut r = ResourceLimits::new();
                        for (j, x) in l.iter().enumerate() {
                            if *x != u64::MAX {
                                r.set_milli(self.names.name(j), *x);
                            }
                        }
                        r
                    }),
                },
            );
            let _ = i;
        }
        for fw in self.frameworks.values() {
            m.active_filters += fw.filtered_agents;
            m.frameworks.insert(
                fw.id.to_string(),
                FrameworkMetrics {
                    name: fw.name.to_string(),
                    dominant_share: self.share_now(&fw.alloc.total()),
                    allocated: self.names.res(&fw.alloc.total()),
                    offers_made: fw.offers_made,
                    demands: self.demands(fw.id),
                },
            );
        }
        m
    }
}
