//! The allocator: hierarchical weighted Dominant Resource Fairness with quotas, reservations,
//! offer filters, GPU awareness and demand-aware (progressive-filling) offers.
//!
//! This module is PURE: no I/O, no clock, no randomness. Time is always an input ([`Millis`]);
//! the live master, the simulator and the benchmark all drive the same code. Semantics are
//! documented in `docs/allocator.md`.
//!
//! Internally every entity has a dense index (agents, frameworks, roles), resource names are
//! interned into dense vectors of milli-units, and the fairness order is kept in incremental
//! sorted sets (one per role node for its children and its `r/.` leaf, one per role for its
//! frameworks) keyed by exact rational shares, so an allocation cycle costs roughly one ordered
//! scan per agent whose situation changed. Agents whose last visit found no possible offer, and
//! where nothing relevant changed since, are skipped ("stable" agents, invalidated by an
//! agent-local change or a global epoch bump).
//!
//! Modules (one per concern; each adds an `impl Allocator` block over the one state defined
//! here, with the public types):
//! - `sort`: the role tree and sort keys: interned resources, exact DRF shares, the sorted sets of
//!   role children and frameworks, charging allocations up the tree.
//! - `quota`: guarantees (nested), limits, the headroom owed to guarantees, `set_quota`.
//! - `membership`: agents, frameworks (roles, demand, suppress/revive) and roles (weights,
//!   forgetting unused ones).
//! - `cycle`: the allocation cycle (stage 1: quota guarantees, stage 2: fair shares) and grants.
//! - `offers`: accept, decline and decline filters, rescind, recover, reservations, restored
//!   allocations, offer and filter expiry.
//! - `book`: the offer book (outstanding offers in a slab; ids carry their slot) and records.
//! - `views`: read-only views and the operator metrics.
//! - `accounting`: allocations integrated over time (resource-seconds per role and framework).
//! - `dense`: milli-unit vectors, `Bundle`s of unreserved and reserved pools, exact `Share`s.
//! - `filters`: decline filters per agent, refusing bundles (pools kept apart).
//! - `gpus`: GPU shares in demand-aware splitting (a fraction's task's worth needs one GPU with
//!   room, chosen with the fragmentation-aware scoring; whole GPUs idle ones; earmarked while
//!   offered).
//! - `models`: GPU models in declared demand (a shape naming a model is offered only on its
//!   agents, first there, and may reclaim idle offers other frameworks hold on them).
//! - `tests`: unit tests; the conformance rules of issue 11 are pinned by the scenarios in
//!   `master/tests/conformance/` (see `docs/allocator.md`).

mod accounting;
mod book;
mod cycle;
mod dense;
mod filters;
mod gpus;
mod membership;
mod models;
mod offers;
mod quota;
mod slab;
mod sort;
mod views;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use gantry_proto::messages::Demand;
use gantry_proto::{AgentId, FrameworkId, OfferId, ResourceLimits, Resources};
use serde::Serialize;

pub use accounting::ResourceSeconds;
use book::{OfferBook, OfferState};
use dense::{Bundle, Names, Rv, Share};
use filters::{AgentFilters, Filter, RefusedPool};
pub use models::MAX_MODELS;
use slab::Slab;

/// Milliseconds of (real or simulated) time. Always an input, never read from a clock.
pub type Millis = u64;

/// The name frameworks use when they give an empty role.
pub const DEFAULT_ROLE: &str = "*";

/// Resource kinds never counted in dominant shares, whatever `fairness_excluded_resources`
/// says: `ports` (an agent's port range, advertised as its size). A port is a name on a host,
/// not capacity: a framework holding the one port of a small range would otherwise have a
/// dominant share of 100% while using a sliver of the cluster. Mesos leaves its `ports`
/// ranges out of DRF the same way (only scalars count). Ports are still offered, accepted,
/// accounted and subject to quota like any scalar.
pub const NEVER_IN_SHARES: &[&str] = &["ports"];

