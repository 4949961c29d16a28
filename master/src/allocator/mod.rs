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
//! - `dense`: milli-unit vectors, `Bundle`s of unreserved and reserved pools, exact `Share`s.
//! - `filters`: decline filters per agent, refusing bundles (pools kept apart).
//! - `tests`: unit tests; the conformance rules of issue 11 are pinned by the scenarios in
//!   `master/tests/conformance/` (see `docs/allocator.md`).

mod dense;
mod filters;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use gantry_sdk::protocol::messages::Demand;
use gantry_sdk::protocol::{AgentId, FrameworkId, OfferId, ResourceLimits, Resources};
use serde::Serialize;

use dense::{Bundle, Names, Rv, Share};
use filters::{AgentFilters, Filter, RefusedPool};

/// Milliseconds of (real or simulated) time. Always an input, never read from a clock.
pub type Millis = u64;

/// The name frameworks use when they give an empty role.
pub const DEFAULT_ROLE: &str = "*";

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
    /// High 64 bits of generated offer ids (the master passes a random value, the simulator 0).
    pub offer_id_seed: u64,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self {
            filter_gpu_resources: true,
            fairness_excluded_resources: Vec::new(),
            default_refuse_ms: 5000,
            offer_timeout_ms: None,
            offer_id_seed: 0,
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

    /// True when nothing at all.
    pub fn is_empty(&self) -> bool {
        self.unreserved.is_empty() && self.reserved.values().all(Resources::is_empty)
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
}

#[derive(Debug)]
struct FwRole {
    role: u32,
    alloc: Rv,
    offers: u64,
    suppressed: bool,
    key: SortKey,
}

#[derive(Debug)]
struct Framework {
    id: FrameworkId,
    name: Arc<str>,
    gpu_capable: bool,
    /// (task shape, remaining count)
    demand: Option<(Rv, u64)>,
    /// Tasks' worth currently sitting in outstanding offers.
    offered_tasks: u64,
    roles: Vec<FwRole>,
    alloc: Bundle,
    offers_made: u64,
    inuse_agents: HashSet<u32>,
    /// Number of agents where this framework has filters.
    filtered_agents: usize,
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

#[derive(Debug)]
struct OfferState {
    id: OfferId,
    framework: FrameworkId,
    created_at: Millis,
    /// The public record, built on first request (most offers are only returned once).
    rec: std::sync::OnceLock<Box<OfferRecord>>,
    fw: u32,
    agent: u32,
    role: u32,
    bundle: Bundle,
    tasks: u64,
}

/// Outstanding offers in a slab. An offer id carries its slot (low 24 bits) under a global
/// sequence number (next 40 bits) and the configured seed (high 64 bits), so lookups need no
/// hashing and ids still sort by age.
struct OfferBook {
    slots: Vec<Option<OfferState>>,
    free: Vec<u32>,
    len: usize,
    seq: u64,
    seed: u64,
}

const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

impl OfferBook {
    fn new(seed: u64) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            seq: 0,
            seed,
        }
    }

    /// True when fewer than 4096 slots are left (a visit makes only a few offers).
    fn is_full(&self) -> bool {
        self.free.len() < 4096 && self.slots.len() as u64 + 4096 > SLOT_MASK
    }

    /// Reserves a slot and returns the id for the offer that will be put there.
    fn next_id(&mut self) -> OfferId {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        self.seq += 1;
        let low = ((self.seq & ((1 << (64 - SLOT_BITS)) - 1)) << SLOT_BITS) | slot as u64;
        OfferId::from_u128(((self.seed as u128) << 64) | low as u128)
    }

    fn slot(&self, id: &OfferId) -> Option<usize> {
        let v = id.0.as_u128();
        if (v >> 64) as u64 != self.seed {
            return None;
        }
        let s = (v as u64 & SLOT_MASK) as usize;
        (s < self.slots.len()).then_some(s)
    }

    fn insert(&mut self, id: OfferId, st: OfferState) {
        if let Some(s) = self.slot(&id) {
            if self.slots[s].is_none() {
                self.len += 1;
            }
            self.slots[s] = Some(st);
        }
    }

    fn get(&self, id: &OfferId) -> Option<&OfferState> {
        let s = self.slot(id)?;
        self.slots[s].as_ref().filter(|st| st.id == *id)
    }

    fn get_mut(&mut self, id: &OfferId) -> Option<&mut OfferState> {
        let s = self.slot(id)?;
        self.slots[s].as_mut().filter(|st| st.id == *id)
    }

    fn remove(&mut self, id: &OfferId) -> Option<OfferState> {
        let s = self.slot(id)?;
        if self.slots[s].as_ref().is_some_and(|st| st.id == *id) {
            self.len -= 1;
            self.free.push(s as u32);
            self.slots[s].take()
        } else {
            None
        }
    }

    fn values(&self) -> impl Iterator<Item = &OfferState> {
        self.slots.iter().flatten()
    }

    fn len(&self) -> usize {
        self.len
    }
}

struct Pending {
    fw: u32,
    role: u32,
    bundle: Bundle,
    tasks: u64,
}

struct Candidate {
    fw: u32,
    role: u32,
    grant: Bundle,
    tasks: u64,
}

#[derive(Default)]
struct Counters {
    made: u64,
    accepted: u64,
    declined: u64,
    rescinded: u64,
    expired: u64,
    cycles: u64,
}

