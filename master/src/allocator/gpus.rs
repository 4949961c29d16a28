//! GPU shares in demand-aware splitting: when a framework's declared task asks for a fraction
//! of one GPU (`gpus` below 1), a task's worth is offered on an agent only when one of its GPUs
//! has room for the fraction, and the GPU is chosen with the same fragmentation-aware scoring
//! as the placement crate (`gantry_placement`, policy [`AllocatorConfig::gpu_placement`]); for
//! whole GPUs, only where that many are idle (chosen with the master's topology rule). The chosen shares are earmarked
//! while the offer is outstanding (so two task-worths are not counted on the same room) and
//! released when the offer ends (accepted, declined, rescinded, expired); the state reads them
//! ([`Allocator::offer_earmarks`], [`Allocator::agent_earmarks`]) so that the offer lists, and
//! its accept draws on, only its own shares, and other offers on the agent the rest. The
//! task's GPU is then the state's business (`state::gpus`), which tells the allocator each
//! GPU's free share ([`Allocator::set_agent_gpus`]). Agents without a per-GPU view keep the
//! scalar behaviour.

use gantry_placement::topology::{self, GpuSlot};
use gantry_placement::{GpuDemand, ModelSet, Models, Node, Placer, TaskShape, Workload, GPU_MILLI};

use super::*;

impl Allocator {
    /// Sets where each GPU of `agent`'s per-GPU view sits (its NUMA node and PCI root, in
    /// [`Allocator::set_agent_gpus`]' order): whole GPUs are earmarked with the master's own
    /// topology rule ([`gantry_placement::topology::assign`]), so a demand offer's GPUs are
    /// the ones its accept would be given. Without it, every GPU counts as one group.
    pub fn set_agent_gpu_topology(
        &mut self,
        agent: AgentId,
        topology: Vec<(Option<u32>, Option<String>)>,
    ) {
        let Some(&a) = self.agent_ids.get(&agent) else {
            return;
        };
        let ag = self.ag_mut(a);
        if ag.gpu_topology != topology {
            ag.gpu_topology = topology;
            ag.stable = None;
        }
    }

    /// The length of `agent`'s per-GPU topology ([`Allocator::set_agent_gpu_topology`]).
    pub fn gpu_topology_len(&self, agent: AgentId) -> usize {
        self.agent_ids
            .get(&agent)
            .map_or(0, |&a| self.ag(a).gpu_topology.len())
    }

    /// Sets the free milli-GPUs of each of `agent`'s GPUs (net of running tasks; GPUs in MIG
    /// mode and unhealthy GPUs left out). Earmarks of outstanding offers are kept.
    pub fn set_agent_gpus(&mut self, agent: AgentId, free: Vec<u32>) {
        let Some(&a) = self.agent_ids.get(&agent) else {
            return;
        };
        let ag = self.ag_mut(a);
        if ag.gpu_free == free {
            return;
        }
        if ag.gpu_offered.len() != free.len() {
            ag.gpu_offered = vec![0; free.len()];
        }
        ag.gpu_free = free;
        ag.stable = None;
    }