/// Allocator settings.
#[derive(Clone, Debug)]
pub struct AllocatorConfig {
    /// Agents with `gpus` are offered only to frameworks with the GPU capability.
    pub filter_gpu_resources: bool,
    /// Resource names ignored when computing dominant shares (e.g. `gpus`).
    pub fairness_excluded_resources: Vec<String>,
    /// Filter duration for declines and unused parts of accepts when none is given.
    pub default_refuse_ms: Millis,
    /// Outstanding offers older than this are rescinded by [`Allocator::expire_offers`].
    pub offer_timeout_ms: Option<Millis>,
    /// An offer rescinded by the offer timeout counts as a decline of its framework on its
    /// agent: filtered for `default_refuse_ms`, so it does not go straight back to a framework
    /// that hoards offers. Off by default (the simulator's scenarios re-offer at once); the
    /// master binary turns it on (`--offer-timeout`, docs/allocator.md).
    pub filter_expired_offers: bool,
    /// High 64 bits of generated offer ids (the master passes a random value, the simulator 0).
    pub offer_id_seed: u64,
    /// How demand-aware splitting picks the GPU for a fraction of one GPU (`--gpu-placement`).
    pub gpu_placement: gantry_placement::Policy,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self {
            filter_gpu_resources: true,
            fairness_excluded_resources: Vec::new(),
            default_refuse_ms: 5000,
            offer_timeout_ms: None,
            filter_expired_offers: false,
            offer_id_seed: 0,
            gpu_placement: gantry_placement::Policy::FgdPack,
        }
    }
}

/// Resources of an offer (or an allocation): unreserved plus reserved per role.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct OfferResources {
    /// Unreserved resources.
    pub unreserved: Resources,
    /// Reserved resources, per reservation role.
    pub reserved: BTreeMap<String, Resources>,
}

impl OfferResources {
    /// Unreserved plus every reservation.
    pub fn total(&self) -> Resources {
        let mut t = self.unreserved.clone();
        for r in self.reserved.values() {
            t.add_assign(r);
        }
        t
    }

    /// Only unreserved resources.
    pub fn unreserved(resources: Resources) -> Self {
        Self {
            unreserved: resources,
            reserved: BTreeMap::new(),
        }
    }

    /// True when some GPUs are offered (unreserved or reserved).
    pub fn has_gpus(&self) -> bool {
        std::iter::once(&self.unreserved)
            .chain(self.reserved.values())
            .any(|r| r.milli("gpus") > 0)
    }

    /// True when nothing at all.
    pub fn is_empty(&self) -> bool {
        self.unreserved.is_empty() && self.reserved.values().all(Resources::is_empty)
    }

    /// Adds `other`, part by part.
    pub fn add_assign(&mut self, other: &OfferResources) {
        self.unreserved.add_assign(&other.unreserved);
        for (role, r) in &other.reserved {
            self.reserved.entry(role.clone()).or_default().add_assign(r);
        }
    }

    /// Carves up to `want` out of these resources, reservations first (in role order), then
    /// unreserved: what is taken leaves `self` and `want` and is returned. The one way
    /// resources are cut out of offers: the master's accepts and the simulator's launches and
    /// recoveries.
    pub fn carve(&mut self, want: &mut Resources) -> OfferResources {
        let mut taken = OfferResources::default();
        self.reserved.retain(|role, avail| {
            let take = avail.elementwise_min(want);
            if take.is_empty() {
                return true;
            }
            avail.checked_sub_assign(&take);
            *want = want.saturating_sub(&take);
            taken.reserved.insert(role.clone(), take);
            !avail.is_empty()
        });
        let take = self.unreserved.elementwise_min(want);
        if !take.is_empty() {
            self.unreserved.checked_sub_assign(&take);
            *want = want.saturating_sub(&take);
            taken.unreserved = take;
        }
        taken
    }
}

/// One offer the allocator made.
#[derive(Clone, Debug)]
pub struct OfferRecord {
    /// Unique, sorts by age; the high 64 bits are the configured seed.
    pub id: OfferId,
    /// Who the offer is for.
    pub framework: FrameworkId,
    /// Where the resources are.
    pub agent: AgentId,
    /// The role the offer is made to.
    pub role: String,
    /// What is offered (unreserved, and reserved per role).
    pub resources: OfferResources,
    /// When the offer was made.
    pub created_at: Millis,
}

