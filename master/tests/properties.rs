//! Property tests (proptest) of allocator invariants over random event sequences:
//! agents are never over-allocated (offers never overlap), reserved resources only go to their
//! role, quota limits are never exceeded by new offers, a cycle makes at most one offer per
//! (framework, agent, role), guarantees are honoured while their role has demand, and the next
//! offer goes to the lowest-share eligible role and framework.

use std::collections::BTreeMap;

use gantry_master::allocator::{Allocator, AllocatorConfig, OfferRecord, OfferResources};
use gantry_proto::messages::Demand;
use gantry_proto::{AgentId, FrameworkId, ResourceLimits, Resources};
use proptest::prelude::*;

const ROLES: [&str; 6] = ["a", "b", "c", "a/x", "lim", "q"];

#[derive(Debug, Clone)]
enum Op {
    AddAgent {
        cpus: u8,
        mem: u8,
        resv_role: Option<usize>,
        resv_cpus: u8,
    },
    RemoveAgent(usize),
    AddFramework {
        role: usize,
        demand: Option<(u8, u8, u8)>,
    },
    RemoveFramework(usize),
    Allocate(u16),
    Accept {
        offer: usize,
        percent: u8,
        refuse: u16,
    },
    Decline {
        offer: usize,
        refuse: u16,
    },
    Recover {
        fw: usize,
        agent: usize,
        percent: u8,
    },
    Suppress(usize),
    Revive(usize),
    SetWeight {
        role: usize,
        weight: u8,
    },
    SetLimit(Option<u8>),
    SetGuarantee(Option<u8>),
    Rescind(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..32, 1u8..32, proptest::option::of(0usize..ROLES.len()), 0u8..8)
            .prop_map(|(cpus, mem, resv_role, resv_cpus)| Op::AddAgent { cpus, mem, resv_role, resv_cpus }),
        1 => any::<usize>().prop_map(Op::RemoveAgent),
        3 => (0usize..ROLES.len(), proptest::option::of((1u8..4, 1u8..8, 1u8..20)))
            .prop_map(|(role, demand)| Op::AddFramework { role, demand }),
        1 => any::<usize>().prop_map(Op::RemoveFramework),
        5 => (0u16..3000).prop_map(Op::Allocate),
        4 => (any::<usize>(), 0u8..=100, 0u16..4000).prop_map(|(offer, percent, refuse)| Op::Accept { offer, percent, refuse }),
        3 => (any::<usize>(), 0u16..4000).prop_map(|(offer, refuse)| Op::Decline { offer, refuse }),
        2 => (any::<usize>(), any::<usize>(), 0u8..=100).prop_map(|(fw, agent, percent)| Op::Recover { fw, agent, percent }),
        1 => any::<usize>().prop_map(Op::Suppress),
        1 => any::<usize>().prop_map(Op::Revive),
        1 => (0usize..ROLES.len(), 1u8..5).prop_map(|(role, weight)| Op::SetWeight { role, weight }),
        1 => proptest::option::of(1u8..40).prop_map(Op::SetLimit),
        1 => proptest::option::of(1u8..20).prop_map(Op::SetGuarantee),
        1 => any::<usize>().prop_map(Op::Rescind),
    ]
}

struct Model {
    alloc: Allocator,
    now: u64,
    next: u128,
    /// Live agents and their totals (unreserved + reserved per role).
    agents: Vec<(AgentId, OfferResources)>,
    /// Live frameworks and their role.
    frameworks: Vec<(FrameworkId, String)>,
    /// Task shapes of frameworks that declared a demand.
    demands: BTreeMap<FrameworkId, Resources>,
}

fn cpus_mem(cpus: u8, mem: u8) -> Resources {
    Resources::new()
        .with("cpus", cpus as f64)
        .with("mem", mem as f64 * 256.0)
}

/// `percent` of each amount, rounded down to milli-units.
fn part(r: &Resources, percent: u8) -> Resources {
    let mut out = Resources::new();
    for (name, milli) in r.iter() {
        out.set_milli(name, milli * percent as u64 / 100);
    }
    out
}

fn part_offer(r: &OfferResources, percent: u8) -> OfferResources {
    OfferResources {
        unreserved: part(&r.unreserved, percent),
        reserved: r
            .reserved
            .iter()
            .map(|(k, v)| (k.clone(), part(v, percent)))
            .filter(|(_, v)| !v.is_empty())
            .collect(),
    }
}

fn is_ancestor_or_self(anc: &str, role: &str) -> bool {
    role == anc || role.starts_with(&format!("{anc}/"))
}

