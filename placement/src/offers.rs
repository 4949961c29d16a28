//! Offer-level placement (pure): fit task requests into the offers a framework holds, across
//! every resource kind, with GPU selectors, agent attributes and NUMA locality.
//!
//! - [`AgentView`]: what one agent offers now: its offers' ids, the offered [`Resources`]
//!   (every kind: `cpus`, `mem`, `gpus`, `disk`, ports...), its attributes and the GPUs the
//!   `gpus` amount can be drawn from ([`FreeGpu`]: model, memory, NUMA node, PCI bus).
//!   [`AgentView::from_offers`] builds the views from [`Offer`]s, leaving out GPUs the caller
//!   knows are busy (its own running tasks' GPUs, from their status updates).
//! - [`TaskRequest`]: resources, an optional [`GpuSelector`] (model, memory), attribute
//!   [`Constraint`]s and a [`Locality`] for multi-GPU tasks.
//! - [`OfferGroup`] / [`group_offers`]: a framework's offers per agent and role, summed — the
//!   unit an `accept` or `decline` acts on (the master acts on all of a framework's offers on an
//!   agent at once, docs/allocator.md rule 2). The simplest schedulers need only this.
//! - [`place_one`] / [`place_all`]: where one task goes, or a set of tasks all together
//!   (all-or-nothing: a [`Plan`] for every task or an error naming the first that did not fit).
//!   Tasks ask for whole GPUs or a fraction of one GPU (`gpus` below 1, milli-GPU precision,
//!   as the master reads it); a `gpus` above one that is not whole is refused
//!   ([`PlaceError::BadGpuAmount`]).
//!   [`Plan::launches`] groups the assignments per agent: one `accept` per agent, all sent in
//!   one step.
//!
//! ## Scoring (lower is better, compared in this order)
//! For each agent that can host the task, the GPUs it would get are chosen first (below), then
//! the agent is scored by what placing the task there leaves behind:
//! 1. **Stranded GPUs**: free GPUs left on the agent that no task of the reference shape could
//!    use because the agent's CPU or memory would run out first. The reference shape is the
//!    task's own CPU and memory per GPU (for a CPU-only task: the agent's offered CPU and
//!    memory per offered GPU, so a CPU-only task avoids eating the CPU that GPUs need).
//! 2. **Locality**: how many NUMA nodes the task's GPUs span beyond the first (0 for a task
//!    within one NUMA node).
//! 3. **Broken NUMA nodes**: NUMA nodes that would be left partly free (neither idle nor full)
//!    on the agent: keeps whole NUMA nodes for later multi-GPU tasks.
//! 4. **Best fit**: the fraction of each offered resource kind left free after placing,
//!    summed (in millionths): the fullest agent wins, leaving emptier agents whole.
//! 5. The agent's position in the input (deterministic).
//!
//! **Fractions of a GPU** are placed with the fragmentation-aware policy the SDK's
//! [`crate::across::OfferPlacer`] uses ([`crate::Policy::DEFAULT`]): each agent that can host
//! the task (constraints, every resource kind) becomes a [`crate::Node`] whose GPUs are the
//! matching ones with their free share ([`FreeGpu::free_milli`], from the offers' `gpu_free`),
//! scored against a workload of the task's own shape plus one whole GPU, so that fractions pack
//! onto GPUs already shared and idle GPUs stay whole for whole-GPU tasks. The plan names the
//! GPU the fraction shares (pin it: [`Assignment::pinned_selector`]). A whole-GPU task takes
//! only idle GPUs (free share 1000).
//!
//! GPUs on an agent: those matching the selector, grouped by NUMA node. When one NUMA node has
//! enough, the one with the fewest free matching GPUs that still fits (best fit within NUMA);
//! else (only when [`Locality`] allows spanning) the largest groups first. Within a NUMA node,
//! GPUs are taken in PCI bus order, so the task's GPUs sit on neighbouring buses. The agent makes
//! the final choice of devices at launch with the same NUMA-first rule; the plan's GPU list is
//! what the framework expects it to pick (and what the scoring assumes).

use std::collections::BTreeMap;

use gantry_proto::resources::{GpuAmount, MILLI};
use gantry_proto::{AgentId, Attributes, GpuInfo, GpuSelector, Offer, OfferId, Resources};

use crate::{GpuDemand, ModelSet, Models, Node, Placer, Policy, TaskShape, Workload};

/// A framework's offers on one agent in one role: accept or decline them together.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferGroup {
    /// The agent.
    pub agent_id: AgentId,
    /// The role the offers are in (one accept may not mix roles).
    pub role: String,
    /// Every offer of the group, in the order received.
    pub offer_ids: Vec<OfferId>,
    /// What they offer together.
    pub resources: Resources,
}

/// Groups `offers` per agent and role (first-seen order): one [`OfferGroup`] for each accept or
/// decline to send.
pub fn group_offers<'a>(offers: impl IntoIterator<Item = &'a Offer>) -> Vec<OfferGroup> {
    let mut groups: Vec<OfferGroup> = Vec::new();
    for offer in offers {
        match groups
            .iter_mut()
            .find(|g| g.agent_id == offer.agent_id && g.role == offer.role)
        {
            Some(g) => {
                g.offer_ids.push(offer.id);
                g.resources.add_assign(&offer.total());
            }
            None => groups.push(OfferGroup {
                agent_id: offer.agent_id,
                role: offer.role.clone(),
                offer_ids: vec![offer.id],
                resources: offer.total(),
            }),
        }
    }
    groups
}

