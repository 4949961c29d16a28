//! GPU models in declared demand (`Demand::gpu_model`): a task shape that names a model is
//! offered only on agents with a GPU of that model, and it comes first there.
//!
//! - **Matching**: the master tells the allocator each agent's GPU names
//!   ([`Allocator::set_agent_gpu_models`]); they are interned (lower case, at most
//!   [`MAX_MODELS`] distinct: one bit each), and a shape's model matches an agent when one of
//!   its GPU names contains it, case-insensitive, as a task's `GpuSelector::model` does. Several
//!   models may be named with `|` (`"V100M16|V100M32|P100"`): any of them.
//! - **Order**: on an agent of a model that some framework's unmet constrained shape accepts,
//!   those frameworks are served before the fair order (least dominant share first): their
//!   tasks can run nowhere else, the others' can. The fair order then shares the rest.
//! - **Reclaim** ([`Allocator::reclaim_for_models`]): when such a shape's count is not covered
//!   and every agent of its model is held in offers, offers that other frameworks hold there
//!   without a use for that model are rescinded, at most one per task's worth still wanted,
//!   best fit first; the next cycle offers the agent to the demander first. Only outstanding
//!   offers are taken, never what runs; never from a framework with its own unmet demand on
//!   that model; a role limit still caps what the demander is given. Mesos rescinds offers for
//!   quota the same way: an offer is a lease of idle resources, not an allocation.

use gantry_placement::GPU_MILLI;

use super::*;

/// The most distinct GPU models the allocator tells apart (one bit each). A GPU name that
/// comes later is not interned: its agents match no model-constrained shape (logged once by
/// the master).
pub const MAX_MODELS: usize = 64;

/// A set of interned GPU models, one bit each.
pub(super) type ModelMask = u64;

/// The mask of a shape that names no model: it fits any agent, with GPUs or not.
pub(super) const ANY_MODEL: ModelMask = u64::MAX;

impl Allocator {
    /// Sets the names of `agent`'s GPUs (as NVML reports them, e.g. `"NVIDIA H100 80GB
    /// HBM3"`): a shape naming a model is offered there only when one of them matches.
    /// Returns false when a name could not be interned (more than [`MAX_MODELS`] models).
    pub fn set_agent_gpu_models(&mut self, agent: AgentId, names: &[String]) -> bool {
        let Some(&a) = self.agent_ids.get(&agent) else {
            return true;
        };
        let mut mask: ModelMask = 0;
        let mut all = true;
        for n in names {
            match self.intern_model(n) {
                Some(i) => mask |= 1 << i,
                None => all = false,
            }
        }
        let ag = self.ag_mut(a);
        if ag.models != mask {
            ag.models = mask;
            ag.stable = None;
            self.epoch += 1;
        }
        all
    }

    fn intern_model(&mut self, name: &str) -> Option<usize> {
        let lower = name.trim().to_lowercase();
        if let Some(i) = self.gpu_models.iter().position(|m| **m == *lower) {
            return Some(i);
        }
        if self.gpu_models.len() == MAX_MODELS {
            return None;
        }
        self.gpu_models.push(lower.into());
        // Shapes declared before the model was known may accept it.
        self.remask_demands();
        Some(self.gpu_models.len() - 1)
    }

    /// The models a demand's `gpu_model` accepts ([`ANY_MODEL`] when it names none; no bit
    /// when no known model matches).
    pub(super) fn model_mask(&self, model: Option<&str>) -> ModelMask {
        let Some(m) = model.map(str::trim).filter(|m| !m.is_empty()) else {
            return ANY_MODEL;
        };
        let m = m.to_lowercase();
        let alternatives: Vec<&str> = m
            .split('|')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        let mut mask: ModelMask = 0;
        for (i, name) in self.gpu_models.iter().enumerate() {
            if alternatives.iter().any(|a| name.contains(a)) {
                mask |= 1 << i;
            }
        }
        mask
    }

    /// Recomputes every declared shape's model mask (a model was interned).
    fn remask_demands(&mut self) {
        for f in 0..self.fw_flags.len() as u32 {
            if self.fw_flags[f as usize] & FW_DEMAND == 0 {
                continue;
            }
            let Some(fw) = self.frameworks.get(f) else {
                continue;
            };
            let masks: Vec<ModelMask> = fw
                .demand_models
                .iter()
                .map(|m| self.model_mask(m.as_deref()))
                .collect();
            self.fw_mut(f).demand_masks = masks;
        }
    }