/// Why an allocator call was refused.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("unknown offer {0} (never made, already used, rescinded or expired)")]
    UnknownOffer(OfferId),
    #[error("unknown agent {0}")]
    UnknownAgent(AgentId),
    #[error("unknown framework {0}")]
    UnknownFramework(FrameworkId),
    #[error("offer {offer}: requested {requested:?} does not fit in the offered {offered:?}")]
    ExceedsOffer {
        offer: OfferId,
        requested: OfferResources,
        offered: OfferResources,
    },
    #[error("agent {agent}: {requested:?} does not fit in its free {free:?}")]
    ExceedsAgent {
        agent: AgentId,
        requested: OfferResources,
        free: OfferResources,
    },
    #[error("role {role:?} can not reserve in offer {offer}: the role must be the offer's role or one of its ancestors")]
    ReservationRole { offer: OfferId, role: String },
    #[error("invalid quota: {0}")]
    InvalidQuota(String),
    #[error(
        "the offers of one {0} must belong to one framework (and, for an accept, to one agent)"
    )]
    MixedOffers(&'static str),
}

/// Counters and shares for the operator view. The caller measures cycle time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AllocatorMetrics {
    /// Per role: dominant share (divided by weight), weight, allocated (offered + in use).
    pub roles: BTreeMap<String, RoleMetrics>,
    /// Per framework id: name, dominant share, allocated.
    pub frameworks: BTreeMap<String, FrameworkMetrics>,
    /// (framework, agent) pairs with at least one active decline filter.
    pub active_filters: usize,
    /// Offers made and not yet accepted, declined or rescinded.
    pub offers_outstanding: usize,
    /// Offers made since start.
    pub offers_made: u64,
    /// Offers accepted since start.
    pub offers_accepted: u64,
    /// Offers declined since start.
    pub offers_declined: u64,
    /// Offers rescinded since start (including expired ones and those of removed agents).
    pub offers_rescinded: u64,
    /// Offers rescinded by the offer timeout since start.
    pub offers_expired: u64,
    /// Allocation cycles run since start.
    pub allocation_cycles: u64,
    /// Agents whose frameworks were walked in those cycles (agents with nothing free, nothing
    /// that any framework wanting more needs, or nothing changed since they offered nothing
    /// are passed over, and a cycle ends once no framework wants more).
    pub agent_visits: u64,
}

/// Metrics of one role.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoleMetrics {
    /// Dominant share of the role's subtree, divided by its weight.
    pub dominant_share: f64,
    /// The role's weight.
    pub weight: f64,
    /// Offered plus in use, whole subtree.
    pub allocated: Resources,
    /// Offers made to the role's subtree since start.
    pub offers_made: u64,
    /// Quota guarantee, if any.
    pub quota_guarantee: Option<Resources>,
    /// Quota limit, if any (kinds not listed are unlimited; a listed zero is a limit of zero).
    pub quota_limit: Option<ResourceLimits>,
}

/// Metrics of one framework.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FrameworkMetrics {
    /// The framework's name.
    pub name: String,
    /// Dominant share of the cluster (not weighted).
    pub dominant_share: f64,
    /// Offered plus in use.
    pub allocated: Resources,
    /// Offers made to it since start.
    pub offers_made: u64,
    /// Its remaining declared demand (`set_demand`: every shape with its remaining count;
    /// empty: none): the operator API's `/api/v1/demand` (and the autoscaler) read it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub demands: Vec<Demand>,
}

// ---------------------------------------------------------------------------------------------
// Internal state

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SortKey {
    /// Exact dominant share (divided by the weight for role entries).
    share: Share,
    offers: u64,
    /// The name's first 16 bytes, big-endian: most name comparisons end here.
    prefix: u128,
    name: Arc<str>,
    /// Framework index (framework sorters) or role node index (role sorters; the parent's own
    /// index stands for its "self" leaf `r/.`, i.e. the frameworks subscribed directly to it).
    idx: u32,
}

