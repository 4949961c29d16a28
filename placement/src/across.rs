//! Placing tasks across the offers a framework holds with the fragmentation-aware policy (the
//! live path of `simulate --openb`): [`OfferPlacer`] keeps one [`Node`] per agent it has been
//! offered, with what the offers it holds make free, and scores every agent with offers for
//! each task, as [`Placer`] does over a whole cluster. Offers are per agent, so a framework
//! that holds many offers chooses the agent; the master then only checks the accept and, for a
//! fraction, takes the GPU the framework pins ([`OfferPlacement::gpu`]).
//!
//! - An agent's capacity (for the best-fit tie-break and the scarcity weights) is the most of
//!   each resource its offers ever held: on a framework that sees an idle agent once, its size.
//!   A larger offer or another set of GPUs rebuilds the placer (rare); any other change
//!   re-evaluates that agent only ([`Placer::set_free`]).
//! - Several offers on one agent (several roles) add up; each offer's `gpu_free` is the
//!   agent's per-GPU view, the latest one is kept.
//! - [`OfferPlacer::take`] records a placement not yet accepted, so that several tasks can be
//!   placed in one round of offers; [`OfferPlacer::used`] hands back an agent's offer ids for
//!   the accept and forgets them (the master re-offers the rest).
//! - Only CPU, memory and GPUs are scored: a caller whose tasks ask for other kinds (disk,
//!   ports) checks them against the offer and [`OfferPlacer::withdraw`]s agents short of them.
//! - Whole GPUs are not pinned: idle GPUs are equal for fragmentation, and the master chooses
//!   them topology-aware ([`super::topology`]).

use std::collections::HashMap;

use gantry_proto::{AgentId, GpuSelector, Offer, OfferId};

use super::{
    GpuDemand, GpuShare, ModelId, Models, Node, Placement, PlacementError, Placer, Policy,
    TaskShape, Workload, GPU_MILLI,
};

/// Where a task goes among the offers held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferPlacement {
    /// The agent chosen.
    pub agent_id: AgentId,
    /// The offers held on that agent (what to accept).
    pub offer_ids: Vec<OfferId>,
    /// For a fraction of one GPU: the GPU (UUID) to pin in the task's
    /// [`GpuSelector::uuids`]. `None` for whole GPUs (the master picks idle ones) and tasks
    /// without GPUs.
    pub gpu: Option<String>,
    /// The placement on the placer's node of the agent.
    placement: Placement,
}

/// One agent as the offers held describe it.
#[derive(Debug, Clone)]
struct HeldAgent {
    id: AgentId,
    model: ModelId,
    cpu_capacity: u64,
    memory_capacity: u64,
    uuids: Vec<String>,
    /// `(offer, cpu milli, memory MiB)` of each offer held.
    offers: Vec<(OfferId, u64, u64)>,
    /// Free milli-GPU per GPU, from the latest offer with GPUs.
    gpu_free: Vec<u32>,
    /// What placements not yet accepted took: CPU, memory, milli-GPU per GPU.
    taken_cpu: u64,
    taken_memory: u64,
    taken_gpu: Vec<u32>,
}

impl HeldAgent {
    /// What is free now: nothing without offers.
    fn free(&self) -> (u64, u64, Vec<u32>) {
        if self.offers.is_empty() {
            return (0, 0, vec![0; self.uuids.len()]);
        }
        let cpu: u64 = self.offers.iter().map(|o| o.1).sum();
        let memory: u64 = self.offers.iter().map(|o| o.2).sum();
        let gpus = self
            .gpu_free
            .iter()
            .zip(&self.taken_gpu)
            .map(|(f, t)| f.saturating_sub(*t))
            .collect();
        (
            cpu.saturating_sub(self.taken_cpu).min(self.cpu_capacity),
            memory
                .saturating_sub(self.taken_memory)
                .min(self.memory_capacity),
            gpus,
        )
    }