    /// Whether shape `shape` of framework `f` may be offered on agent `a`.
    pub(super) fn shape_fits_model(&self, f: u32, shape: usize, a: u32) -> bool {
        let mask = self.shape_mask(f, shape);
        mask == ANY_MODEL || mask & self.ag(a).models != 0
    }

    fn shape_mask(&self, f: u32, shape: usize) -> ModelMask {
        self.fw(f)
            .demand_masks
            .get(shape)
            .copied()
            .unwrap_or(ANY_MODEL)
    }

    /// The constrained shapes still wanted: `(framework, shape, tasks' worth missing)`.
    fn unmet_constrained(&self) -> Vec<(u32, usize, u64)> {
        let mut out = Vec::new();
        for f in 0..self.fw_flags.len() as u32 {
            if self.fw_flags[f as usize] & FW_DEMAND == 0 {
                continue;
            }
            let Some(fw) = self.frameworks.get(f) else {
                continue;
            };
            if fw.roles.iter().all(|r| r.out_of_order()) {
                continue;
            }
            for (s, (_, count)) in fw.demand.iter().enumerate() {
                let offered = fw.offered_tasks.get(s).copied().unwrap_or(0);
                if self.shape_mask(f, s) != ANY_MODEL && offered < *count {
                    out.push((f, s, count - offered));
                }
            }
        }
        out
    }

    /// Sets the cycle's model-first order: the frameworks with an unmet constrained shape,
    /// least dominant share first, and the models they want.
    pub(super) fn plan_model_first(&mut self) {
        self.model_first.clear();
        self.model_wanted = 0;
        if self.gpu_models.is_empty() {
            return;
        }
        let unmet = self.unmet_constrained();
        let mut first: Vec<(Share, u32)> = Vec::new();
        for (f, s, _) in unmet {
            self.model_wanted |= self.shape_mask(f, s);
            if !first.iter().any(|(_, x)| *x == f) {
                let share = self.share_of(&self.fw(f).alloc.total(), 1000);
                first.push((share, f));
            }
        }
        first.sort();
        self.model_first = first.into_iter().map(|(_, f)| f).collect();
    }

    /// A constrained task's worth on agent `a` for the first framework in the model-first
    /// order that wants one there.
    pub(super) fn find_model_first(&self, a: u32, now: Millis) -> Option<Candidate> {
        let agent = self.ag(a);
        if self.model_wanted & agent.models == 0 {
            return None;
        }
        let gpu_blocked = self.config.filter_gpu_resources && agent.gpu;
        for &f in &self.model_first {
            if gpu_blocked && self.fw_flags[f as usize] & FW_GPU == 0 {
                continue;
            }
            for role in &self.fw(f).roles {
                if role.out_of_order() {
                    continue;
                }
                let mut constrained = false;
                let avail = self.role_avail(role.role, a, &mut constrained);
                if avail.is_zero() {
                    continue;
                }
                if let Some(c) = self.demand_candidate(f, role.role, a, &avail, now, true) {
                    return Some(c);
                }
            }
        }
        None
    }