/// A GPU an agent's offers can draw from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeGpu {
    /// NVML UUID.
    pub uuid: String,
    /// Model name.
    pub model: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// NUMA node (`None`: unknown, treated as one node).
    pub numa_node: Option<u32>,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Free milli-GPUs (1000: idle; less: fractions of tasks already share it). Whole-GPU
    /// tasks take only idle GPUs; a fraction needs at least its share free.
    pub free_milli: u32,
}

impl FreeGpu {
    /// Whether no fraction shares it.
    pub fn is_idle(&self) -> bool {
        self.free_milli >= MILLI as u32
    }

    fn info(&self) -> GpuInfo {
        GpuInfo {
            uuid: self.uuid.clone(),
            name: self.model.clone(),
            memory_mib: self.memory_mib,
            compute_capability: (0, 0),
            minor: 0,
            pci_bus_id: self.pci_bus_id.clone(),
            numa_node: self.numa_node,
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        }
    }

    /// Whether the GPU satisfies `selector` (any GPU when `None`).
    pub fn matches(&self, selector: Option<&GpuSelector>) -> bool {
        selector.is_none_or(|s| s.matches(&self.info()))
    }
}

impl From<&GpuInfo> for FreeGpu {
    fn from(g: &GpuInfo) -> Self {
        FreeGpu {
            uuid: g.uuid.clone(),
            model: g.name.clone(),
            memory_mib: g.memory_mib,
            numa_node: g.numa_node,
            pci_bus_id: g.pci_bus_id.clone(),
            free_milli: MILLI as u32,
        }
    }
}

/// What one agent offers now.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentView {
    /// The agent.
    pub agent_id: AgentId,
    /// Its hostname.
    pub hostname: String,
    /// The offers this view was built from (accept them together).
    pub offer_ids: Vec<OfferId>,
    /// Everything offered (unreserved plus reservations).
    pub resources: Resources,
    /// The agent's attributes.
    pub attributes: Attributes,
    /// The GPUs the offered `gpus` can be drawn from, in PCI bus order.
    pub gpus: Vec<FreeGpu>,
}

impl AgentView {
    /// One view per agent from `offers` (several offers of one agent are merged, in the order
    /// agents first appear). Each GPU's free share comes from the offer's `gpu_free` (idle
    /// when it has none). `busy(agent, uuid)` says which GPUs are known to be in use (e.g. by
    /// the framework's own running tasks); they are left out of [`AgentView::gpus`] unless the
    /// offer shows them shared (a free share below a whole GPU: what the caller's fraction
    /// there leaves is still free), and so are GPUs with nothing free. When more idle GPUs
    /// remain than the offered whole `gpus`, the list is kept whole (which of them are free is
    /// unknown) and only the count limits placements.
    pub fn from_offers<'a>(
        offers: impl IntoIterator<Item = &'a Offer>,
        busy: &dyn Fn(AgentId, &str) -> bool,
    ) -> Vec<AgentView> {
        let mut views: Vec<AgentView> = Vec::new();
        let usable = |offer: &Offer, g: &GpuInfo| -> Option<FreeGpu> {
            if !g.healthy {
                return None;
            }
            let free = offer
                .gpu_free
                .iter()
                .find(|f| f.uuid == g.uuid)
                .map_or(MILLI as u32, |f| f.free_milli.min(MILLI as u32));
            let shared = free < MILLI as u32;
            if free == 0 || (!shared && busy(offer.agent_id, &g.uuid)) {
                return None;
            }
            let mut gpu = FreeGpu::from(g);
            gpu.free_milli = free;
            Some(gpu)
        };
        for offer in offers {
            let at = match views.iter().position(|v| v.agent_id == offer.agent_id) {
                Some(i) => i,
                None => {
                    views.push(AgentView {
                        agent_id: offer.agent_id,
                        hostname: offer.hostname.clone(),
                        offer_ids: Vec::new(),
                        resources: Resources::new(),
                        attributes: (*offer.attributes).clone(),
                        gpus: Vec::new(),
                    });
                    views.len() - 1
                }
            };
            let v = &mut views[at];
            v.offer_ids.push(offer.id);
            v.resources.add_assign(&offer.total());
            // Offers of one agent list the same GPUs; take the union all the same (the latest
            // offer's free share wins).
            for g in offer.gpus.iter().filter_map(|g| usable(offer, g)) {
                match v.gpus.iter_mut().find(|x| x.uuid == g.uuid) {
                    Some(x) if !offer.gpu_free.is_empty() => x.free_milli = g.free_milli,
                    Some(_) => {}
                    None => v.gpus.push(g),
                }
            }
            v.gpus
                .sort_by(|a, b| (a.numa_node, &a.pci_bus_id).cmp(&(b.numa_node, &b.pci_bus_id)));
        }
        views
    }

    /// Whole GPUs offered.
    pub fn gpu_count(&self) -> u64 {
        self.resources.milli("gpus") / MILLI
    }

    /// GPUs of the list that are idle (no fraction shares them).
    pub fn idle_gpus(&self) -> usize {
        self.gpus.iter().filter(|g| g.is_idle()).count()
    }
}

/// A constraint on the agent's attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// The attribute has this value.
    Equals(String, String),
    /// The attribute is absent or has another value.
    NotEquals(String, String),
    /// The attribute has one of these values.
    OneOf(String, Vec<String>),
}

