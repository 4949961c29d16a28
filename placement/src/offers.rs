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
pub(crate) mod tests;