    fn node(&self) -> Node {
        let (cpu, memory, gpus) = self.free();
        Node {
            model: self.model,
            cpu_capacity: self.cpu_capacity,
            memory_capacity: self.memory_capacity,
            cpu_free: cpu,
            memory_free: memory,
            gpu_free: gpus,
        }
    }

    fn forget_taken(&mut self) {
        self.taken_cpu = 0;
        self.taken_memory = 0;
        self.taken_gpu = vec![0; self.uuids.len()];
    }
}

/// Scores candidate agents across the offers a framework holds (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct OfferPlacer {
    models: Models,
    policy: Policy,
    workload: Workload,
    seed: u64,
    selector: Option<GpuSelector>,
    agents: Vec<HeldAgent>,
    index: HashMap<AgentId, usize>,
    offer_agent: HashMap<OfferId, usize>,
    /// `None` until the first choice and after an agent joined or grew: rebuilt then.
    placer: Option<Placer>,
    rebuilds: u64,
}

impl OfferPlacer {
    /// A placer with no offers. `models` interns the GPU model names the `workload`'s shapes
    /// name (offers' GPU names are interned into it too); `seed` drives tie-breaks.
    pub fn new(models: Models, policy: Policy, workload: Workload, seed: u64) -> OfferPlacer {
        OfferPlacer {
            models,
            policy,
            workload,
            seed,
            selector: None,
            agents: Vec::new(),
            index: HashMap::new(),
            offer_agent: HashMap::new(),
            placer: None,
            rebuilds: 0,
        }
    }

    /// Only GPUs this selector admits (model, memory) count as an agent's GPUs.
    pub fn with_selector(mut self, selector: Option<GpuSelector>) -> OfferPlacer {
        self.selector = selector;
        self
    }

    /// The GPU model names interned so far.
    pub fn models(&self) -> &Models {
        &self.models
    }

    /// Agents known (offered at least once).
    pub fn agents(&self) -> usize {
        self.agents.len()
    }

    /// Offers held.
    pub fn held(&self) -> usize {
        self.offer_agent.len()
    }