impl Constraint {
    /// Whether `attributes` satisfy the constraint.
    pub fn allows(&self, attributes: &Attributes) -> bool {
        match self {
            Constraint::Equals(k, v) => attributes.get(k) == Some(v),
            Constraint::NotEquals(k, v) => attributes.get(k) != Some(v),
            Constraint::OneOf(k, vs) => attributes.get(k).is_some_and(|a| vs.contains(a)),
        }
    }
}

/// Where a multi-GPU task's GPUs may sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Locality {
    /// Within one NUMA node when possible, else spanning (fewest nodes first).
    #[default]
    Prefer,
    /// Within one NUMA node, or not at all.
    Require,
    /// Anywhere on the agent (still scored: fewer nodes spanned is better).
    Any,
}

/// What a task asks for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskRequest {
    /// Every resource kind it needs (`gpus` in whole GPUs).
    pub resources: Resources,
    /// Which GPUs are acceptable.
    pub gpu_selector: Option<GpuSelector>,
    /// Constraints on the agent's attributes (all must hold).
    pub constraints: Vec<Constraint>,
    /// Multi-GPU locality.
    pub locality: Locality,
}

impl TaskRequest {
    /// A request for `resources` with no selector, constraint or locality requirement.
    pub fn new(resources: Resources) -> Self {
        TaskRequest {
            resources,
            ..Default::default()
        }
    }

    /// Whole GPUs asked for (0 for a fraction of one GPU).
    pub fn gpus(&self) -> u64 {
        self.resources.milli("gpus") / MILLI
    }

    /// The milli-GPUs of a fraction of one GPU (1..=999), or `None` (whole GPUs or none).
    pub fn fraction(&self) -> Option<u32> {
        match self.resources.gpu_amount() {
            Ok(GpuAmount::Fraction(m)) => Some(m),
            _ => None,
        }
    }
}

/// Where one task goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Index of the task in the request list.
    pub task: usize,
    /// Index of the agent in the view list.
    pub agent: usize,
    /// The GPUs (UUIDs) it is expected to get.
    pub gpus: Vec<String>,
}

impl Assignment {
    /// `selector` (the task's own, if any) narrowed to exactly the GPUs this plan chose, so
    /// the agent gives the task those devices (the NUMA/NVLink locality the plan scored) rather
    /// than picking its own. The cost: when another framework takes one of them first (offers
    /// of different frameworks on one agent show the same idle GPUs), the master refuses the
    /// launch with an error instead of using another GPU. Without GPUs, `selector` unchanged.
    pub fn pinned_selector(&self, selector: Option<&GpuSelector>) -> Option<GpuSelector> {
        if self.gpus.is_empty() {
            return selector.cloned();
        }
        let mut s = selector.cloned().unwrap_or_default();
        s.uuids = self.gpus.clone();
        Some(s)
    }
}

/// Where every task of a set goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// One per task, in task order.
    pub assignments: Vec<Assignment>,
}

impl Plan {
    /// Task indices per agent index (ascending): one accept per agent.
    pub fn launches(&self) -> BTreeMap<usize, Vec<usize>> {
        let mut out: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for a in &self.assignments {
            out.entry(a.agent).or_default().push(a.task);
        }
        out
    }
}

/// Why a set of tasks does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    /// No agent can host this task (after the ones placed before it).
    #[error("task {0} fits on no agent")]
    NoFit(usize),
    /// A `gpus` amount above one that is not whole (`gpus:1.5`): a task gets a fraction of
    /// one GPU or whole GPUs.
    #[error("task {0}: gpus must be below 1 (a fraction of one GPU) or a whole number")]
    BadGpuAmount(usize),
}

/// The score of placing a task on an agent (see the module documentation); lower is better.
pub type Score = (u64, u64, u64, u64, usize);

/// A candidate: the GPUs it would take and its score.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Index of the agent.
    pub agent: usize,
    /// The GPUs (indices into the agent's [`AgentView::gpus`]).
    pub gpus: Vec<usize>,
    /// Its score.
    pub score: Score,
}

/// The GPUs `task` would take on `agent` (indices into `agent.gpus`), or `None`.
fn pick_gpus(agent: &AgentView, task: &TaskRequest) -> Option<Vec<usize>> {
    let k = task.gpus() as usize;
    if k == 0 {
        return Some(Vec::new());
    }
    if (agent.gpu_count() as usize) < k {
        return None;
    }
    let mut groups: BTreeMap<Option<u32>, Vec<usize>> = BTreeMap::new();
    for (i, g) in agent.gpus.iter().enumerate() {
        if g.is_idle() && g.matches(task.gpu_selector.as_ref()) {
            groups.entry(g.numa_node).or_default().push(i);
        }
    }
    // Best fit within one NUMA node: the group with the fewest GPUs that still has k.
    let single = groups
        .values()
        .filter(|m| m.len() >= k)
        .min_by_key(|m| m.len());
    if let Some(m) = single {
        return Some(m[..k].to_vec());
    }
    if task.locality == Locality::Require {
        return None;
    }
    let mut by_size: Vec<&Vec<usize>> = groups.values().collect();
    by_size.sort_by_key(|m| std::cmp::Reverse(m.len()));
    let mut out: Vec<usize> = by_size.into_iter().flatten().copied().take(k).collect();
    if out.len() < k {
        return None;
    }
    out.sort_unstable();
    Some(out)
}