    /// Rescinds offers that frameworks hold, without a use for the model, on agents whose
    /// model an unmet constrained shape wants and where nothing free fits it (see the module
    /// docs). Returns the rescinded offers (their holders must be told).
    ///
    /// Nothing is taken for a framework that could not be given the agent after all (its
    /// decline filter there, its role at its limit, no GPU capability where it is needed): the
    /// holder would be offered it back every cycle.
    pub fn reclaim_for_models(&mut self, now: Millis) -> Vec<OfferRecord> {
        let mut out = Vec::new();
        if self.gpu_models.is_empty() || self.offers.len() == 0 {
            return out;
        }
        let unmet = self.unmet_constrained();
        if unmet.is_empty() {
            return out;
        }
        // (Expired filters go first, as in a cycle: one that ended no longer blocks.)
        self.expire_filters(now);
        // Frameworks wanting some model themselves: their offers there are not taken.
        let mut wants_model: HashMap<u32, ModelMask> = HashMap::default();
        for (f, s, _) in &unmet {
            *wants_model.entry(*f).or_default() |= self.shape_mask(*f, *s);
        }
        for (f, s, mut missing) in unmet {
            let mask = self.shape_mask(f, s);
            let task: Rv = self.fw(f).demand[s].0.clone();
            if !self.within_limits(f, &task) {
                continue;
            }
            let grant = Bundle {
                unres: task.clone(),
                resv: Vec::new(),
            };
            let gpu_capable = self.fw_flags[f as usize] & FW_GPU != 0;
            // Agents where a task's worth is free already: the cycle offers those first.
            for &a in &self.agent_order {
                let ag = self.ag(a);
                if missing == 0 {
                    break;
                }
                if ag.models & mask != 0 && !ag.inactive && self.fits_free(a, &task) {
                    missing -= 1;
                }
            }
            while missing > 0 {
                // The best fit: the held offer leaving the least GPU beside the task.
                let mut best: Option<(u64, OfferId)> = None;
                for &a in &self.agent_order {
                    let ag = self.ag(a);
                    if ag.models & mask == 0
                        || ag.inactive
                        || (ag.gpu && self.config.filter_gpu_resources && !gpu_capable)
                        || ag.filters.blocks(f, &grant, now, &self.refused)
                    {
                        continue;
                    }
                    for id in &ag.offers {
                        let Some(st) = self.offers.get(id) else {
                            continue;
                        };
                        if st.fw == f
                            || wants_model.get(&st.fw).is_some_and(|m| m & ag.models != 0)
                            || st.tasks.iter().any(|t| *t > 0)
                        {
                            continue;
                        }
                        let mut room = ag.free.total();
                        dense::add(&mut room, &st.bundle.total());
                        if !dense::contains(&room, &task) || !self.gpu_room(a, &task) {
                            continue;
                        }
                        let gpus = self.names.lookup("gpus").map_or(0, |g| dense::at(&room, g));
                        if best.is_none_or(|(b, _)| gpus < b) {
                            best = Some((gpus, *id));
                        }
                    }
                }
                let Some((_, id)) = best else {
                    break;
                };
                if let Some(st) = self.drop_offer(id) {
                    self.counters.rescinded += 1;
                    out.push(self.take_record(st));
                }
                missing -= 1;
            }
        }
        out
    }

    /// Whether one more task's worth of `task` stays within the limits of some role of
    /// framework `f` that is in its fair order (and of the role's ancestors).
    fn within_limits(&self, f: u32, task: &[u64]) -> bool {
        self.fw(f)
            .roles
            .iter()
            .filter(|r| !r.out_of_order())
            .any(|r| {
                self.chain(r.role).all(|n| {
                    let Some(limit) = &self.roles[n as usize].limit else {
                        return true;
                    };
                    let consumed = self.consumed(n);
                    task.iter().enumerate().all(|(i, t)| {
                        let l = limit.get(i).copied().unwrap_or(u64::MAX);
                        l == u64::MAX || dense::at(&consumed, i).saturating_add(*t) <= l
                    })
                })
            })
    }

    /// Whether a task's worth of `task` is free on agent `a` now (a fraction: on one GPU).
    fn fits_free(&self, a: u32, task: &[u64]) -> bool {
        dense::contains(&self.ag(a).free.total(), task) && self.gpu_room(a, task)
    }

    /// Whether the agent's GPUs have room for the task's GPUs outside other offers' earmarks
    /// (a fraction: on one GPU; whole GPUs: idle ones; true without GPUs or a per-GPU view).
    /// Only whether there is room, not where ([`Allocator::task_gpus`] chooses): this runs
    /// over every agent of a model each cycle while a shape of it is unmet.
    fn gpu_room(&self, a: u32, task: &[u64]) -> bool {
        let Some(g) = self.names.lookup("gpus") else {
            return true;
        };
        let milli = dense::at(task, g);
        if milli == 0 || self.ag(a).gpu_free.is_empty() {
            return true;
        }
        let mut free = self.unearmarked(a).map(u64::from);
        let whole = u64::from(GPU_MILLI);
        if milli >= whole {
            free.filter(|f| *f == whole).count() as u64 >= milli / whole
        } else {
            free.any(|f| f >= milli)
        }
    }
}