#[derive(Debug)]
struct Agent {
    id: AgentId,
    name: String,
    gpu: bool,
    total: Bundle,
    free: Bundle,
    /// Accepted resources in use, per (framework, role).
    inuse: Vec<(u32, u32, Bundle)>,
    offers: Vec<OfferId>,
    /// Decline filters per framework index.
    filters: AgentFilters,
    /// The epoch at which a full visit found nothing to offer (unchanged since).
    stable: Option<u64>,
    /// Free milli-GPUs per GPU net of running tasks (`set_agent_gpus`; empty: no per-GPU view).
    gpu_free: Vec<u32>,
    /// Milli-GPUs per GPU earmarked by outstanding demand-split offers.
    gpu_offered: Vec<u32>,
    /// NUMA node and PCI root of each GPU of the per-GPU view (`set_agent_gpu_topology`).
    gpu_topology: Vec<(Option<u32>, Option<String>)>,
    /// Its GPUs' models (`models`; none for agents without GPUs or not told).
    models: models::ModelMask,
    /// Never offered (its allocations stay): deactivated by an operator, or draining for
    /// maintenance (the master decides; see `state::maintenance`).
    inactive: bool,
}

#[derive(Debug)]
struct FwRole {
    role: u32,
    alloc: Rv,
    offers: u64,
    /// Suppressed by the framework (or while it is disconnected).
    suppressed: bool,
    /// Paused by the master: the framework is not reading what it was sent
    /// ([`Allocator::set_paused`]).
    paused: bool,
    key: SortKey,
}

impl FwRole {
    /// Out of its role's fair order: never chosen for an offer.
    fn out_of_order(&self) -> bool {
        self.suppressed || self.paused
    }
}

/// Tasks' worth per declared demand shape (in the order of the framework's shapes; empty
/// when the framework declared none or the offer holds none).
pub(super) type ShapeCounts = smallvec::SmallVec<[u64; 2]>;

/// Subtracts `tasks` (per shape) from `from`.
pub(super) fn release_tasks(from: &mut ShapeCounts, tasks: &[u64]) {
    for (o, t) in from.iter_mut().zip(tasks) {
        *o = o.saturating_sub(*t);
    }
}

impl Framework {
    /// May still be granted something: in some role's fair order, and without a declared
    /// demand or with tasks of it not yet in outstanding offers.
    fn wants(&self) -> bool {
        self.roles.iter().any(|r| !r.out_of_order())
            && (self.demand.is_empty()
                || self
                    .demand
                    .iter()
                    .zip(&self.offered_tasks)
                    .any(|((_, count), offered)| offered < count))
    }
}

#[derive(Debug)]
struct Framework {
    id: FrameworkId,
    name: Arc<str>,
    gpu_capable: bool,
    /// The declared task shapes with their remaining counts (empty: no demand).
    demand: Vec<(Rv, u64)>,
    /// The GPU model of each declared shape (`Demand::gpu_model`) ...
    demand_models: Vec<Option<String>>,
    /// ... and the interned models it accepts (`models::ANY_MODEL` when it names none).
    demand_masks: Vec<models::ModelMask>,
    /// Tasks' worth of each shape currently sitting in outstanding offers.
    offered_tasks: ShapeCounts,
    roles: Vec<FwRole>,
    alloc: Bundle,
    offers_made: u64,
    /// Its outstanding offers (the per-framework index of the offer book: disconnects and
    /// removals visit these, not every offer).
    offer_ids: HashSet<OfferId>,
    inuse_agents: HashSet<u32>,
    /// Number of agents where this framework has filters.
    filtered_agents: usize,
    /// Quantities of which an offer must hold one ([`Allocator::set_min_allocatable`]), as
    /// given ...
    min_allocatable: Vec<Resources>,
    /// ... and as vectors over the resource names known when they were last converted
    /// (`Allocator::min_names`); a quantity naming a resource no agent has is left out.
    min_rv: Vec<Rv>,
}