fn numa_span(agent: &AgentView, gpus: &[usize]) -> u64 {
    let mut nodes: Vec<Option<u32>> = gpus.iter().map(|&i| agent.gpus[i].numa_node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes.len().saturating_sub(1) as u64
}

/// Scores `task` on `agent` (the `agent`-th view), or `None` when it does not fit. Whole GPUs
/// and no GPU only: a fraction of one GPU is scored across agents ([`place_one`]), so this
/// answers `None` for it.
pub fn evaluate(index: usize, agent: &AgentView, task: &TaskRequest) -> Option<Candidate> {
    if !task.resources.milli("gpus").is_multiple_of(MILLI) {
        return None;
    }
    if !task.constraints.iter().all(|c| c.allows(&agent.attributes)) {
        return None;
    }
    if !agent.resources.contains(&task.resources) {
        return None;
    }
    let gpus = pick_gpus(agent, task)?;
    let mut left = agent.resources.clone();
    left.checked_sub_assign(&task.resources)?;
    let gpus_left = left.milli("gpus") / MILLI;

    // 1. Stranded GPUs under the reference shape.
    let (cpu_per_gpu, mem_per_gpu) = match task.gpus() {
        0 => {
            let n = agent.gpu_count().max(1);
            (
                agent.resources.milli("cpus") / n,
                agent.resources.milli("mem") / n,
            )
        }
        n => (
            task.resources.milli("cpus") / n,
            task.resources.milli("mem") / n,
        ),
    };
    let hostable = |have: u64, per: u64| have.checked_div(per).unwrap_or(u64::MAX);
    let usable = gpus_left
        .min(hostable(left.milli("cpus"), cpu_per_gpu))
        .min(hostable(left.milli("mem"), mem_per_gpu));
    let stranded = gpus_left - usable;

    // 2. Locality of the task's own GPUs.
    let span = numa_span(agent, &gpus);

    // 3. NUMA nodes left partly free (only meaningful when the GPU list is exact).
    let broken = if agent.idle_gpus() as u64 == agent.gpu_count() {
        let mut per_node: BTreeMap<Option<u32>, (u64, u64)> = BTreeMap::new();
        for (i, g) in agent.gpus.iter().enumerate().filter(|(_, g)| g.is_idle()) {
            let e = per_node.entry(g.numa_node).or_default();
            e.0 += 1;
            if !gpus.contains(&i) {
                e.1 += 1;
            }
        }
        // A node is "broken" when it keeps some free GPUs but not all of them.
        per_node
            .values()
            .filter(|(all, free)| *free > 0 && free < all)
            .count() as u64
    } else {
        0
    };

    // 4. Best fit over every offered kind.
    const SCALE: u64 = 1_000_000;
    let fit: u64 = agent
        .resources
        .iter()
        .map(|(name, have)| {
            let after = left.milli(name);
            after.saturating_mul(SCALE).checked_div(have).unwrap_or(0)
        })
        .sum();
    Some(Candidate {
        agent: index,
        gpus,
        score: (stranded, span, broken, fit, index),
    })
}

/// The best agent for `task`, or `None` when it fits nowhere. A fraction of one GPU is placed
/// with the fragmentation-aware policy (module documentation); its candidate's score is
/// `(0, 0, 0, 0, agent)`.
pub fn place_one(agents: &[AgentView], task: &TaskRequest) -> Option<Candidate> {
    if let Some(milli) = task.fraction() {
        return place_fraction(agents, task, milli);
    }
    agents
        .iter()
        .enumerate()
        .filter_map(|(i, a)| evaluate(i, a, task))
        .min_by_key(|c| c.score)
}

/// Where a fraction of `milli` milli-GPUs goes: the agents that can host it become placement
/// nodes (their matching GPUs with a share free), scored by [`Policy::DEFAULT`] against the
/// task's shape and one whole GPU of the same CPU and memory.
fn place_fraction(agents: &[AgentView], task: &TaskRequest, milli: u32) -> Option<Candidate> {
    let mut models = Models::new();
    let model = models.intern("").ok()?;
    // (agent index, indices of its GPUs on the node) per node.
    let mut hosts: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();
    for (i, agent) in agents.iter().enumerate() {
        if !task.constraints.iter().all(|c| c.allows(&agent.attributes))
            || !agent.resources.contains(&task.resources)
        {
            continue;
        }
        let gpus: Vec<usize> = agent
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.free_milli >= milli && g.matches(task.gpu_selector.as_ref()))
            .map(|(k, _)| k)
            .collect();
        if gpus.is_empty() {
            continue;
        }
        let cpu = agent.resources.milli("cpus");
        let memory = agent.resources.milli("mem") / MILLI;
        nodes.push(Node {
            model,
            cpu_capacity: cpu,
            memory_capacity: memory,
            cpu_free: cpu,
            memory_free: memory,
            gpu_free: gpus.iter().map(|&k| agent.gpus[k].free_milli).collect(),
        });
        hosts.push((i, gpus));
    }
    if nodes.is_empty() {
        return None;
    }
    let shape = TaskShape {
        cpu_milli: task.resources.milli("cpus"),
        memory_mib: task.resources.milli("mem") / MILLI,
        gpu: GpuDemand::Fraction(milli),
        models: ModelSet::ANY,
    };
    let whole = TaskShape {
        gpu: GpuDemand::Whole(1),
        ..shape
    };
    let workload = Workload::new([(shape, 1), (whole, 1)]);
    let mut placer = Placer::new(nodes, Policy::DEFAULT, workload, 0).ok()?;
    let placement = placer.choose(&shape)?;
    let (agent, gpus) = hosts.get(placement.node)?;
    let gpu = *gpus.get(placement.gpus.first()?.gpu)?;
    Some(Candidate {
        agent: *agent,
        gpus: vec![gpu],
        score: (0, 0, 0, 0, *agent),
    })
}

