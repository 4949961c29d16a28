//! Adopting resources already in use: when an agent re-registers with running tasks the
//! master does not know (after a master failover), their resources are charged to their
//! framework without an offer.

use gantry_sdk::protocol::{AgentId, FrameworkId};

use super::{dense, Allocator, OfferResources};

impl Allocator {
    /// Records `resources` as in use by `framework` on `agent`. Returns false (and changes
    /// nothing) if the framework or agent is unknown, or the agent does not have them free.
    pub fn add_used(
        &mut self,
        framework: FrameworkId,
        agent: AgentId,
        resources: &OfferResources,
    ) -> bool {
        let (Some(&f), Some(&a)) = (self.fw_ids.get(&framework), self.agent_ids.get(&agent)) else {
            return false;
        };
        let Some(b) = self.try_bundle(resources) else {
            return false;
        };
        let role = {
            let fw = self.fw_mut(f);
            match fw.roles.first() {
                Some(r) => r.role,
                None => return false,
            }
        };
        {
            let ag = self.ag_mut(a);
            if !ag.free.contains(&b) {
                return false;
            }
            ag.free.sub(&b);
            ag.stable = None;
            match ag.inuse.iter_mut().find(|(x, r, _)| *x == f && *r == role) {
                Some((_, _, held)) => held.add(&b),
                None => ag.inuse.push((f, role, b.clone())),
            }
        }
        dense::sub(&mut self.free_unres, &b.unres);
        self.fw_mut(f).inuse_agents.insert(a);
        self.charge(f, role, &b, true);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::AllocatorConfig;

    #[test]
    fn adopted_resources_count_and_recover() {
        let mut al = Allocator::new(AllocatorConfig::default());
        let (a, f) = (AgentId::from_u128(1), FrameworkId::from_u128(2));
        al.add_agent(
            a,
            "a",
            "cpus:4;mem:100".parse().unwrap(),
            Default::default(),
        );
        al.add_framework(f, "f", &["r".to_string()], false, None);
        let used = OfferResources::unreserved("cpus:3".parse().unwrap());
        assert!(al.add_used(f, a, &used));
        assert!(!al.add_used(f, a, &used), "only 1 cpu is left");
        assert_eq!(al.framework_allocated(f).total(), "cpus:3".parse().unwrap());
        al.recover(f, a, &used);
        assert!(al.framework_allocated(f).is_empty());
    }
}