/// The hierarchical DRF allocator and its offer book. See the module docs.
pub struct Allocator {
    config: AllocatorConfig,
    names: Names,
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
    agents: Vec<Option<Agent>>,
    agent_ids: HashMap<AgentId, u32>,
    agent_order: Vec<u32>,
    free_agent_slots: Vec<u32>,
    frameworks: Vec<Option<Framework>>,
    /// [`FW_GPU`] / [`FW_DEMAND`] per framework slot (hot path of the scan).
    fw_flags: Vec<u8>,
    fw_ids: HashMap<FrameworkId, u32>,
    free_fw_slots: Vec<u32>,
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
    /// Reused per-visit buffer of offers being assembled on one agent.
    pending_buf: Vec<Pending>,
    /// Last unreserved vector converted to named resources.
    res_cache: Option<(Rv, Resources)>,
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
            excluded: Vec::new(),
            share_total: Rv::new(),
            total: Rv::new(),
            free_unres: Rv::new(),
            required: Rv::new(),
            guarded: Vec::new(),
            below: Vec::new(),
            n_below: 0,
            any_guarantee: false,
            agents: Vec::new(),
            agent_ids: HashMap::default(),
            agent_order: Vec::new(),
            free_agent_slots: Vec::new(),
            frameworks: Vec::new(),
            fw_flags: Vec::new(),
            fw_ids: HashMap::default(),
            free_fw_slots: Vec::new(),
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
            pending_buf: Vec::new(),
            res_cache: None,
        };
        a.role_ids.insert(String::new(), 0);
        a
    }

    /// The configuration in use.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    // -----------------------------------------------------------------------------------------
    // helpers: names, shares, roles

    fn rv(&mut self, r: &Resources) -> Rv {
        let v = self.names.rv(r);
        self.sync_names();
        v
    }

    fn sync_names(&mut self) {
        while self.excluded.len() < self.names.len() {
            let i = self.excluded.len();
            let name = self.names.name(i).to_string();
            self.excluded
                .push(self.config.fairness_excluded_resources.contains(&name));
        }
    }

    fn recompute_share_total(&mut self) {
        self.sync_names();
        self.share_total = (0..self.names.len())
            .map(|i| {
                if self.excluded[i] {
                    0
                } else {
                    dense::at(&self.total, i)
                }
            })
            .collect();
    }

    /// The exact dominant share of `v`, divided by the weight `weight_milli / 1000`.
    fn share_of(&self, v: &[u64], weight_milli: u64) -> Share {
        Share::dominant(v, &self.share_total, weight_milli)
    }

    fn bundle(&mut self, r: &OfferResources) -> Bundle {
        let mut b = Bundle {
            unres: self.rv(&r.unreserved),
            resv: Vec::new(),
        };
        for (role, res) in &r.reserved {
            let ri = self.role_index(role);
            let v = self.rv(res);
            b.add_resv(ri, &v);
        }
        b
    }

    /// Converts without creating names or roles; `None` if something unknown is named.
    fn try_bundle(&self, r: &OfferResources) -> Option<Bundle> {
        let mut b = Bundle {
            unres: self.names.try_rv(&r.unreserved)?,
            resv: Vec::new(),
        };
        for (role, res) in &r.reserved {
            if res.is_empty() {
                continue;
            }
            let ri = *self.role_ids.get(norm_role(role))?;
            b.add_resv(ri, &self.names.try_rv(res)?);
        }
        Some(b)
    }

    /// Like `offer_resources`, reusing the last conversion when the amounts repeat (many
    /// offers of a cycle have the same shape); cloning skips the map searches.
    fn cached_offer_resources(&mut self, b: &Bundle) -> OfferResources {
        if !b.resv.is_empty() {
            return self.offer_resources(b);
        }
        if let Some((key, res)) = &self.res_cache {
            if *key == b.unres {
                return OfferResources::unreserved(res.clone());
            }
        }
        let res = self.names.res(&b.unres);
        self.res_cache = Some((b.unres.clone(), res.clone()));
        OfferResources::unreserved(res)
    }

    fn offer_resources(&self, b: &Bundle) -> OfferResources {
        OfferResources {
            unreserved: self.names.res(&b.unres),
            reserved: b
                .resv
                .iter()
                .map(|(r, v)| (self.roles[*r as usize].name.to_string(), self.names.res(v)))
                .collect(),
        }
    }

    /// The node of `name`, created (with its ancestors) if new.
    fn role_index(&mut self, name: &str) -> u32 {
        let name = norm_role(name);
        if let Some(i) = self.role_ids.get(name) {
            return *i;
        }
        let parent = match name.rsplit_once('/') {
            Some((p, _)) if !p.is_empty() => self.role_index(p),
            _ => 0,
        };
        let idx = match self.free_role_slots.pop() {
            Some(slot) => {
                self.roles[slot as usize] = Role::new(name, Some(parent));
                slot
            }
            None => {
                self.roles.push(Role::new(name, Some(parent)));
                (self.roles.len() - 1) as u32
            }
        };
        self.role_ids.insert(name.to_string(), idx);
        self.refresh_sorted_singleton(parent);
        let key = self.role_key(idx);
        self.roles[parent as usize].sorted.insert(key.clone());
        self.roles[idx as usize].key = Some(key);
        idx
    }

    fn role_key(&self, r: u32) -> SortKey {
        let role = &self.roles[r as usize];
        SortKey {
            share: self.share_of(&role.alloc, weight_milli(role.weight)),
            offers: role.offers,
            prefix: name_prefix(&role.name),
            name: role.name.clone(),
            idx: r,
        }
    }

    fn self_key(&self, r: u32) -> SortKey {
        let role = &self.roles[r as usize];
        SortKey {
            share: self.share_of(&role.own_alloc, SELF_LEAF_WEIGHT_MILLI),
            offers: role.own_offers,
            prefix: name_prefix(&role.self_name),
            name: role.self_name.clone(),
            idx: r,
        }
    }

    /// Re-sorts `r` and its ancestors in their parents (and `r`'s self leaf). A set with a single
    /// element needs no order, so its element's key is left as is (refreshed by
    /// [`Allocator::refresh_sorted_singleton`] before anything else joins that set).
    fn refresh_role_chain(&mut self, r: u32) {
        if self.roles[r as usize].self_key.is_some() && self.roles[r as usize].sorted.len() > 1 {
            let new = self.self_key(r);
            let role = &mut self.roles[r as usize];
            if role.self_key.as_ref() != Some(&new) {
                if let Some(old) = role.self_key.take() {
                    role.sorted.remove(&old);
                }
                role.sorted.insert(new.clone());
                role.self_key = Some(new);
            }
        }
        let mut node = r;
        while let Some(parent) = self.roles[node as usize].parent {
            if self.roles[parent as usize].sorted.len() > 1 {
                let new = self.role_key(node);
                if self.roles[node as usize].key.as_ref() != Some(&new) {
                    let old = self.roles[node as usize].key.take();
                    let p = &mut self.roles[parent as usize];
                    if let Some(old) = old {
                        p.sorted.remove(&old);
                    }
                    p.sorted.insert(new.clone());
                    self.roles[node as usize].key = Some(new);
                }
            }
            node = parent;
        }
    }

    /// Brings the key of a role set's only element up to date (before a second one joins).
    fn refresh_sorted_singleton(&mut self, r: u32) {
        if self.roles[r as usize].sorted.len() != 1 {
            return;
        }
        let Some(old) = self.roles[r as usize].sorted.first().cloned() else {
            return;
        };
        let new = if old.idx == r {
            self.self_key(r)
        } else {
            self.role_key(old.idx)
        };
        let role = &mut self.roles[r as usize];
        role.sorted.clear();
        role.sorted.insert(new.clone());
        if old.idx == r {
            role.self_key = Some(new);
        } else {
            self.roles[old.idx as usize].key = Some(new);
        }
    }

    /// Brings the key of a framework set's only element up to date (before a second one joins).
    fn refresh_fw_singleton(&mut self, r: u32) {
        if self.roles[r as usize].frameworks.len() != 1 {
            return;
        }
        let Some(old) = self.roles[r as usize].frameworks.first().cloned() else {
            return;
        };
        let f = old.idx;
        let Some(ri) = self.fw(f).roles.iter().position(|x| x.role == r) else {
            return;
        };
        let new = self.fw_key(f, ri);
        let set = &mut self.roles[r as usize].frameworks;
        set.clear();
        set.insert(new.clone());
        self.fw_mut(f).roles[ri].key = new;
    }

    fn fw_key(&self, f: u32, ri: usize) -> SortKey {
        let fw = self.fw(f);
        let fr = &fw.roles[ri];
        SortKey {
            share: self.share_of(&fr.alloc, 1000),
            offers: fr.offers,
            prefix: name_prefix(&fw.name),
            name: fw.name.clone(),
            idx: f,
        }
    }

    fn refresh_fw_key(&mut self, f: u32, ri: usize) {
        let new = self.fw_key(f, ri);
        let fr = &mut self.frameworks[f as usize]
            .as_mut()
            .expect("allocator invariant: live framework slot")
            .roles[ri];
        if fr.key != new {
            if fr.suppressed {
                fr.key = new;
            } else {
                let set = &mut self.roles[fr.role as usize].frameworks;
                // A lone framework needs no order: its key is refreshed when another joins.
                if set.len() > 1 {
                    let old = std::mem::replace(&mut fr.key, new.clone());
                    set.remove(&old);
                    set.insert(new);
                }
            }
        }
    }

    /// Recomputes every sort key (after the cluster total changed).
    fn rekey_all(&mut self) {
        self.recompute_share_total();
        for r in 0..self.roles.len() as u32 {
            self.roles[r as usize].sorted.clear();
            self.roles[r as usize].frameworks.clear();
        }
        for r in 1..self.roles.len() as u32 {
            let key = self.role_key(r);
            if let Some(p) = self.roles[r as usize].parent {
                self.roles[p as usize].sorted.insert(key.clone());
            }
            self.roles[r as usize].key = Some(key);
            if self.roles[r as usize].self_key.is_some() {
                let sk = self.self_key(r);
                self.roles[r as usize].sorted.insert(sk.clone());
                self.roles[r as usize].self_key = Some(sk);
            }
        }
        for f in 0..self.frameworks.len() as u32 {
            if self.frameworks[f as usize].is_none() {
                continue;
            }
            for ri in 0..self.fw(f).roles.len() {
                let key = self.fw_key(f, ri);
                let role = self.fw(f).roles[ri].role;
                if !self.fw(f).roles[ri].suppressed {
                    self.roles[role as usize].frameworks.insert(key.clone());
                }
                self.fw_mut(f).roles[ri].key = key;
            }
        }
        self.keys_stale = false;
    }

    fn fw(&self, f: u32) -> &Framework {
        self.frameworks[f as usize]
            .as_ref()
            .expect("allocator invariant: live framework slot")
    }

    fn fw_mut(&mut self, f: u32) -> &mut Framework {
        self.frameworks[f as usize]
            .as_mut()
            .expect("allocator invariant: live framework slot")
    }

    fn ag(&self, a: u32) -> &Agent {
        self.agents[a as usize]
            .as_ref()
            .expect("allocator invariant: live agent slot")
    }

    fn ag_mut(&mut self, a: u32) -> &mut Agent {
        self.agents[a as usize]
            .as_mut()
            .expect("allocator invariant: live agent slot")
    }

    fn chain(&self, r: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(Some(r), move |n| self.roles[*n as usize].parent).filter(|n| *n != 0)
    }

    fn consumed(&self, r: u32) -> Rv {
        let role = &self.roles[r as usize];
        let mut c = role.alloc_unres.clone();
        dense::add(&mut c, &role.reserved);
        c
    }

    fn remaining_guarantee(&self, r: u32) -> Rv {
        match &self.roles[r as usize].guarantee {
            None => Rv::new(),
            Some(g) => {
                let mut rem = g.clone();
                dense::sub(&mut rem, &self.consumed(r));
                rem
            }
        }
    }

    /// Cached during a cycle (see [`Allocator::recompute_required`] and `charge`).
    fn below_guarantee(&self, r: u32) -> bool {
        self.below.get(r as usize).copied().unwrap_or(false)
    }

    fn set_below(&mut self, r: u32) {
        let now_below = self.roles[r as usize].guarantee.is_some()
            && !dense::is_zero(&self.remaining_guarantee(r));
        if self.below.len() <= r as usize {
            self.below.resize(r as usize + 1, false);
        }
        let was = std::mem::replace(&mut self.below[r as usize], now_below);
        if self.roles[r as usize].fw_count > 0 && was != now_below {
            if now_below {
                self.n_below += 1;
            } else {
                self.n_below = self.n_below.saturating_sub(1);
            }
        }
    }

    /// True when `r` has a guarantee and none of its ancestors has one: nested guarantees are
    /// included in their ancestor's, so headroom is held back once per such subtree.
    fn top_guaranteed(&self, r: u32) -> bool {
        self.roles[r as usize].guarantee.is_some()
            && self
                .chain(r)
                .skip(1)
                .all(|n| self.roles[n as usize].guarantee.is_none())
    }

    fn recompute_required(&mut self) {
        let mut req = Rv::new();
        let mut guarded = vec![false; self.names.len()];
        let mut any = false;
        for r in 1..self.roles.len() as u32 {
            if let Some(g) = &self.roles[r as usize].guarantee {
                any = true;
                for (i, x) in g.iter().enumerate() {
                    if *x > 0 {
                        guarded[i] = true;
                    }
                }
                if self.top_guaranteed(r) {
                    dense::add(&mut req, &self.remaining_guarantee(r));
                }
            }
        }
        self.required = req;
        self.guarded = guarded;
        self.any_guarantee = any;
        self.below.clear();
        self.below.resize(self.roles.len(), false);
        self.n_below = 0;
        if any {
            for r in 1..self.roles.len() as u32 {
                self.set_below(r);
            }
        }
    }

    /// Changes an allocation (offered or in use) of framework `f` in role `role` by `b`.
    fn charge(&mut self, f: u32, role: u32, b: &Bundle, add: bool) {
        let total = b.total();
        let guaranteed: smallvec::SmallVec<[u32; 4]> = if self.any_guarantee {
            self.chain(role)
                .filter(|r| self.roles[*r as usize].guarantee.is_some())
                .collect()
        } else {
            smallvec::SmallVec::new()
        };
        // The chain runs upwards: its last guaranteed role is the top one, the only one whose
        // remaining guarantee counts toward the required headroom.
        let top = guaranteed.last().copied();
        if let Some(t) = top {
            let rem = self.remaining_guarantee(t);
            dense::sub(&mut self.required, &rem);
        }
        let ri = {
            let fw = self.fw_mut(f);
            if add {
                fw.alloc.add(b);
            } else {
                fw.alloc.sub(b);
            }
            let ri = fw.roles.iter().position(|x| x.role == role);
            if let Some(ri) = ri {
                if add {
                    dense::add(&mut fw.roles[ri].alloc, &total);
                } else {
                    dense::sub(&mut fw.roles[ri].alloc, &total);
                }
            }
            ri
        };
        {
            let r = &mut self.roles[role as usize];
            if add {
                dense::add(&mut r.own_alloc, &total);
            } else {
                dense::sub(&mut r.own_alloc, &total);
            }
        }
        let mut node = Some(role);
        while let Some(n) = node {
            if n == 0 {
                break;
            }
            let r = &mut self.roles[n as usize];
            if add {
                dense::add(&mut r.alloc, &total);
                dense::add(&mut r.alloc_unres, &b.unres);
            } else {
                dense::sub(&mut r.alloc, &total);
                dense::sub(&mut r.alloc_unres, &b.unres);
            }
            node = r.parent;
        }
        if let Some(t) = top {
            let rem = self.remaining_guarantee(t);
            dense::add(&mut self.required, &rem);
        }
        for r in &guaranteed {
            self.set_below(*r);
        }
        if let Some(ri) = ri {
            self.refresh_fw_key(f, ri);
        }
        self.refresh_role_chain(role);
    }

    fn add_reserved_to_roles(&mut self, b: &Bundle, add: bool) {
        for (role, v) in &b.resv {
            let mut node = Some(*role);
            while let Some(n) = node {
                if n == 0 {
                    break;
                }
                let r = &mut self.roles[n as usize];
                if add {
                    dense::add(&mut r.reserved, v);
                } else {
                    dense::sub(&mut r.reserved, v);
                }
                node = r.parent;
            }
        }
    }

    fn build_record(&self, st: &OfferState) -> OfferRecord {
        OfferRecord {
            id: st.id,
            framework: st.framework,
            agent: self.ag(st.agent).id,
            role: self.roles[st.role as usize].name.to_string(),
            resources: self.offer_resources(&st.bundle),
            created_at: st.created_at,
        }
    }

    fn record_of<'a>(&self, st: &'a OfferState) -> &'a OfferRecord {
        st.rec.get_or_init(|| Box::new(self.build_record(st)))
    }

    /// The record of an offer that was just removed from the book.
    fn take_record(&self, mut st: OfferState) -> OfferRecord {
        match st.rec.take() {
            Some(r) => *r,
            None => self.build_record(&st),
        }
    }

    fn add_filter(
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
        let Some(Some(agent)) = self.agents.get_mut(a as usize) else {
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

    fn clear_filters(&mut self, f: u32) {
        if self.fw(f).filtered_agents == 0 {
            return;
        }
        for i in 0..self.agent_order.len() {
            let a = self.agent_order[i] as usize;
            if let Some(Some(agent)) = self.agents.get_mut(a) {
                if agent.filters.remove(f, &mut self.refused) {
                    agent.stable = None;
                }
            }
        }
        self.fw_mut(f).filtered_agents = 0;
    }

    fn expire_filters(&mut self, now: Millis) {
        while let Some(Reverse((expires, a, f))) = self.filter_heap.peek().copied() {
            if expires > now {
                break;
            }
            self.filter_heap.pop();
            let Some(Some(agent)) = self.agents.get_mut(a as usize) else {
                continue;
            };
            let (changed, emptied) = agent
                .filters
                .expire(f, now, &agent.total, &mut self.refused);
            if changed {
                agent.stable = None;
            }
            if emptied {
                if let Some(Some(fw)) = self.frameworks.get_mut(f as usize) {
                    fw.filtered_agents = fw.filtered_agents.saturating_sub(1);
                }
            }
        }
    }

    /// Removes an outstanding offer, returning its resources to the agent's free pool.
    fn drop_offer(&mut self, id: OfferId) -> Option<OfferState> {
        let st = self.offers.remove(&id)?;
        self.charge(st.fw, st.role, &st.bundle, false);
        self.return_to_agent(st.agent, &st.bundle);
        let fw = self.fw_mut(st.fw);
        fw.offered_tasks = fw.offered_tasks.saturating_sub(st.tasks);
        if st.tasks > 0 {
            self.epoch += 1;
        }
        let agent = self.ag_mut(st.agent);
        agent.offers.retain(|o| *o != id);
        Some(st)
    }

    fn return_to_agent(&mut self, a: u32, b: &Bundle) {
        dense::add(&mut self.free_unres, &b.unres);
        let agent = self.ag_mut(a);
        agent.free.add(b);
        agent.stable = None;
    }

    // -----------------------------------------------------------------------------------------
    // agents

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
        };
        let slot = match self.free_agent_slots.pop() {
            Some(s) => {
                self.agents[s as usize] = Some(agent);
                s
            }
            None => {
                self.agents.push(Some(agent));
                (self.agents.len() - 1) as u32
            }
        };
        self.agent_ids.insert(id, slot);
        self.agent_order.push(slot);
        self.keys_stale = true;
        self.epoch += 1;
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
        let Some(agent) = self.agents[a as usize].take() else {
            return out;
        };
        let mut agent = agent;
        for f in agent.filters.frameworks() {
            if let Some(Some(fw)) = self.frameworks.get_mut(*f as usize) {
                fw.filtered_agents = fw.filtered_agents.saturating_sub(1);
            }
        }
        agent.filters.clear(&mut self.refused);
        dense::sub(&mut self.total, &agent.total.total());
        dense::sub(&mut self.free_unres, &agent.free.unres);
        self.add_reserved_to_roles(&agent.total, false);
        self.agent_ids.remove(&id);
        self.agent_order.retain(|x| *x != a);
        self.free_agent_slots.push(a);
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
                self.charge(st.fw, st.role, &st.bundle, false);
                let fw = self.fw_mut(st.fw);
                fw.offered_tasks = fw.offered_tasks.saturating_sub(st.tasks);
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
        let agent = self.agents[a as usize]
            .as_mut()
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

    // -----------------------------------------------------------------------------------------
    // frameworks

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
                    demand: None,
                    offered_tasks: 0,
                    roles: Vec::new(),
                    alloc: Bundle::default(),
                    offers_made: 0,
                    inuse_agents: HashSet::default(),
                    filtered_agents: 0,
                };
                let slot = match self.free_fw_slots.pop() {
                    Some(s) => {
                        self.frameworks[s as usize] = Some(fw);
                        s
                    }
                    None => {
                        self.frameworks.push(Some(fw));
                        (self.frameworks.len() - 1) as u32
                    }
                };
                self.fw_ids.insert(id, slot);
                if self.fw_flags.len() <= slot as usize {
                    self.fw_flags.resize(slot as usize + 1, 0);
                }
                slot
            }
        };
        self.fw_flags[f as usize] = if gpu_capable { FW_GPU } else { 0 };
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
        self.set_demand_inner(f, demand);
        self.epoch += 1;
    }

    /// Removes a framework: outstanding offers are dropped (returned), its allocations freed,
    /// its filters forgotten.
    pub fn remove_framework(&mut self, id: FrameworkId) -> Vec<OfferRecord> {
        let Some(&f) = self.fw_ids.get(&id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut mine: Vec<OfferId> = self
            .offers
            .values()
            .filter(|s| s.fw == f)
            .map(|s| s.id)
            .collect();
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
        self.frameworks[f as usize] = None;
        self.fw_ids.remove(&id);
        self.free_fw_slots.push(f);
        self.epoch += 1;
        out
    }

    fn set_demand_inner(&mut self, f: u32, demand: Option<Demand>) {
        let d = match demand {
            Some(d) if !d.task.is_empty() => Some((self.rv(&d.task), d.count as u64)),
            _ => None,
        };
        let flag = if d.is_some() { FW_DEMAND } else { 0 };
        let same_shape = match (&self.fw(f).demand, &d) {
            (Some((old, _)), Some((new, _))) => old == new,
            (None, None) => true,
            _ => false,
        };
        self.fw_mut(f).demand = d;
        self.fw_flags[f as usize] = (self.fw_flags[f as usize] & !FW_DEMAND) | flag;
        if !same_shape {
            self.recount_offered_tasks(f);
        }
    }

    /// Recounts the whole tasks' worth (of the current demand's shape) in each of the
    /// framework's outstanding offers, whatever made them: eligibility for more compares the
    /// declared count with that.
    fn recount_offered_tasks(&mut self, f: u32) {
        let task = self.fw(f).demand.as_ref().map(|(t, _)| t.clone());
        let mine: Vec<OfferId> = self
            .offers
            .values()
            .filter(|st| st.fw == f)
            .map(|st| st.id)
            .collect();
        let mut sum = 0u64;
        for id in mine {
            if let Some(st) = self.offers.get_mut(&id) {
                st.tasks = match &task {
                    Some(t) => whole_tasks(&st.bundle.total(), t),
                    None => 0,
                };
                sum = sum.saturating_add(st.tasks);
            }
        }
        self.fw_mut(f).offered_tasks = sum;
    }

    /// Replaces a framework's declared demand (`None`: Mesos behaviour, whole agents).
    pub fn set_demand(&mut self, framework: FrameworkId, demand: Option<Demand>) {
        let Some(&f) = self.fw_ids.get(&framework) else {
            return;
        };
        self.set_demand_inner(f, demand);
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
                removed.push((fr.role, fr.key.clone()));
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
                revived.push(ri);
            }
        }
        for ri in revived {
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
        self.clear_filters(f);
        self.epoch += 1;
    }

    // -----------------------------------------------------------------------------------------
    // roles

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

    /// Replaces a role's quota: `guarantee` is held back as headroom for the role, `limit` caps
    /// what it can hold (kinds not named are unlimited; a kind named with zero is a limit of
    /// zero). `None` removes that part.
    ///
    /// Guarantees nest (a parent's guarantee includes its subroles'): a guarantee below the sum
    /// of the guarantees of the role's nearest guaranteed subroles, or one that would push the
    /// sum of its siblings' guarantees above the nearest guaranteed ancestor's, is refused with
    /// [`AllocError::InvalidQuota`] and changes nothing.
    pub fn set_quota(
        &mut self,
        role: &str,
        guarantee: Option<Resources>,
        limit: Option<ResourceLimits>,
    ) -> Result<(), AllocError> {
        let guarantee = guarantee.filter(|g| !g.is_empty());
        self.check_nested_guarantee(role, guarantee.as_ref())?;
        let r = self.role_index(role);
        let g = guarantee.map(|g| self.rv(&g));
        let l = limit.filter(|l| !l.is_empty()).map(|l| {
            for (n, _) in l.iter() {
                self.names.intern(n);
            }
            self.sync_names();
            let mut v: Rv = smallvec::smallvec![u64::MAX; self.names.len()];
            for (n, milli) in l.iter() {
                if let Some(i) = self.names.lookup(n) {
                    v[i] = milli;
                }
            }
            v
        });
        self.roles[r as usize].guarantee = g;
        self.roles[r as usize].limit = l;
        self.recompute_required();
        self.epoch += 1;
        Ok(())
    }

    /// Checks that giving `role` the guarantee `guarantee` keeps guarantees nested: for every
    /// guaranteed role, the guarantees of its nearest guaranteed subroles sum to at most its own
    /// (per kind; a kind its guarantee does not name counts as zero). Only two constraints can
    /// change: the role's own, and that of its nearest guaranteed ancestor; the cost is the size
    /// of those subtrees.
    fn check_nested_guarantee(
        &self,
        role: &str,
        guarantee: Option<&Resources>,
    ) -> Result<(), AllocError> {
        let role = norm_role(role);
        let me = self.role_ids.get(role).copied().filter(|r| *r != 0);
        let guarantee_of = |n: u32| -> Option<Resources> {
            if Some(n) == me {
                guarantee.cloned()
            } else {
                self.roles[n as usize]
                    .guarantee
                    .as_ref()
                    .map(|g| self.names.res(g))
            }
        };
        // The sum of the guarantees of `n`'s nearest guaranteed subroles.
        let sum_below = |n: u32| -> Resources {
            let children = |x: u32| {
                self.roles[x as usize]
                    .sorted
                    .iter()
                    .filter(move |k| k.idx != x)
                    .map(|k| k.idx)
            };
            let mut sum = Resources::new();
            let mut stack: Vec<u32> = children(n).collect();
            while let Some(c) = stack.pop() {
                match guarantee_of(c) {
                    Some(g) => sum.add_assign(&g),
                    None => stack.extend(children(c)),
                }
            }
            sum
        };
        let nested = "a parent's guarantee includes its subroles'";
        if let (Some(g), Some(r)) = (guarantee, me) {
            let sum = sum_below(r);
            if !g.contains(&sum) {
                return Err(AllocError::InvalidQuota(format!(
                    "the guarantee of role {role:?} ({g}) is below the sum of its subroles' guarantees ({sum}); {nested}"
                )));
            }
        }
        let mut cur = role;
        while let Some((parent, _)) = cur.rsplit_once('/') {
            cur = parent;
            let Some(&p) = self.role_ids.get(parent) else {
                continue;
            };
            let Some(pg) = guarantee_of(p) else {
                continue;
            };
            let mut sum = sum_below(p);
            if me.is_none() {
                // A new role: not in the tree yet.
                if let Some(g) = guarantee {
                    sum.add_assign(g);
                }
            }
            if !pg.contains(&sum) {
                return Err(AllocError::InvalidQuota(format!(
                    "the guarantees of the subroles of {parent:?} would sum to {sum}, above its guarantee ({pg}); {nested}"
                )));
            }
            break;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // the allocation cycle

    /// Runs one allocation cycle at time `now`: expired filters are dropped, then agents are
    /// visited in the order they were added, first for roles below their quota guarantee, then
    /// for everyone by fair share. Returns the new offers (their resources count as allocated).
    pub fn allocate(&mut self, now: Millis) -> Vec<OfferRecord> {
        self.counters.cycles += 1;
        self.expire_filters(now);
        if self.keys_stale {
            self.rekey_all();
        }
        self.recompute_required();
        let mut out = Vec::with_capacity(self.last_cycle_offers);
        // What the quota stage grants on an agent is held and merged with what the fair-share
        // stage grants there: one offer per (framework, agent, role) per cycle.
        let mut held: Vec<(u32, Vec<Pending>)> = Vec::new();
        if self.any_guarantee {
            for i in 0..self.agent_order.len() {
                // Stage 1 ends as soon as no role with frameworks is below its guarantee.
                if self.n_below == 0 {
                    break;
                }
                let a = self.agent_order[i];
                let mut pending = Vec::new();
                self.visit(a, true, now, &mut pending);
                if !pending.is_empty() {
                    held.push((a, pending));
                }
            }
        }
        let mut held = held.into_iter().peekable();
        for i in 0..self.agent_order.len() {
            let a = self.agent_order[i];
            let mut pending = match held.next_if(|(x, _)| *x == a) {
                Some((_, p)) => p,
                None => {
                    let mut p = std::mem::take(&mut self.pending_buf);
                    p.clear();
                    p
                }
            };
            self.visit(a, false, now, &mut pending);
            self.emit(a, &mut pending, now, &mut out);
            self.pending_buf = pending;
        }
        self.last_cycle_offers = out.len();
        out
    }

    /// Grants on agent `a` in one stage, adding to the offers being assembled in `pending`.
    fn visit(&mut self, a: u32, stage1: bool, now: Millis, pending: &mut Vec<Pending>) {
        let epoch = self.epoch;
        if self.offers.is_full() {
            return;
        }
        {
            let agent = self.ag_mut(a);
            if agent.stable == Some(epoch) {
                return;
            }
            if agent.free.is_zero() {
                agent.stable = Some(epoch);
                return;
            }
        }
        loop {
            let mut constrained = false;
            match self.find(0, a, stage1, false, now, pending, &mut constrained) {
                Some(c) => self.grant(a, c, pending),
                None => {
                    if !stage1 && !constrained {
                        self.ag_mut(a).stable = Some(epoch);
                    }
                    break;
                }
            }
            if self.ag(a).free.is_zero() {
                break;
            }
        }
    }

    /// Turns the offers assembled on agent `a` into outstanding offers.
    fn emit(
        &mut self,
        a: u32,
        pending: &mut Vec<Pending>,
        now: Millis,
        out: &mut Vec<OfferRecord>,
    ) {
        for p in pending.drain(..) {
            let id = self.offers.next_id();
            let rec = OfferRecord {
                id,
                framework: self.fw(p.fw).id,
                agent: self.ag(a).id,
                role: self.roles[p.role as usize].name.to_string(),
                resources: self.cached_offer_resources(&p.bundle),
                created_at: now,
            };
            self.ag_mut(a).offers.push(id);
            self.offers.insert(
                id,
                OfferState {
                    id,
                    framework: rec.framework,
                    created_at: now,
                    rec: std::sync::OnceLock::new(),
                    fw: p.fw,
                    agent: a,
                    role: p.role,
                    bundle: p.bundle,
                    tasks: p.tasks,
                },
            );
            self.counters.made += 1;
            out.push(rec);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn find(
        &self,
        node: u32,
        a: u32,
        stage1: bool,
        in_quota: bool,
        now: Millis,
        pending: &[Pending],
        constrained: &mut bool,
    ) -> Option<Candidate> {
        for key in &self.roles[node as usize].sorted {
            if key.idx == node {
                if stage1 && !in_quota {
                    continue;
                }
                if let Some(c) = self.find_fw(node, a, stage1, now, pending, constrained) {
                    return Some(c);
                }
            } else {
                let child = key.idx;
                if self.roles[child as usize].fw_count == 0 {
                    continue;
                }
                let q = in_quota || (stage1 && self.below_guarantee(child));
                if let Some(c) = self.find(child, a, stage1, q, now, pending, constrained) {
                    return Some(c);
                }
            }
        }
        None
    }

    /// What role `r` may be offered on agent `a`: free reservations of `r` and its ancestors,
    /// and free unreserved resources capped by limits and by the headroom owed to guarantees.
    fn role_avail(&self, r: u32, a: u32, constrained: &mut bool) -> Bundle {
        let agent = self.ag(a);
        let mut b = Bundle {
            unres: agent.free.unres.clone(),
            resv: Vec::new(),
        };
        for n in self.chain(r) {
            let v = agent.free.resv_of(n);
            if !dense::is_zero(v) {
                b.add_resv(n, v);
            }
        }
        if dense::is_zero(&b.unres) {
            return b;
        }
        let mut cap: Option<Rv> = None;
        let mut own_remaining = Rv::new();
        for n in self.chain(r) {
            let role = &self.roles[n as usize];
            if let Some(limit) = &role.limit {
                let consumed = self.consumed(n);
                let room: Rv = limit
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        if *l == u64::MAX {
                            u64::MAX
                        } else {
                            l.saturating_sub(dense::at(&consumed, i))
                        }
                    })
                    .collect();
                match &mut cap {
                    None => cap = Some(room),
                    Some(c) => {
                        dense::cap_to(c, &room);
                        if c.len() < room.len() {
                            c.extend_from_slice(&room[c.len()..]);
                        }
                    }
                }
            }
            if role.guarantee.is_some() {
                let rem = self.remaining_guarantee(n);
                for (i, x) in rem.iter().enumerate() {
                    if own_remaining.len() <= i {
                        own_remaining.resize(i + 1, 0);
                    }
                    own_remaining[i] = own_remaining[i].max(*x);
                }
            }
        }
        if self.any_guarantee {
            let room: Rv = (0..self.names.len())
                .map(|i| {
                    if self.guarded.get(i).copied().unwrap_or(false) {
                        dense::at(&self.free_unres, i)
                            .saturating_sub(dense::at(&self.required, i))
                            .saturating_add(dense::at(&own_remaining, i))
                    } else {
                        u64::MAX
                    }
                })
                .collect();
            match &mut cap {
                None => cap = Some(room),
                Some(c) => {
                    dense::cap_to(c, &room);
                    if c.len() < room.len() {
                        c.extend_from_slice(&room[c.len()..]);
                    }
                }
            }
        }
        if let Some(cap) = cap {
            let before = b.unres.clone();
            dense::cap_to(&mut b.unres, &cap);
            if b.unres != before {
                *constrained = true;
            }
        }
        b
    }

    /// True when the agent's `avail` has some of a kind that a role below its guarantee in
    /// `r`'s chain is still owed (the quota stage serves a role only where it can progress).
    fn has_owed_kind(&self, r: u32, avail: &Bundle) -> bool {
        let avail = avail.total();
        self.chain(r).filter(|n| self.below_guarantee(*n)).any(|n| {
            self.remaining_guarantee(n)
                .iter()
                .enumerate()
                .any(|(i, owed)| *owed > 0 && dense::at(&avail, i) > 0)
        })
    }

    fn find_fw(
        &self,
        r: u32,
        a: u32,
        stage1: bool,
        now: Millis,
        pending: &[Pending],
        constrained: &mut bool,
    ) -> Option<Candidate> {
        let role = &self.roles[r as usize];
        if role.frameworks.is_empty() {
            return None;
        }
        let agent = self.ag(a);
        let avail = self.role_avail(r, a, constrained);
        if avail.is_zero() {
            return None;
        }
        if stage1 && !self.has_owed_kind(r, &avail) {
            return None;
        }
        let gpu_blocked = self.config.filter_gpu_resources && agent.gpu;
        let filtered = |f: u32, offer: &Bundle| agent.filters.blocks(f, offer, now, &self.refused);
        // Suppressed frameworks are not in the set at all; flags avoid touching the framework
        // record for the common (non-demand) case.
        for key in &role.frameworks {
            let f = key.idx;
            let flags = self.fw_flags[f as usize];
            if gpu_blocked && flags & FW_GPU == 0 {
                continue;
            }
            if flags & FW_DEMAND == 0 {
                if pending.iter().any(|p| p.fw == f && p.role == r) {
                    continue;
                }
                if filtered(f, &avail) {
                    continue;
                }
                return Some(Candidate {
                    fw: f,
                    role: r,
                    grant: avail,
                    tasks: 0,
                });
            }
            let fw = self.fw(f);
            let Some((task, count)) = &fw.demand else {
                continue;
            };
            if fw.offered_tasks >= *count {
                continue;
            }
            let Some(grant) = split_task(&avail, task) else {
                continue;
            };
            if filtered(f, &grant) {
                continue;
            }
            return Some(Candidate {
                fw: f,
                role: r,
                grant,
                tasks: 1,
            });
        }
        None
    }

    fn grant(&mut self, a: u32, c: Candidate, pending: &mut Vec<Pending>) {
        {
            dense::sub(&mut self.free_unres, &c.grant.unres);
            let agent = self.ag_mut(a);
            agent.free.sub(&c.grant);
            agent.stable = None;
        }
        let is_new = match pending
            .iter_mut()
            .find(|p| p.fw == c.fw && p.role == c.role)
        {
            Some(p) => {
                p.bundle.add(&c.grant);
                p.tasks += c.tasks;
                false
            }
            None => {
                pending.push(Pending {
                    fw: c.fw,
                    role: c.role,
                    bundle: c.grant.clone(),
                    tasks: c.tasks,
                });
                true
            }
        };
        if is_new {
            let fw = self.fw_mut(c.fw);
            fw.offers_made += 1;
            if let Some(fr) = fw.roles.iter_mut().find(|x| x.role == c.role) {
                fr.offers += 1;
            }
            self.roles[c.role as usize].own_offers += 1;
            let mut node = Some(c.role);
            while let Some(n) = node.filter(|n| *n != 0) {
                self.roles[n as usize].offers += 1;
                node = self.roles[n as usize].parent;
            }
        }
        self.fw_mut(c.fw).offered_tasks += c.tasks;
        self.charge(c.fw, c.role, &c.grant, true);
    }

    // -----------------------------------------------------------------------------------------
    // offers

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
                fw.offered_tasks = fw.offered_tasks.saturating_sub(st.tasks);
                if let Some((task, count)) = &mut fw.demand {
                    *count = count.saturating_sub(whole_tasks(&used_b.total(), task));
                }
            }
            if st.tasks > 0 {
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
                if let Some(fw) = self.frameworks[f as usize].as_mut() {
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

    fn change_reservation(
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
            let agent = self.agents[a as usize]
                .as_mut()
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

    /// A framework's remaining declared demand as (task shape, count).
    pub fn demand(&self, framework: FrameworkId) -> Option<Demand> {
        let f = *self.fw_ids.get(&framework)?;
        let (task, count) = self.fw(f).demand.as_ref()?;
        Some(Demand {
            task: self.names.res(task),
            count: (*count).min(u32::MAX as u64) as u32,
        })
    }

    /// Rescinds offers older than the configured offer timeout (none when it is off).
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
        for id in due {
            if let Some(st) = self.drop_offer(id) {
                self.counters.rescinded += 1;
                self.counters.expired += 1;
                out.push(self.take_record(st));
            }
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

    // -----------------------------------------------------------------------------------------
    // views

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

    /// The name an agent was added with.
    pub fn agent_name(&self, id: AgentId) -> Option<&str> {
        self.agent_ids.get(&id).map(|a| self.ag(*a).name.as_str())
    }

    /// The sum of all agents' resources.
    pub fn cluster_total(&self) -> Resources {
        self.names.res(&self.total)
    }

    /// Share computed against the current total (does not depend on cached sort state).
    fn share_now(&self, v: &[u64]) -> f64 {
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
        for fw in self.frameworks.iter().flatten() {
            m.active_filters += fw.filtered_agents;
            m.frameworks.insert(
                fw.id.to_string(),
                FrameworkMetrics {
                    name: fw.name.to_string(),
                    dominant_share: self.share_now(&fw.alloc.total()),
                    allocated: self.names.res(&fw.alloc.total()),
                    offers_made: fw.offers_made,
                },
            );
        }
        m
    }
}

/// Framework flag: declared the GPU capability.
const FW_GPU: u8 = 1;
/// Framework flag: declared a demand.
const FW_DEMAND: u8 = 2;

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

/// One task's worth out of `avail`, drawing reservations first (in `avail.resv` order, which is
/// by role index) and unreserved resources last. `None` when it does not fit.
fn split_task(avail: &Bundle, task: &[u64]) -> Option<Bundle> {
    let mut need: Rv = Rv::from_slice(task);
    let mut out = Bundle::default();
    for (role, pool) in &avail.resv {
        let take: Rv = need
            .iter()
            .enumerate()
            .map(|(i, n)| (*n).min(dense::at(pool, i)))
            .collect();
        if !dense::is_zero(&take) {
            dense::sub(&mut need, &take);
            out.add_resv(*role, &take);
        }
    }
    if !dense::contains(&avail.unres, &need) {
        return None;
    }
    out.unres = need;
    Some(out)
}

/// How many whole `task`s fit in `used`.
fn whole_tasks(used: &[u64], task: &[u64]) -> u64 {
    let mut n = u64::MAX;
    for (i, t) in task.iter().enumerate() {
        if *t > 0 {
            n = n.min(dense::at(used, i) / t);
        }
    }
    if n == u64::MAX {
        0
    } else {
        n
    }
}

#[cfg(test)]
mod tests;