#[derive(Debug)]
struct Role {
    name: Arc<str>,
    /// `name/.`: the virtual leaf of the frameworks subscribed directly (Mesos's `r/.`).
    self_name: Arc<str>,
    parent: Option<u32>,
    weight: f64,
    guarantee: Option<Rv>,
    /// `u64::MAX` (or absent) = unlimited kind.
    limit: Option<Rv>,
    /// Subtree allocation (offered + in use), all pools.
    alloc: Rv,
    /// Allocation of frameworks subscribed directly to this role.
    own_alloc: Rv,
    /// Subtree allocation of unreserved resources.
    alloc_unres: Rv,
    /// Subtree reservations (allocated or not).
    reserved: Rv,
    offers: u64,
    own_offers: u64,
    /// Frameworks subscribed directly, in fair order.
    frameworks: BTreeSet<SortKey>,
    /// Children and (if it has frameworks) the self leaf, in fair order.
    sorted: BTreeSet<SortKey>,
    key: Option<SortKey>,
    self_key: Option<SortKey>,
    /// Frameworks subscribed in the subtree.
    fw_count: usize,
}

impl Role {
    /// A role with weight 1, no quota and nothing allocated.
    fn new(name: &str, parent: Option<u32>) -> Self {
        Role {
            name: Arc::from(name),
            self_name: Arc::from(format!("{name}/.")),
            parent,
            weight: 1.0,
            guarantee: None,
            limit: None,
            alloc: Rv::new(),
            own_alloc: Rv::new(),
            alloc_unres: Rv::new(),
            reserved: Rv::new(),
            offers: 0,
            own_offers: 0,
            frameworks: BTreeSet::new(),
            sorted: BTreeSet::new(),
            key: None,
            self_key: None,
            fw_count: 0,
        }
    }
}

struct Pending {
    fw: u32,
    role: u32,
    bundle: Bundle,
    tasks: ShapeCounts,
    /// GPU shares earmarked for its tasks' worth (`gpus`).
    gpus: Vec<(u32, u32)>,
}

struct Candidate {
    fw: u32,
    role: u32,
    grant: Bundle,
    /// The demand shape the grant is a task's worth of (`None`: no demand).
    shape: Option<usize>,
    /// GPU shares earmarked for the task's worth (`gpus`).
    gpus: Vec<(u32, u32)>,
}

#[derive(Default)]
struct Counters {
    made: u64,
    accepted: u64,
    declined: u64,
    rescinded: u64,
    expired: u64,
    cycles: u64,
    visits: u64,
}

/// The hierarchical DRF allocator and its offer book. See the module docs.
pub struct Allocator {
    config: AllocatorConfig,
    names: Names,
    /// How many resource names there were when the frameworks' minimum allocatable quantities
    /// were last converted (`min_rv`): more names, and they are converted again.
    min_names: usize,
    excluded: Vec<bool>,
    /// The cluster total with excluded kinds zeroed: the denominators of shares (refreshed with
    /// the sort keys).
    share_total: Rv,
    total: Rv,
    /// Sum of all agents' free unreserved resources (what quota headroom can draw on).
    free_unres: Rv,
    /// Headroom still owed to quota guarantees, per kind.
    required: Rv,
    /// Kinds named in some guarantee.
    guarded: Vec<bool>,
    /// Per role: below its quota guarantee (maintained during a cycle).
    below: Vec<bool>,
    /// Roles with frameworks that are below their guarantee.
    n_below: usize,
    any_guarantee: bool,
    agents: Slab<Agent>,
    agent_ids: HashMap<AgentId, u32>,
    agent_order: Vec<u32>,
    frameworks: Slab<Framework>,
    /// [`FW_GPU`] / [`FW_DEMAND`] per framework slot (hot path of the scan).
    fw_flags: Vec<u8>,
    fw_ids: HashMap<FrameworkId, u32>,
    roles: Vec<Role>,
    role_ids: HashMap<String, u32>,
    /// Slots of forgotten roles ([`Allocator::forget_role`]), reused by new roles.
    free_role_slots: Vec<u32>,
    offers: OfferBook,
    filter_heap: BinaryHeap<Reverse<(Millis, u32, u32)>>,
    refused: RefusedPool,
    epoch: u64,
    keys_stale: bool,
    counters: Counters,
    /// Size hint for the next cycle's output.
    last_cycle_offers: usize,
    /// Frameworks that may still be granted something in the running cycle
    /// ([`Framework::wants`]): at 0 the cycle ends early.
    wanting: usize,
    /// What an agent must hold to be worth visiting in the running cycle
    /// (`Allocator::cycle_needs`).
    needs: Option<Vec<Rv>>,
    /// Reused per-visit buffer of offers being assembled on one agent.
    pending_buf: Vec<Pending>,
    /// The GPU models agents reported, interned (lower case; `models`).
    gpu_models: Vec<Arc<str>>,
    /// The running cycle's frameworks with an unmet model-constrained shape, least share
    /// first, served first on agents of those models ...
    model_first: Vec<u32>,
    /// ... and the models they want.
    model_wanted: models::ModelMask,
    /// Last unreserved vector converted to named resources.
    res_cache: Option<(Rv, Resources)>,
    /// Allocations integrated over time (resource-seconds), see `accounting`.
    accounting: accounting::Accounting,
}