    /// Holds these offers (an offer already held is ignored).
    pub fn add_offers<'a>(
        &mut self,
        offers: impl IntoIterator<Item = &'a Offer>,
    ) -> Result<(), PlacementError> {
        for offer in offers {
            if self.offer_agent.contains_key(&offer.id) {
                continue;
            }
            self.add_offer(offer)?;
        }
        Ok(())
    }

    fn add_offer(&mut self, offer: &Offer) -> Result<(), PlacementError> {
        let total = offer.total();
        let cpu = total.milli("cpus");
        let memory = total.milli("mem") / 1000;
        let gpus: Vec<_> = offer
            .gpus
            .iter()
            .filter(|g| {
                g.healthy
                    && g.mig_profile.is_none()
                    && GpuSelector::admits(self.selector.as_ref(), g)
            })
            .collect();
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        let free: Vec<u32> = gpus
            .iter()
            .map(|g| {
                offer
                    .gpu_free
                    .iter()
                    .find(|f| f.uuid == g.uuid)
                    .map_or(GPU_MILLI, |f| f.free_milli.min(GPU_MILLI))
            })
            .collect();
        let i = match self.index.get(&offer.agent_id) {
            Some(&i) => i,
            None => {
                let model = self
                    .models
                    .intern(gpus.first().map_or("", |g| g.name.as_str()))?;
                self.index.insert(offer.agent_id, self.agents.len());
                self.agents.push(HeldAgent {
                    id: offer.agent_id,
                    model,
                    cpu_capacity: 0,
                    memory_capacity: 0,
                    uuids: uuids.clone(),
                    offers: Vec::new(),
                    gpu_free: vec![0; uuids.len()],
                    taken_cpu: 0,
                    taken_memory: 0,
                    taken_gpu: vec![0; uuids.len()],
                });
                self.placer = None;
                self.agents.len() - 1
            }
        };
        let agent = &mut self.agents[i];
        if !gpus.is_empty() && uuids != agent.uuids {
            // Another set of GPUs (one became unhealthy or healthy again): start over.
            agent.model = self.models.intern(&gpus[0].name)?;
            agent.uuids = uuids;
            agent.gpu_free = vec![0; agent.uuids.len()];
            agent.forget_taken();
            self.placer = None;
        }
        if !gpus.is_empty() {
            agent.gpu_free = free;
        } else if agent.offers.is_empty() {
            // An offer without GPUs: the agent's GPUs are taken.
            agent.gpu_free = vec![0; agent.uuids.len()];
        }
        agent.offers.push((offer.id, cpu, memory));
        self.offer_agent.insert(offer.id, i);
        let held_cpu: u64 = agent.offers.iter().map(|o| o.1).sum();
        let held_memory: u64 = agent.offers.iter().map(|o| o.2).sum();
        if held_cpu > agent.cpu_capacity || held_memory > agent.memory_capacity {
            agent.cpu_capacity = agent.cpu_capacity.max(held_cpu);
            agent.memory_capacity = agent.memory_capacity.max(held_memory);
            self.placer = None;
        }
        self.sync(i)
    }

    /// Forgets a rescinded (or declined) offer.
    pub fn rescind(&mut self, offer: OfferId) -> Result<(), PlacementError> {
        let Some(i) = self.offer_agent.remove(&offer) else {
            return Ok(());
        };
        let agent = &mut self.agents[i];
        agent.offers.retain(|o| o.0 != offer);
        if agent.offers.is_empty() {
            agent.forget_taken();
        }
        self.sync(i)
    }

    /// The offers held on `agent`, forgotten (they go into an accept or a decline): the agent
    /// is a candidate again when the master offers it again.
    pub fn used(&mut self, agent: AgentId) -> Result<Vec<OfferId>, PlacementError> {
        let Some(&i) = self.index.get(&agent) else {
            return Ok(Vec::new());
        };
        let a = &mut self.agents[i];
        let ids: Vec<OfferId> = a.offers.drain(..).map(|o| o.0).collect();
        a.forget_taken();
        for id in &ids {
            self.offer_agent.remove(id);
        }
        self.sync(i)?;
        Ok(ids)
    }

    /// Takes `agent` out of the candidates until its next offer (its offers stay held and are
    /// returned by [`OfferPlacer::used`]).
    pub fn withdraw(&mut self, agent: AgentId) -> Result<(), PlacementError> {
        let Some(&i) = self.index.get(&agent) else {
            return Ok(());
        };
        let a = &mut self.agents[i];
        a.taken_cpu = u64::MAX / 2;
        a.taken_memory = u64::MAX / 2;
        a.taken_gpu = vec![GPU_MILLI; a.uuids.len()];
        self.sync(i)
    }

    /// Where `task` goes among the agents with offers held, by the policy; `None` when it fits
    /// none. Does not take anything: see [`OfferPlacer::take`].
    pub fn choose(&mut self, task: &TaskShape) -> Option<OfferPlacement> {
        let placer = self.placer()?;
        let placement = placer.choose(task)?;
        let agent = self.agents.get(placement.node)?;
        let gpu = match task.gpu {
            GpuDemand::Fraction(_) => placement
                .gpus
                .first()
                .and_then(|s| agent.uuids.get(s.gpu))
                .cloned(),
            _ => None,
        };
        Some(OfferPlacement {
            agent_id: agent.id,
            offer_ids: agent.offers.iter().map(|o| o.0).collect(),
            gpu,
            placement,
        })
    }

    /// Records that `placement` (from [`OfferPlacer::choose`]) is given to `task`: later
    /// choices see the agent with less free.
    pub fn take(
        &mut self,
        placement: &OfferPlacement,
        task: &TaskShape,
    ) -> Result<(), PlacementError> {
        let i = placement.placement.node;
        let node = self
            .placer
            .as_ref()
            .and_then(|p| p.nodes().get(i))
            .ok_or(PlacementError::Mismatch(i))?;
        let fits = node.cpu_free >= task.cpu_milli
            && node.memory_free >= task.memory_mib
            && placement
                .placement
                .gpus
                .iter()
                .all(|s: &GpuShare| node.gpu_free.get(s.gpu).is_some_and(|&f| f >= s.milli));
        if !fits {
            return Err(PlacementError::Mismatch(i));
        }
        let agent = &mut self.agents[i];
        agent.taken_cpu += task.cpu_milli;
        agent.taken_memory += task.memory_mib;
        for s in &placement.placement.gpus {
            if let Some(t) = agent.taken_gpu.get_mut(s.gpu) {
                *t = t.saturating_add(s.milli).min(GPU_MILLI);
            }
        }
        self.sync(i)
    }

    /// [`OfferPlacer::choose`] then [`OfferPlacer::take`].
    pub fn place(&mut self, task: &TaskShape) -> Option<OfferPlacement> {
        let p = self.choose(task)?;
        self.take(&p, task).ok()?;
        Some(p)
    }

    /// The placer over every known agent, rebuilt when needed.
    fn placer(&mut self) -> Option<&mut Placer> {
        if self.placer.is_none() {
            let nodes = self.agents.iter().map(HeldAgent::node).collect();
            self.rebuilds += 1;
            let seed = self.seed.wrapping_add(self.rebuilds - 1);
            self.placer = Placer::new(nodes, self.policy, self.workload.clone(), seed).ok();
        }
        self.placer.as_mut()
    }

    /// Brings agent `i`'s node in the placer up to date.
    fn sync(&mut self, i: usize) -> Result<(), PlacementError> {
        let Some(placer) = self.placer.as_mut() else {
            return Ok(());
        };
        let (cpu, memory, gpus) = self.agents[i].free();
        placer.set_free(i, cpu, memory, &gpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelSet;
    use gantry_proto::{FrameworkId, GpuFree, GpuInfo};

    fn gpu(agent: u128, g: u32) -> GpuInfo {
        GpuInfo {
            uuid: format!("GPU-{agent}-{g}"),
            name: "A100".into(),
            memory_mib: 40_960,
            compute_capability: (8, 0),
            minor: g,
            pci_bus_id: String::new(),
            numa_node: None,
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        }
    }

    /// An offer of `agent` with `cpus` cores, 64 GiB and GPUs with these free milli-GPUs.
    fn offer(id: u128, agent: u128, cpus: u64, free: &[u32]) -> Offer {
        let gpus: Vec<GpuInfo> = (0..free.len() as u32).map(|g| gpu(agent, g)).collect();
        let total: u64 = free.iter().map(|&f| u64::from(f)).sum();
        let mut resources = gantry_proto::Resources::default();
        resources.set_milli("cpus", cpus * 1000);
        resources.set_milli("mem", 65_536 * 1000);
        if total > 0 {
            resources.set_milli("gpus", total);
        }
        Offer {
            id: OfferId::from_u128(id),
            framework_id: FrameworkId::from_u128(1),
            agent_id: AgentId::from_u128(agent),
            hostname: "h".into(),
            role: "r".into(),
            resources,
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: gpus.clone().into(),
            gpu_free: gpus
                .iter()
                .zip(free)
                .map(|(g, &f)| GpuFree {
                    uuid: g.uuid.clone(),
                    free_milli: f,
                    free_memory_mib: 0,
                })
                .collect(),
            agent_name: format!("a{agent}"),
        }
    }

    fn shape(gpu: GpuDemand) -> TaskShape {
        TaskShape {
            cpu_milli: 1000,
            memory_mib: 1024,
            gpu,
            models: ModelSet::ANY,
        }
    }

    fn placer(workload: &[(TaskShape, u64)]) -> OfferPlacer {
        OfferPlacer::new(
            Models::new(),
            Policy::FgdPack,
            Workload::new(workload.iter().copied()),
            1,
        )
    }

    /// Arrival order puts the half GPU on the idle agent; the fragmentation-aware choice puts
    /// it on the agent whose GPU is half used, keeping the idle GPU whole.
    #[test]
    fn a_fraction_goes_to_the_agent_it_fragments_least() {
        let half = shape(GpuDemand::Fraction(500));
        let whole = shape(GpuDemand::Whole(1));
        let mut p = placer(&[(half, 1), (whole, 1)]);
        // Agent 1 first (idle), agent 2 with its GPU half used.
        p.add_offers(&[offer(10, 1, 8, &[1000]), offer(20, 2, 8, &[500])])
            .unwrap();
        let choice = p.place(&half).expect("fits");
        assert_eq!(choice.agent_id, AgentId::from_u128(2));
        assert_eq!(choice.offer_ids, vec![OfferId::from_u128(20)]);
        assert_eq!(choice.gpu.as_deref(), Some("GPU-2-0"));
        // Agent 2's GPU is full now: the whole GPU goes to agent 1, unpinned.
        let next = p.place(&whole).expect("fits");
        assert_eq!(next.agent_id, AgentId::from_u128(1));
        assert_eq!(next.gpu, None);
        // Nothing left for another whole GPU.
        assert!(p.choose(&whole).is_none());
    }

    #[test]
    fn used_and_rescinded_offers_stop_being_candidates_until_offered_again() {
        let half = shape(GpuDemand::Fraction(500));
        let mut p = placer(&[(half, 1)]);
        p.add_offers(&[offer(10, 1, 8, &[1000]), offer(20, 2, 8, &[1000])])
            .unwrap();
        let first = p.place(&half).expect("fits");
        let ids = p.used(first.agent_id).unwrap();
        assert_eq!(ids, first.offer_ids);
        assert_eq!(p.held(), 1);
        // The other agent takes the next one.
        let second = p.choose(&half).expect("fits");
        assert_ne!(second.agent_id, first.agent_id);
        p.rescind(second.offer_ids[0]).unwrap();
        assert!(p.choose(&half).is_none());
        // The master offers the rest of the first agent: its half-used GPU takes the task.
        let agent = first.agent_id.0.as_u128();
        p.add_offers(&[offer(30, agent, 7, &[500])]).unwrap();
        let third = p.place(&half).expect("fits");
        assert_eq!(third.agent_id, first.agent_id);
        assert_eq!(
            third.gpu.as_deref(),
            Some(format!("GPU-{agent}-0").as_str())
        );
        // Withdrawn agents are skipped; their offers stay held for the accept.
        p.withdraw(first.agent_id).unwrap();
        assert!(p.choose(&half).is_none());
        assert_eq!(
            p.used(first.agent_id).unwrap(),
            vec![OfferId::from_u128(30)]
        );
    }

    #[test]
    fn tasks_placed_in_one_round_see_each_other_and_cpu_limits_too() {
        let one = shape(GpuDemand::Whole(1));
        let mut p = placer(&[(one, 1)]);
        // 2 GPUs but CPU for one task only.
        p.add_offers(&[offer(10, 1, 1, &[1000, 1000])]).unwrap();
        assert!(p.place(&one).is_some());
        assert!(p.choose(&one).is_none());
    }

    #[test]
    fn a_selector_limits_the_gpus_and_an_offer_without_gpus_means_all_taken() {
        let half = shape(GpuDemand::Fraction(500));
        let mut p = placer(&[(half, 1)]).with_selector(Some(GpuSelector {
            model: Some("H100".into()),
            ..Default::default()
        }));
        p.add_offers(&[offer(10, 1, 8, &[1000])]).unwrap();
        assert!(p.choose(&half).is_none());
        let mut q = placer(&[(half, 1)]);
        q.add_offers(&[offer(10, 1, 8, &[1000])]).unwrap();
        q.used(AgentId::from_u128(1)).unwrap();
        let mut bare = offer(11, 1, 8, &[]);
        bare.gpus = Vec::new().into();
        q.add_offers(&[bare]).unwrap();
        assert!(q.choose(&half).is_none());
        assert!(q.choose(&shape(GpuDemand::None)).is_some());
    }
}