    /// For a task shape asking for GPUs on agent `a` with a per-GPU view: the shares to
    /// earmark, `(index, milli)` — for a fraction of one GPU the GPU chosen for it, for whole
    /// GPUs that many idle ones (the first); `Err(())` when the GPUs have no room (no task's
    /// worth here). Empty for shapes without GPUs or agents without a view.
    pub(super) fn task_gpus(&self, a: u32, task: &[u64]) -> Result<Vec<(u32, u32)>, ()> {
        let Some(g) = self.names.lookup("gpus") else {
            return Ok(Vec::new());
        };
        let milli = dense::at(task, g);
        let ag = self.ag(a);
        if milli == 0 || ag.gpu_free.is_empty() {
            return Ok(Vec::new());
        }
        let free: Vec<u32> = self.unearmarked(a).collect();
        if milli >= u64::from(GPU_MILLI) {
            let k = (milli / u64::from(GPU_MILLI)) as usize;
            let slots: Vec<GpuSlot> = free
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let (numa_node, pci_root) = ag.gpu_topology.get(i).cloned().unwrap_or_default();
                    GpuSlot {
                        numa_node,
                        pci_root,
                        healthy: true,
                        free: *f == GPU_MILLI,
                    }
                })
                .collect();
            let chosen = topology::assign(&slots, k).ok_or(())?;
            return Ok(chosen.into_iter().map(|i| (i as u32, GPU_MILLI)).collect());
        }
        let milli = milli as u32;
        if !free.iter().any(|&f| f >= milli) {
            return Err(());
        }
        let shape = TaskShape {
            cpu_milli: 0,
            memory_mib: 0,
            gpu: GpuDemand::Fraction(milli),
            models: ModelSet::ANY,
        };
        let whole = TaskShape {
            gpu: GpuDemand::Whole(1),
            ..shape
        };
        let mut models = Models::new();
        let model = models.intern("gpu").map_err(|_| ())?;
        let node = Node {
            gpu_free: free.clone(),
            ..Node::idle(model, 0, 0, 0)
        };
        let workload = Workload::new([(shape, 1), (whole, 1)]);
        let chosen = Placer::new(vec![node], self.config.gpu_placement, workload, 0)
            .ok()
            .and_then(|mut p| p.choose(&shape))
            .and_then(|p| p.gpus.first().map(|s| s.gpu))
            .filter(|&i| free.get(i).is_some_and(|&f| f >= milli))
            .or_else(|| free.iter().position(|&f| f >= milli))
            .ok_or(())?;
        Ok(vec![(chosen as u32, milli)])
    }

    /// The shares an outstanding offer earmarked, `(index, milli)` over the agent's per-GPU
    /// view ([`Allocator::set_agent_gpus`]' order): a fraction's task's worth is offered on
    /// that GPU only. Empty for other offers (and unknown ones).
    pub fn offer_earmarks(&self, offer: OfferId) -> &[(u32, u32)] {
        self.offers.get(&offer).map_or(&[], |st| st.gpus.as_slice())
    }

    /// The milli-GPUs of each of `agent`'s GPUs (per-GPU view order) earmarked by its
    /// outstanding offers; empty when there are none.
    pub fn agent_earmarks(&self, agent: AgentId) -> &[u32] {
        match self.agent_ids.get(&agent) {
            Some(&a) if self.ag(a).gpu_offered.iter().any(|m| *m > 0) => &self.ag(a).gpu_offered,
            _ => &[],
        }
    }

    /// The milli-GPUs of each GPU of agent `a`'s per-GPU view that no outstanding offer
    /// earmarked (empty without a view).
    pub(super) fn unearmarked(&self, a: u32) -> impl Iterator<Item = u32> + '_ {
        let ag = self.ag(a);
        ag.gpu_free
            .iter()
            .zip(ag.gpu_offered.iter().chain(std::iter::repeat(&0)))
            .map(|(f, o)| f.saturating_sub(*o).min(GPU_MILLI))
    }

    /// Earmarks `gpus` on agent `a` (a task's worth was offered).
    pub(super) fn earmark_gpus(&mut self, a: u32, gpus: &[(u32, u32)]) {
        let ag = self.ag_mut(a);
        for &(i, m) in gpus {
            if let Some(o) = ag.gpu_offered.get_mut(i as usize) {
                *o = o.saturating_add(m);
            }
        }
    }

    /// Releases the earmarks of an offer that ended.
    pub(super) fn release_gpus(&mut self, a: u32, gpus: &[(u32, u32)]) {
        if gpus.is_empty() {
            return;
        }
        let ag = self.ag_mut(a);
        for &(i, m) in gpus {
            if let Some(o) = ag.gpu_offered.get_mut(i as usize) {
                *o = o.saturating_sub(m);
            }
        }
        ag.stable = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(s: &str) -> Resources {
        Resources::parse(s).unwrap()
    }

    /// An allocator with one GPU framework declaring `count` tasks of `task`.
    fn demanding(task: &str, count: u32) -> (Allocator, AgentId) {
        let mut a = Allocator::new(AllocatorConfig::default());
        a.add_framework(
            FrameworkId::from_u128(1),
            "f",
            &["r".to_string()],
            true,
            Some(Demand {
                task: res(task),
                count,
                gpu_model: None,
            }),
        );
        (a, AgentId::from_u128(1))
    }

    #[test]
    fn a_fraction_is_offered_only_where_one_gpu_has_room() {
        let (mut a, agent) = demanding("cpus:1;gpus:0.5", 5);
        a.add_agent(agent, "h1", res("cpus:8;gpus:2"), BTreeMap::new());
        // 0.4 and 0.9 free: the scalar would hold two halves, one GPU holds one.
        a.set_agent_gpus(agent, vec![400, 900]);
        let o = a.allocate(0).remove(0);
        assert_eq!(o.resources.unreserved, res("cpus:1;gpus:0.5"));
        // The earmark goes with the offer: declined, the same task's worth is offered again.
        a.decline(o.id, Some(0), 0).unwrap();
        let o = a.allocate(1).remove(0);
        assert_eq!(o.resources.unreserved, res("cpus:1;gpus:0.5"));
        a.decline(o.id, Some(0), 1).unwrap();
        // Two idle GPUs: four halves (two per GPU, packed by the scoring).
        a.set_agent_gpus(agent, vec![1000, 1000]);
        let o = a.allocate(2).remove(0);
        assert_eq!(o.resources.unreserved, res("cpus:4;gpus:2"));
        // Nothing left to earmark: no GPU has room for another half.
        a.set_agent_gpus(agent, vec![300, 300]);
        a.decline(o.id, Some(0), 2).unwrap();
        assert!(a.allocate(3).is_empty());
    }

    #[test]
    fn whole_gpus_are_earmarked_with_the_topology_rule() {
        let (mut a, agent) = demanding("cpus:1;gpus:2", 1);
        a.add_agent(agent, "h1", res("cpus:8;gpus:4"), BTreeMap::new());
        // GPUs 0 and 1 on NUMA node 0 (GPU 0 half taken), 2 and 3 on node 1: the pair on
        // node 1, not the first two idle ones (1 and 2, across nodes).
        let numa = |n| (Some(n), None);
        a.set_agent_gpu_topology(agent, vec![numa(0), numa(0), numa(1), numa(1)]);
        a.set_agent_gpus(agent, vec![500, 1000, 1000, 1000]);
        let o = a.allocate(0).remove(0);
        assert_eq!(o.resources.unreserved, res("cpus:1;gpus:2"));
        assert_eq!(a.offer_earmarks(o.id), [(2, 1000), (3, 1000)]);
        assert_eq!(a.agent_earmarks(agent), [0, 0, 1000, 1000]);
        // Too few idle GPUs: no task's worth.
        a.decline(o.id, Some(0), 0).unwrap();
        assert!(a.agent_earmarks(agent).is_empty());
        a.set_agent_gpus(agent, vec![500, 1000, 500, 500]);
        assert!(a.allocate(1).is_empty());
    }
}