/// A weight in thousandths, as the exact share arithmetic uses it (at least 1).
fn weight_milli(w: f64) -> u64 {
    ((w * 1000.0).round() as u64).max(1)
}

/// The weight of a role's self leaf `r/.` (Mesos: 1; the role's weight applies to the role as a
/// whole against its siblings).
const SELF_LEAF_WEIGHT_MILLI: u64 = 1000;

impl Allocator {
    /// A new, empty allocator.
    pub fn new(config: AllocatorConfig) -> Self {
        let root = Role::new("", None);
        let seed = config.offer_id_seed;
        let mut a = Self {
            config,
            names: Names::default(),
            min_names: 0,
            excluded: Vec::new(),
            share_total: Rv::new(),
            total: Rv::new(),
            free_unres: Rv::new(),
            required: Rv::new(),
            guarded: Vec::new(),
            below: Vec::new(),
            n_below: 0,
            any_guarantee: false,
            agents: Slab::default(),
            agent_ids: HashMap::default(),
            agent_order: Vec::new(),
            frameworks: Slab::default(),
            fw_flags: Vec::new(),
            fw_ids: HashMap::default(),
            roles: vec![root],
            role_ids: HashMap::default(),
            free_role_slots: Vec::new(),
            offers: OfferBook::new(seed),
            filter_heap: BinaryHeap::new(),
            refused: RefusedPool::default(),
            epoch: 0,
            keys_stale: false,
            counters: Counters::default(),
            last_cycle_offers: 0,
            wanting: 0,
            needs: None,
            pending_buf: Vec::new(),
            gpu_models: Vec::new(),
            model_first: Vec::new(),
            model_wanted: 0,
            res_cache: None,
            accounting: accounting::Accounting::default(),
        };
        a.role_ids.insert(String::new(), 0);
        a
    }

    /// The configuration in use.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    fn fw(&self, f: u32) -> &Framework {
        self.frameworks
            .get(f)
            .expect("allocator invariant: live framework slot")
    }

    fn fw_mut(&mut self, f: u32) -> &mut Framework {
        self.frameworks
            .get_mut(f)
            .expect("allocator invariant: live framework slot")
    }

    fn ag(&self, a: u32) -> &Agent {
        self.agents
            .get(a)
            .expect("allocator invariant: live agent slot")
    }

    fn ag_mut(&mut self, a: u32) -> &mut Agent {
        self.agents
            .get_mut(a)
            .expect("allocator invariant: live agent slot")
    }
}

/// Framework flag: declared the GPU capability.
const FW_GPU: u8 = 1;
/// Framework flag: declared a demand.
const FW_DEMAND: u8 = 2;
/// Framework flag: declared minimum allocatable quantities.
const FW_MIN: u8 = 4;

/// The first 16 bytes of a name as a big-endian number (same order as the bytes).
fn name_prefix(name: &str) -> u128 {
    let mut b = [0u8; 16];
    let n = name.len().min(16);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    u128::from_be_bytes(b)
}

fn norm_role(role: &str) -> &str {
    let r = role.trim_matches('/');
    if r.is_empty() {
        DEFAULT_ROLE
    } else {
        r
    }
}

#[cfg(test)]
mod tests;