/// Takes what `candidate` gives `task` out of `agents` (after [`place_one`]): whole GPUs leave
/// the agent's list; a fraction lowers its GPU's free share (the GPU leaves the list when
/// nothing is left of it).
pub fn take(agents: &mut [AgentView], task: &TaskRequest, candidate: &Candidate) -> Vec<String> {
    let Some(agent) = agents.get_mut(candidate.agent) else {
        return Vec::new();
    };
    let _ = agent.resources.checked_sub_assign(&task.resources);
    if let Some(milli) = task.fraction() {
        let Some(g) = candidate.gpus.first().and_then(|&i| agent.gpus.get_mut(i)) else {
            return Vec::new();
        };
        g.free_milli = g.free_milli.saturating_sub(milli);
        let uuid = g.uuid.clone();
        agent.gpus.retain(|g| g.free_milli > 0);
        return vec![uuid];
    }
    let mut taken = Vec::new();
    let mut keep = Vec::new();
    for (i, g) in std::mem::take(&mut agent.gpus).into_iter().enumerate() {
        if candidate.gpus.contains(&i) {
            taken.push(g.uuid);
        } else {
            keep.push(g);
        }
    }
    agent.gpus = keep;
    taken
}

/// Places every task or none: larger tasks first (by GPUs, then CPU, then memory; ties keep
/// request order; whole GPUs before fractions, which then pack around them), each on its best
/// agent given the ones placed before it. On success `agents` has everything the plan takes
/// removed; on failure it is unchanged.
pub fn place_all(agents: &mut Vec<AgentView>, tasks: &[TaskRequest]) -> Result<Plan, PlaceError> {
    for (i, t) in tasks.iter().enumerate() {
        if t.resources.gpu_amount().is_err() {
            return Err(PlaceError::BadGpuAmount(i));
        }
    }
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.sort_by_key(|&i| {
        let r = &tasks[i].resources;
        std::cmp::Reverse((r.milli("gpus"), r.milli("cpus"), r.milli("mem")))
    });
    let mut work = agents.clone();
    let mut assignments = Vec::with_capacity(tasks.len());
    for i in order {
        let c = place_one(&work, &tasks[i]).ok_or(PlaceError::NoFit(i))?;
        let gpus = take(&mut work, &tasks[i], &c);
        assignments.push(Assignment {
            task: i,
            agent: c.agent,
            gpus,
        });
    }
    assignments.sort_by_key(|a| a.task);
    *agents = work;
    Ok(Plan { assignments })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn gpu(i: usize, model: &str, numa: u32) -> FreeGpu {
        FreeGpu {
            uuid: format!("GPU-{i}"),
            model: model.into(),
            memory_mib: if model.contains("H100") { 81920 } else { 40960 },
            numa_node: Some(numa),
            pci_bus_id: format!("0000:{i:02x}:00.0"),
            free_milli: 1000,
        }
    }

    /// An agent with 4 A100s on NUMA 0 and 4 H100s on NUMA 1.
    pub(crate) fn agent(name: &str, res: &str) -> AgentView {
        AgentView {
            agent_id: AgentId::random(),
            hostname: name.into(),
            offer_ids: vec![OfferId::random()],
            resources: res.parse().unwrap(),
            attributes: Attributes::new(),
            gpus: (0..8)
                .map(|i| {
                    gpu(
                        i,
                        if i < 4 { "NVIDIA A100" } else { "NVIDIA H100" },
                        (i / 4) as u32,
                    )
                })
                .collect(),
        }
    }

    fn req(res: &str) -> TaskRequest {
        TaskRequest::new(res.parse().unwrap())
    }

    #[test]
    fn ports_are_placed_like_any_resource() {
        // Two agents, one port each: two 1-port tasks land on both, a third does not fit.
        let mut agents = vec![
            agent("a", "cpus:8;mem:1024;ports:1"),
            agent("b", "cpus:8;mem:1024;ports:1"),
        ];
        let t = req("cpus:1;mem:64;ports:1");
        let plan = place_all(&mut agents, &[t.clone(), t.clone()]).unwrap();
        let used: std::collections::BTreeSet<usize> =
            plan.assignments.iter().map(|a| a.agent).collect();
        assert_eq!(used.len(), 2, "one port per agent");
        assert!(place_one(&agents, &t).is_none());
    }

    #[test]
    fn multi_gpu_task_stays_in_one_numa_node() {
        let agents = vec![agent("a", "cpus:32;mem:65536;gpus:8")];
        let c = place_one(&agents, &req("cpus:4;mem:1024;gpus:4")).unwrap();
        assert_eq!(numa_span(&agents[0], &c.gpus), 0);
        let mut spanning = req("cpus:4;mem:1024;gpus:5");
        let c = place_one(&agents, &spanning).unwrap();
        assert_eq!(c.score.1, 1, "five GPUs span two NUMA nodes");
        spanning.locality = Locality::Require;
        assert!(place_one(&agents, &spanning).is_none());
    }

    #[test]
    fn selector_picks_the_model_and_memory() {
        let agents = vec![agent("a", "cpus:32;mem:65536;gpus:8")];
        let mut t = req("cpus:1;mem:64;gpus:2");
        t.gpu_selector = Some(GpuSelector {
            model: Some("h100".into()),
            min_memory_mib: None,
            mig_profile: None,
            uuids: Vec::new(),
        });
        let c = place_one(&agents, &t).unwrap();
        assert!(c
            .gpus
            .iter()
            .all(|&i| agents[0].gpus[i].model.contains("H100")));
        t.gpu_selector = Some(GpuSelector {
            model: None,
            min_memory_mib: Some(80_000),
            mig_profile: None,
            uuids: Vec::new(),
        });
        t.resources = "cpus:1;mem:64;gpus:5".parse().unwrap();
        assert!(
            place_one(&agents, &t).is_none(),
            "only four GPUs have 80 GB"
        );
    }

    #[test]
    fn a_plan_pins_its_gpus_and_placement_honours_pins() {
        let mut agents = vec![agent("a", "cpus:32;mem:65536;gpus:8")];
        let plan = place_all(&mut agents.clone(), &[req("cpus:1;mem:64;gpus:2")]).unwrap();
        let a = &plan.assignments[0];
        let sel = a.pinned_selector(None).unwrap();
        assert_eq!(sel.uuids, a.gpus);
        let model = GpuSelector {
            model: Some("A100".into()),
            ..GpuSelector::default()
        };
        assert_eq!(a.pinned_selector(Some(&model)).unwrap().model, model.model);
        // A request pinned to two H100s on NUMA node 1 gets exactly those.
        let want = [
            agents[0].gpus[5].uuid.clone(),
            agents[0].gpus[7].uuid.clone(),
        ];
        let mut t = req("cpus:1;mem:64;gpus:2");
        t.gpu_selector = Some(GpuSelector::pinned(want.clone()));
        let plan = place_all(&mut agents, &[t]).unwrap();
        let mut got = plan.assignments[0].gpus.clone();
        got.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn attributes_constrain_agents() {
        let mut a = agent("a", "cpus:8;mem:4096;gpus:8");
        a.attributes.insert("rack".into(), "r1".into());
        let b = agent("b", "cpus:8;mem:4096;gpus:8");
        let agents = vec![a, b];
        let mut t = req("cpus:1;mem:64;gpus:1");
        t.constraints = vec![Constraint::Equals("rack".into(), "r1".into())];
        assert_eq!(place_one(&agents, &t).unwrap().agent, 0);
        t.constraints = vec![Constraint::NotEquals("rack".into(), "r1".into())];
        assert_eq!(place_one(&agents, &t).unwrap().agent, 1);
        t.constraints = vec![Constraint::OneOf("rack".into(), vec!["r9".into()])];
        assert!(place_one(&agents, &t).is_none());
    }

    #[test]
    fn least_stranding_agent_wins() {
        // Agent a has little CPU: a 1-GPU task there would leave GPUs no 1-GPU task can use.
        let agents = vec![
            agent("a", "cpus:2;mem:65536;gpus:8"),
            agent("b", "cpus:16;mem:65536;gpus:8"),
        ];
        let c = place_one(&agents, &req("cpus:2;mem:1024;gpus:1")).unwrap();
        assert_eq!(c.agent, 1);
        // A CPU-only task avoids taking the CPU GPUs need.
        let agents = vec![
            agent("gpu", "cpus:8;mem:65536;gpus:8"),
            agent("cpu", "cpus:8;mem:65536"),
        ];
        let c = place_one(&agents, &req("cpus:4;mem:1024")).unwrap();
        assert_eq!(c.agent, 1);
    }

    #[test]
    fn best_fit_prefers_the_fuller_agent_and_keeps_numa_nodes_whole() {
        let mut busy = agent("busy", "cpus:16;mem:65536;gpus:4");
        busy.gpus.truncate(4); // the A100s on NUMA 0 are free, the H100s busy
        let idle = agent("idle", "cpus:32;mem:131072;gpus:8");
        let agents = vec![idle, busy];
        let c = place_one(&agents, &req("cpus:2;mem:1024;gpus:2")).unwrap();
        assert_eq!(c.agent, 1, "fill the partly used agent first");
        let c = place_one(&agents, &req("cpus:2;mem:1024;gpus:4")).unwrap();
        assert_eq!(c.score.2, 0, "four GPUs fill one NUMA node on either agent");
    }

    #[test]
    fn place_all_is_all_or_nothing() {
        let mut agents = vec![
            agent("a", "cpus:16;mem:65536;gpus:8"),
            agent("b", "cpus:16;mem:65536;gpus:8"),
        ];
        let before = agents.clone();
        let three = vec![req("cpus:1;mem:64;gpus:8"); 3];
        assert_eq!(place_all(&mut agents, &three), Err(PlaceError::NoFit(2)));
        assert_eq!(agents, before, "a failed plan takes nothing");
        let plan = place_all(&mut agents, &three[..2]).unwrap();
        assert_eq!(plan.launches().len(), 2);
        assert_eq!(agents[0].gpu_count() + agents[1].gpu_count(), 0);
        let mut f = vec![agent("a", "cpus:1;mem:64;gpus:2")];
        assert_eq!(
            place_all(&mut f, &[req("gpus:1.5")]),
            Err(PlaceError::BadGpuAmount(0))
        );
    }

    #[test]
    fn from_offers_merges_an_agents_offers_and_drops_busy_gpus() {
        let agent_id = AgentId::random();
        let gpus: Vec<GpuInfo> = (0..4).map(|i| gpu(i, "A100", 0).info()).collect();
        let offer = |res: &str| Offer {
            id: OfferId::random(),
            framework_id: gantry_proto::FrameworkId::random(),
            agent_id,
            hostname: "h".into(),
            role: "r".into(),
            resources: res.parse().unwrap(),
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: gpus.clone().into(),
            gpu_free: Vec::new(),
            agent_name: "a".into(),
        };
        let offers = [offer("cpus:2;gpus:1"), offer("cpus:1;gpus:2")];
        let views = AgentView::from_offers(&offers, &|_, u: &str| u == "GPU-0");
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].offer_ids.len(), 2);
        assert_eq!(views[0].resources.milli("cpus"), 3000);
        assert_eq!(views[0].gpus.len(), 3);
        // Grouped per agent and role: the two offers in role r, one more in role s.
        let mut other_role = offer("cpus:4");
        other_role.role = "s".into();
        let all = [offers[0].clone(), other_role.clone(), offers[1].clone()];
        let groups = group_offers(&all);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].offer_ids, vec![offers[0].id, offers[1].id]);
        assert_eq!(groups[0].resources.milli("cpus"), 3000);
        assert_eq!(
            (groups[1].role.as_str(), groups[1].offer_ids.len()),
            ("s", 1)
        );
    }

    /// Half-GPU tasks pack onto a GPU already shared, and two of them share one GPU, rather
    /// than breaking idle GPUs a whole-GPU task could use.
    #[test]
    fn fractions_pack_onto_shared_gpus_and_keep_idle_ones_whole() {
        let idle = agent("idle", "cpus:16;mem:65536;gpus:8");
        let mut shared = agent("shared", "cpus:16;mem:65536;gpus:7.5");
        shared.gpus[3].free_milli = 500;
        let agents = vec![idle, shared];
        let half = req("cpus:1;mem:64;gpus:0.5");
        let c = place_one(&agents, &half).expect("fits");
        assert_eq!((c.agent, c.gpus.clone()), (1, vec![3]), "the shared GPU");
        // Two halves on an idle agent share one GPU; a whole GPU goes elsewhere.
        let mut work = vec![agent("a", "cpus:16;mem:65536;gpus:2")];
        work[0].gpus.truncate(2);
        let plan = place_all(
            &mut work,
            &[half.clone(), req("cpus:1;mem:64;gpus:1"), half],
        )
        .expect("fits");
        let (h0, w, h1) = (
            &plan.assignments[0].gpus,
            &plan.assignments[1].gpus,
            &plan.assignments[2].gpus,
        );
        assert_eq!(h0, h1, "the halves share a GPU");
        assert_ne!(h0, w);
        assert_eq!(work[0].resources.milli("gpus"), 0);
        assert!(work[0].gpus.is_empty(), "both GPUs used up");
    }

    #[test]
    fn whole_gpus_skip_shared_ones_and_fractions_honour_the_selector() {
        let mut a = agent("a", "cpus:16;mem:65536;gpus:7.25");
        a.gpus[0].free_milli = 250;
        let agents = vec![a];
        // Seven idle GPUs: 7 whole fit, 8 do not; the shared GPU is never given whole.
        let c = place_one(&agents, &req("cpus:1;mem:64;gpus:7")).expect("fits");
        assert!(!c.gpus.contains(&0));
        assert!(place_one(&agents, &req("cpus:1;mem:64;gpus:8")).is_none());
        // A quarter fits the shared GPU; a half does not fit there.
        let c = place_one(&agents, &req("cpus:1;mem:64;gpus:0.25")).expect("fits");
        assert_eq!(c.gpus, vec![0]);
        let c = place_one(&agents, &req("cpus:1;mem:64;gpus:0.5")).expect("fits");
        assert_ne!(c.gpus, vec![0]);
        // A fraction on an H100 only, of at least 80 GB.
        let mut t = req("cpus:1;mem:64;gpus:0.5");
        t.gpu_selector = Some(GpuSelector {
            model: Some("h100".into()),
            min_memory_mib: Some(80_000),
            ..GpuSelector::default()
        });
        let c = place_one(&agents, &t).expect("fits");
        assert!(agents[0].gpus[c.gpus[0]].model.contains("H100"));
        t.gpu_selector = Some(GpuSelector {
            min_memory_mib: Some(100_000),
            ..GpuSelector::default()
        });
        assert!(place_one(&agents, &t).is_none());
        // Constraints and CPU hold for fractions too.
        let mut t = req("cpus:32;mem:64;gpus:0.5");
        assert!(place_one(&agents, &t).is_none());
        t = req("cpus:1;mem:64;gpus:0.5");
        t.constraints = vec![Constraint::Equals("rack".into(), "r1".into())];
        assert!(place_one(&agents, &t).is_none());
    }

    #[test]
    fn views_read_each_gpus_free_share_from_the_offer() {
        let agent_id = AgentId::random();
        let gpus: Vec<GpuInfo> = (0..3).map(|i| gpu(i, "A100", 0).info()).collect();
        let free = [1000u32, 500, 0];
        let offer = Offer {
            id: OfferId::random(),
            framework_id: gantry_proto::FrameworkId::random(),
            agent_id,
            hostname: "h".into(),
            role: "r".into(),
            resources: "cpus:4;gpus:1.5".parse().unwrap(),
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: gpus.clone().into(),
            gpu_free: gpus
                .iter()
                .zip(free)
                .map(|(g, f)| gantry_proto::GpuFree {
                    uuid: g.uuid.clone(),
                    free_milli: f,
                    free_memory_mib: 0,
                })
                .collect(),
            agent_name: "a".into(),
        };
        // GPU-1 holds our own half-GPU task: still listed with its free half; GPU-2 is full.
        let views = AgentView::from_offers([&offer], &|_, u: &str| u == "GPU-1" || u == "GPU-0");
        let got: Vec<(&str, u32)> = views[0]
            .gpus
            .iter()
            .map(|g| (g.uuid.as_str(), g.free_milli))
            .collect();
        assert_eq!(
            got,
            vec![("GPU-1", 500)],
            "busy idle GPU-0 and full GPU-2 dropped"
        );
        let views = AgentView::from_offers([&offer], &|_, _| false);
        assert_eq!(views[0].gpus.len(), 2);
        assert_eq!(views[0].idle_gpus(), 1);
    }

    fn arb_agents() -> impl Strategy<Value = Vec<AgentView>> {
        prop::collection::vec((1u64..32, 0u64..=8), 1..5).prop_map(|specs| {
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (cpus, gpus))| {
                    let mut a = agent(
                        &format!("a{i}"),
                        &format!("cpus:{cpus};mem:65536;gpus:{gpus}"),
                    );
                    a.gpus.truncate(gpus as usize);
                    a
                })
                .collect()
        })
    }

    proptest! {
        /// A plan never gives out more than is offered, never a whole GPU twice nor a shared
        /// one whole, never more of a GPU than it has free, and respects selectors; a failed
        /// plan leaves the agents untouched.
        #[test]
        fn plans_fit_what_is_offered(
            agents in arb_agents(),
            shared in prop::collection::vec(0u32..1000, 0..4),
            tasks in prop::collection::vec((0u64..6, 0u64..=8, any::<bool>(), 0u32..4), 1..8),
        ) {
            // Some GPUs shared already (their free share below 1000), the offer's amount too.
            let mut agents = agents;
            for (k, &free) in shared.iter().enumerate() {
                let a = k % agents.len();
                let g = k / agents.len();
                if let Some(gpu) = agents[a].gpus.get_mut(g) {
                    if gpu.is_idle() && free > 0 {
                        gpu.free_milli = free;
                        let have = agents[a].resources.milli("gpus");
                        agents[a].resources.set_milli("gpus", have - 1000 + u64::from(free));
                    }
                }
            }
            let tasks: Vec<TaskRequest> = tasks.into_iter().map(|(c, g, h100, quarter)| {
                let gpus = if quarter > 0 { format!("0.{}", quarter * 25) } else { g.to_string() };
                let mut t = req(&format!("cpus:{c};mem:128;gpus:{gpus}"));
                if h100 {
                    t.gpu_selector = Some(GpuSelector { model: Some("H100".into()), min_memory_mib: None, mig_profile: None, uuids: Vec::new() });
                }
                t
            }).collect();
            let mut work = agents.clone();
            match place_all(&mut work, &tasks) {
                Ok(plan) => {
                    prop_assert_eq!(plan.assignments.len(), tasks.len());
                    for (ai, a) in agents.iter().enumerate() {
                        let mut used = Resources::new();
                        let mut whole = Vec::new();
                        let mut shares: BTreeMap<String, u32> = BTreeMap::new();
                        for x in plan.assignments.iter().filter(|x| x.agent == ai) {
                            let t = &tasks[x.task];
                            used.add_assign(&t.resources);
                            match t.fraction() {
                                Some(m) => {
                                    prop_assert_eq!(x.gpus.len(), 1);
                                    *shares.entry(x.gpus[0].clone()).or_default() += m;
                                }
                                None => {
                                    prop_assert_eq!(x.gpus.len() as u64, t.gpus());
                                    whole.extend(x.gpus.iter().cloned());
                                }
                            }
                            for u in &x.gpus {
                                let g = a.gpus.iter().find(|g| &g.uuid == u).unwrap();
                                prop_assert!(g.matches(t.gpu_selector.as_ref()));
                            }
                        }
                        prop_assert!(a.resources.contains(&used));
                        for u in &whole {
                            let g = a.gpus.iter().find(|g| &g.uuid == u).unwrap();
                            prop_assert!(g.is_idle(), "a shared GPU given whole");
                            prop_assert!(!shares.contains_key(u), "a whole GPU also shared");
                        }
                        let n = whole.len();
                        whole.sort();
                        whole.dedup();
                        prop_assert_eq!(whole.len(), n);
                        for (u, m) in &shares {
                            let g = a.gpus.iter().find(|g| &g.uuid == u).unwrap();
                            prop_assert!(*m <= g.free_milli, "{} takes {} of {}", u, m, g.free_milli);
                        }
                    }
                }
                Err(_) => prop_assert_eq!(work, agents),
            }
        }
    }
}