impl Model {
    fn new() -> Self {
        Self {
            alloc: Allocator::new(AllocatorConfig::default()),
            now: 0,
            next: 0,
            agents: Vec::new(),
            frameworks: Vec::new(),
            demands: BTreeMap::new(),
        }
    }

    fn offers(&self) -> Vec<OfferRecord> {
        self.alloc.outstanding_offers().cloned().collect()
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::AddAgent {
                cpus,
                mem,
                resv_role,
                resv_cpus,
            } => {
                self.next += 1;
                let id = AgentId::from_u128(self.next);
                let unres = cpus_mem(*cpus, *mem);
                let mut reserved = BTreeMap::new();
                if let (Some(r), true) = (resv_role, *resv_cpus > 0) {
                    // "lim" keeps no reservations so its consumption is its allocation.
                    if ROLES[*r] != "lim" {
                        reserved.insert(ROLES[*r].to_string(), cpus_mem(*resv_cpus, 1));
                    }
                }
                self.alloc
                    .add_agent(id, "h", unres.clone(), reserved.clone());
                self.agents.push((
                    id,
                    OfferResources {
                        unreserved: unres,
                        reserved,
                    },
                ));
                self.check_allocate()?;
            }
            Op::RemoveAgent(i) if !self.agents.is_empty() => {
                let (id, _) = self.agents.remove(i % self.agents.len());
                let gone = self.alloc.remove_agent(id);
                prop_assert!(gone.iter().all(|o| o.agent == id));
                prop_assert!(self.offers().iter().all(|o| o.agent != id));
            }
            Op::AddFramework { role, demand } => {
                self.next += 1;
                let id = FrameworkId::from_u128(self.next);
                let d = demand.map(|(c, m, n)| Demand {
                    task: cpus_mem(c, m),
                    count: n as u32,
                    gpu_model: None,
                });
                self.alloc.add_framework(
                    id,
                    &format!("f{}", self.next),
                    &[ROLES[*role].to_string()],
                    false,
                    d,
                );
                self.frameworks.push((id, ROLES[*role].to_string()));
                self.check_allocate()?;
            }
            Op::RemoveFramework(i) if !self.frameworks.is_empty() => {
                let (id, _) = self.frameworks.remove(i % self.frameworks.len());
                self.alloc.remove_framework(id);
                prop_assert!(self.offers().iter().all(|o| o.framework != id));
                prop_assert!(self.alloc.framework_allocated(id).is_empty());
            }
            Op::Allocate(dt) => {
                self.now += *dt as u64;
                self.check_allocate()?;
            }
            Op::Accept {
                offer,
                percent,
                refuse,
            } => {
                let offers = self.offers();
                if !offers.is_empty() {
                    let o = &offers[offer % offers.len()];
                    let used = part_offer(&o.resources, *percent);
                    self.alloc
                        .accept(o.id, &used, Some(*refuse as u64), self.now)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(self.alloc.offer(o.id).is_none(), "offers are single-use");
                }
            }
            Op::Decline { offer, refuse } => {
                let offers = self.offers();
                if !offers.is_empty() {
                    let o = &offers[offer % offers.len()];
                    self.alloc
                        .decline(o.id, Some(*refuse as u64), self.now)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(self.alloc.decline(o.id, None, self.now).is_err());
                }
            }
            Op::Rescind(i) => {
                let offers = self.offers();
                if !offers.is_empty() {
                    let o = &offers[i % offers.len()];
                    prop_assert!(self.alloc.rescind(o.id).is_some());
                }
            }
            Op::Recover { fw, agent, percent }
                if !self.frameworks.is_empty() && !self.agents.is_empty() =>
            {
                let f = self.frameworks[fw % self.frameworks.len()].0;
                let a = self.agents[agent % self.agents.len()].0;
                let in_use = self.alloc.in_use(f, a);
                self.alloc.recover(f, a, &part_offer(&in_use, *percent));
                self.check_allocate()?;
            }
            Op::Suppress(i) if !self.frameworks.is_empty() => {
                self.alloc
                    .suppress(self.frameworks[i % self.frameworks.len()].0, None);
            }
            Op::Revive(i) if !self.frameworks.is_empty() => {
                self.alloc
                    .revive(self.frameworks[i % self.frameworks.len()].0, None);
                self.check_allocate()?;
            }
            Op::SetWeight { role, weight } => self.alloc.set_weight(ROLES[*role], *weight as f64),
            Op::SetLimit(l) => self
                .alloc
                .set_quota(
                    "lim",
                    None,
                    l.map(|c| ResourceLimits::from(&Resources::new().with("cpus", c as f64))),
                )
                .map_err(|e| TestCaseError::fail(e.to_string()))?,
            Op::SetGuarantee(g) => self
                .alloc
                .set_quota(
                    "q",
                    g.map(|c| Resources::new().with("cpus", c as f64)),
                    None,
                )
                .map_err(|e| TestCaseError::fail(e.to_string()))?,
            _ => {}
        }
        self.check_invariants()
    }

    /// Runs a cycle and checks the properties of the offers it made.
    fn check_allocate(&mut self) -> Result<(), TestCaseError> {
        let before_lim = self.alloc.role_allocated("lim");
        let made = self.alloc.allocate(self.now);
        let limit = self
            .alloc
            .metrics()
            .roles
            .get("lim")
            .and_then(|r| r.quota_limit.clone());
        if let Some(limit) = limit {
            let after = self.alloc.role_allocated("lim");
            for (kind, max) in limit.iter() {
                prop_assert!(
                    after.milli(kind) <= max.max(before_lim.milli(kind)),
                    "limit {limit} exceeded by new offers: {before_lim} -> {after}"
                );
            }
        }
        // One offer per (framework, agent, role) per cycle, whatever stage granted it.
        let mut seen = std::collections::BTreeSet::new();
        for o in &made {
            prop_assert!(
                seen.insert((o.framework, o.agent, o.role.clone())),
                "two offers to {} on {} in role {} in one cycle",
                o.framework,
                o.agent,
                o.role
            );
        }
        for o in &made {
            prop_assert!(!o.resources.is_empty(), "empty offer");
            if let Some(task) = self.demands.get(&o.framework) {
                // Demand-aware offers hold whole tasks, nothing else.
                let total = o.resources.total();
                let (k, per) = task.iter().next().unwrap();
                let n = total.milli(k) / per;
                prop_assert!(n >= 1, "offer {total} holds no whole task {task}");
                let mut want = Resources::new();
                for (name, milli) in task.iter() {
                    want.set_milli(name, milli * n);
                }
                prop_assert_eq!(total, want, "offer is not {} whole tasks", n);
            }
            prop_assert!(
                self.frameworks
                    .iter()
                    .any(|(f, r)| *f == o.framework && *r == o.role),
                "offer to a framework of another role"
            );
        }
        Ok(())
    }

    fn check_invariants(&self) -> Result<(), TestCaseError> {
        let offers = self.offers();
        for o in &offers {
            for role in o.resources.reserved.keys() {
                prop_assert!(
                    is_ancestor_or_self(role, &o.role),
                    "reservation of {role} offered to role {}",
                    o.role
                );
            }
        }
        for (a, total) in &self.agents {
            // Offers plus resources in use never exceed the agent, pool by pool.
            let mut unres = Resources::new();
            let mut resv: BTreeMap<String, Resources> = BTreeMap::new();
            let mut add = |r: &OfferResources| {
                unres.add_assign(&r.unreserved);
                for (k, v) in &r.reserved {
                    resv.entry(k.clone()).or_default().add_assign(v);
                }
            };
            for o in offers.iter().filter(|o| o.agent == *a) {
                add(&o.resources);
            }
            for (f, _) in &self.frameworks {
                add(&self.alloc.in_use(*f, *a));
            }
            prop_assert!(
                total.unreserved.contains(&unres),
                "agent over-allocated: {unres} > {}",
                total.unreserved
            );
            for (k, v) in &resv {
                let have = total.reserved.get(k).cloned().unwrap_or_default();
                prop_assert!(
                    have.contains(v),
                    "reservation {k} over-allocated: {v} > {have}"
                );
            }
        }
        for (f, _) in &self.frameworks {
            // Offered resources count as allocated.
            let mut sum = Resources::new();
            for o in offers.iter().filter(|o| o.framework == *f) {
                sum.add_assign(&o.resources.total());
            }
            for (a, _) in &self.agents {
                sum.add_assign(&self.alloc.in_use(*f, *a).total());
            }
            prop_assert_eq!(self.alloc.framework_allocated(*f).total(), sum);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96),
        ..ProptestConfig::default()
    })]

    #[test]
    fn invariants_hold_over_random_event_sequences(ops in proptest::collection::vec(op(), 1..60)) {
        let mut m = Model::new();
        for op in &ops {
            m.apply(op)?;
        }
    }

    /// A role with a guarantee gets it as soon as it has a framework that wants offers, whatever
    /// other roles did before.
    #[test]
    fn guarantees_are_honoured_while_their_role_has_demand(
        agents in proptest::collection::vec(1u8..32, 1..8),
        greedy in proptest::collection::vec((0usize..3, 0u8..=100), 0..12),
        guarantee_percent in 1u8..60,
    ) {
        let mut alloc = Allocator::new(AllocatorConfig::default());
        let total_cpus: u32 = agents.iter().map(|c| *c as u32).sum();
        let g = (total_cpus * guarantee_percent as u32 / 100).max(1);
        alloc.set_quota("q", Some(Resources::new().with("cpus", g as f64)), None).unwrap();
        for (i, c) in agents.iter().enumerate() {
            alloc.add_agent(AgentId::from_u128(100 + i as u128), "h", cpus_mem(*c, 4), BTreeMap::new());
        }
        for i in 0..3u128 {
            alloc.add_framework(FrameworkId::from_u128(i + 1), &format!("g{i}"), &[format!("r{i}")], false, None);
        }
        // Other roles grab what they can, accepting random parts, over several cycles.
        let mut now = 0;
        for (who, percent) in &greedy {
            now += 1000;
            for o in alloc.allocate(now) {
                let keep = o.framework == FrameworkId::from_u128(*who as u128 + 1);
                let used = if keep { part_offer(&o.resources, *percent) } else { OfferResources::default() };
                alloc.accept(o.id, &used, Some(0), now).unwrap();
            }
        }
        alloc.add_framework(FrameworkId::from_u128(99), "quota-fw", &["q".to_string()], false, None);
        alloc.allocate(now + 1000);
        let got = alloc.role_allocated("q").milli("cpus");
        prop_assert!(got >= g as u64 * 1000, "q got {got} milli-cpus, guarantee {g} cpus");
    }

    /// With no filters or suppression, the first offer after adding an agent goes to the
    /// framework of the lowest weighted-share role, and the lowest-share framework inside it.
    #[test]
    fn next_offer_goes_to_lowest_share(
        held in proptest::collection::vec((0usize..3, 0usize..2, 0u8..16, 0u8..16), 1..12),
        weights in proptest::collection::vec(1u8..5, 3),
    ) {
        let mut alloc = Allocator::new(AllocatorConfig::default());
        let roles = ["r0", "r1", "r2"];
        for (i, w) in weights.iter().enumerate() {
            alloc.set_weight(roles[i], *w as f64);
        }
        let mut fws = Vec::new();
        for (r, role) in roles.iter().enumerate() {
            for k in 0..2 {
                let id = FrameworkId::from_u128((r * 2 + k + 1) as u128);
                alloc.add_framework(id, &format!("f{r}{k}"), &[role.to_string()], false, None);
                fws.push((id, *role));
            }
        }
        // Existing allocations (running tasks) exactly filling a big agent, so it has nothing
        // free to offer.
        let (mut c_sum, mut m_sum) = (0u32, 0u32);
        for (_, _, c, m) in &held {
            c_sum += *c as u32;
            m_sum += *m as u32;
        }
        let big = AgentId::from_u128(1000);
        let big_res = Resources::new().with("cpus", c_sum as f64).with("mem", m_sum as f64 * 256.0);
        alloc.add_agent(big, "big", big_res, BTreeMap::new());
        for (r, k, c, m) in &held {
            if *c == 0 && *m == 0 {
                continue;
            }
            let (f, role) = fws[r * 2 + k];
            alloc.add_allocation(f, big, role, &OfferResources::unreserved(cpus_mem(*c, *m))).unwrap();
        }
        // Shares before the new agent arrives (its resources change the total).
        alloc.add_agent(AgentId::from_u128(2000), "new", cpus_mem(1, 1), BTreeMap::new());
        let role_share: Vec<f64> = roles.iter().map(|r| alloc.role_share(r)).collect();
        let fw_share: Vec<f64> = fws.iter().map(|(f, _)| alloc.framework_share(*f)).collect();
        let offers: Vec<_> = alloc.allocate(1).into_iter().filter(|o| o.agent == AgentId::from_u128(2000)).collect();
        prop_assert_eq!(offers.len(), 1);
        let o = &offers[0];
        let ri = roles.iter().position(|r| *r == o.role).unwrap();
        for s in &role_share {
            prop_assert!(role_share[ri] <= *s + 1e-12, "role {} share {} is not the lowest {:?}", o.role, role_share[ri], role_share);
        }
        let fi = fws.iter().position(|(f, _)| *f == o.framework).unwrap();
        for (j, (_, r)) in fws.iter().enumerate() {
            if *r == o.role {
                prop_assert!(fw_share[fi] <= fw_share[j] + 1e-12, "framework share not the lowest in its role");
            }
        }
    }
}
