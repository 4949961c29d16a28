//! The allocation cycle: the two stages (quota guarantees first, then fair shares) visiting
//! agents, choosing frameworks in fair order and granting offers.

use super::*;

impl Allocator {
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
        self.convert_min_allocatable();
        self.wanting = self.frameworks.values().filter(|fw| fw.wants()).count();
        self.needs = self.cycle_needs();
        self.plan_model_first();
        let mut out = Vec::with_capacity(self.last_cycle_offers);
        // What the quota stage grants on an agent is held and merged with what the fair-share
        // stage grants there: one offer per (framework, agent, role) per cycle.
        let mut held: Vec<(u32, Vec<Pending>)> = Vec::new();
        if self.any_guarantee {
            for i in 0..self.agent_order.len() {
                // Stage 1 ends as soon as no role with frameworks is below its guarantee (or
                // no framework wants more).
                if self.n_below == 0 || self.wanting == 0 {
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
            // Once no framework wants more (every demand covered, the rest suppressed or
            // paused), the agents left can offer nothing: only what the quota stage held is
            // still emitted.
            if self.wanting == 0 && held.peek().is_none() {
                break;
            }
            let a = self.agent_order[i];
            let mut pending = match held.next_if(|(x, _)| *x == a) {
                Some((_, p)) => p,
                None => {
                    let mut p = std::mem::take(&mut self.pending_buf);
                    p.clear();
                    p
                }
            };
            if self.wanting > 0 {
                self.visit(a, false, now, &mut pending);
            }
            self.emit(a, &mut pending, now, &mut out);
            self.pending_buf = pending;
        }
        self.last_cycle_offers = out.len();
        out
    }

    /// Grants on agent `a` in one stage, adding to the offers being assembled in `pending`.
    pub(super) fn visit(&mut self, a: u32, stage1: bool, now: Millis, pending: &mut Vec<Pending>) {
        let epoch = self.epoch;
        if self.offers.is_full() {
            return;
        }
        {
            let agent = self.ag_mut(a);
            if agent.stable == Some(epoch) || agent.inactive {
                return;
            }
            if agent.free.is_zero() {
                agent.stable = Some(epoch);
                return;
            }
        }
        {
            let agent = self.ag(a);
            // Nothing any framework that wants more needs fits here (not marked stable: the
            // needs are the cycle's).
            if let Some(needs) = &self.needs {
                let free = if agent.free.resv.is_empty() {
                    std::borrow::Cow::Borrowed(&agent.free.unres)
                } else {
                    std::borrow::Cow::Owned(agent.free.total())
                };
                if !needs.iter().any(|n| dense::contains(&free, n)) {
                    return;
                }
            }
        }
        self.counters.visits += 1;
        // Model-constrained tasks' worth first, on an agent of a model they want (`models`).
        if !stage1 && self.model_wanted != 0 {
            while let Some(c) = self.find_model_first(a, now) {
                self.grant(a, c, pending);
                if self.ag(a).free.is_zero() {
                    return;
                }
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

    /// What an agent must hold for some framework that wants more to be granted anything there
    /// (a necessary condition, checked before the fair-order walk): a declared demand's task,
    /// or one of a framework's minimum allocatable quantities. `None` when a framework that
    /// wants more takes anything, or when there are more than [`MAX_CYCLE_NEEDS`] distinct
    /// ones (checking them all on every agent would cost as much as the walk it saves).
    fn cycle_needs(&self) -> Option<Vec<Rv>> {
        let mut needs: Vec<Rv> = Vec::new();
        for fw in self.frameworks.values().filter(|fw| fw.wants()) {
            let shapes: Vec<&Rv> = fw.demand.iter().map(|(t, _)| t).collect();
            let quantities: Vec<&Rv> = if !shapes.is_empty() {
                shapes
            } else if !fw.min_rv.is_empty() {
                fw.min_rv.iter().collect()
            } else {
                return None;
            };
            for q in quantities {
                if !needs.contains(q) {
                    if needs.len() == MAX_CYCLE_NEEDS {
                        return None;
                    }
                    needs.push((*q).clone());
                }
            }
        }
        Some(needs)
    }

    /// Turns the offers assembled on agent `a` into outstanding offers.
    pub(super) fn emit(
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
            self.fw_mut(p.fw).offer_ids.insert(id);
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
                    gpus: p.gpus,
                },
            );
            self.counters.made += 1;
            out.push(rec);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn find(
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
    pub(super) fn role_avail(&self, r: u32, a: u32, constrained: &mut bool) -> Bundle {
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
    pub(super) fn has_owed_kind(&self, r: u32, avail: &Bundle) -> bool {
        let avail = avail.total();
        self.chain(r).filter(|n| self.below_guarantee(*n)).any(|n| {
            self.remaining_guarantee(n)
                .iter()
                .enumerate()
                .any(|(i, owed)| *owed > 0 && dense::at(&avail, i) > 0)
        })
    }

    pub(super) fn find_fw(
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
                if flags & FW_MIN != 0 && !self.holds_min(f, &avail) {
                    continue;
                }
                return Some(Candidate {
                    fw: f,
                    role: r,
                    grant: avail,
                    shape: None,
                    gpus: Vec::new(),
                });
            }
            if let Some(c) = self.demand_candidate(f, r, a, &avail, now, false) {
                return Some(c);
            }
        }
        None
    }

    /// A task's worth for framework `f` (with a declared demand) in role `r` out of `avail` on
    /// agent `a`: each declared shape still wanted, in order, the first whose task's worth
    /// fits (a shape naming a GPU model only on an agent of that model; with
    /// `constrained_only`, only such shapes).
    pub(super) fn demand_candidate(
        &self,
        f: u32,
        r: u32,
        a: u32,
        avail: &Bundle,
        now: Millis,
        constrained_only: bool,
    ) -> Option<Candidate> {
        let flags = self.fw_flags[f as usize];
        let agent = self.ag(a);
        let fw = self.fw(f);
        for (shape, (task, count)) in fw.demand.iter().enumerate() {
            if fw.offered_tasks.get(shape).copied().unwrap_or(0) >= *count {
                continue;
            }
            let constrained = fw
                .demand_masks
                .get(shape)
                .is_some_and(|m| *m != super::models::ANY_MODEL);
            if (constrained_only && !constrained) || !self.shape_fits_model(f, shape, a) {
                continue;
            }
            let Some(grant) = split_task(avail, task) else {
                continue;
            };
            if agent.filters.blocks(f, &grant, now, &self.refused) {
                continue;
            }
            if flags & FW_MIN != 0 && !self.holds_min(f, &grant) {
                continue;
            }
            // A fraction of one GPU needs one GPU with room, whole GPUs idle ones (gpus.rs).
            let Ok(gpus) = self.task_gpus(a, task) else {
                continue;
            };
            return Some(Candidate {
                fw: f,
                role: r,
                grant,
                shape: Some(shape),
                gpus,
            });
        }
        None
    }

    /// Converts the frameworks' minimum allocatable quantities again when resource names were
    /// added since (an agent with a new kind registered).
    fn convert_min_allocatable(&mut self) {
        if self.names.len() == self.min_names {
            return;
        }
        self.min_names = self.names.len();
        for f in 0..self.fw_flags.len() as u32 {
            if self.fw_flags[f as usize] & FW_MIN == 0 {
                continue;
            }
            let names = &self.names;
            if let Some(fw) = self.frameworks.get_mut(f) {
                fw.min_rv = names.try_rvs(&fw.min_allocatable);
            }
        }
    }

    /// Whether `offer` (all its pools together) holds one of framework `f`'s minimum
    /// allocatable quantities.
    fn holds_min(&self, f: u32, offer: &Bundle) -> bool {
        let total = offer.total();
        self.fw(f).min_rv.iter().any(|q| dense::contains(&total, q))
    }

    pub(super) fn grant(&mut self, a: u32, c: Candidate, pending: &mut Vec<Pending>) {
        self.earmark_gpus(a, &c.gpus);
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
                add_shape(&mut p.tasks, c.shape);
                p.gpus.extend_from_slice(&c.gpus);
                false
            }
            None => {
                let mut tasks = ShapeCounts::new();
                add_shape(&mut tasks, c.shape);
                pending.push(Pending {
                    fw: c.fw,
                    role: c.role,
                    bundle: c.grant.clone(),
                    tasks,
                    gpus: c.gpus,
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
        let fw = self.fw_mut(c.fw);
        let wanted = fw.wants();
        if let Some(shape) = c.shape {
            if fw.offered_tasks.len() <= shape {
                fw.offered_tasks.resize(shape + 1, 0);
            }
            fw.offered_tasks[shape] += 1;
        }
        if wanted && !fw.wants() {
            self.wanting = self.wanting.saturating_sub(1);
        }
        self.charge(c.fw, c.role, &c.grant, true);
    }
}

/// Distinct needs a cycle checks agents against before walking their frameworks
/// (`Allocator::cycle_needs`).
const MAX_CYCLE_NEEDS: usize = 32;

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
/// Counts one more task's worth of `shape` (if any) in per-shape `tasks`.
fn add_shape(tasks: &mut ShapeCounts, shape: Option<usize>) {
    if let Some(shape) = shape {
        if tasks.len() <= shape {
            tasks.resize(shape + 1, 0);
        }
        tasks[shape] += 1;
    }
}

/// The whole tasks' worth of each of `shapes` in `used`, counted greedily, larger shapes
/// first (what a large task used also holds small tasks' worth; the converse does not hold):
/// first at most `cap[i]` of shape `i` (the tasks' worth an offer was made for, when known),
/// then as many more as the rest holds. With one shape this is [`whole_tasks`] of `used`.
pub(super) fn split_whole_tasks(used: &[u64], shapes: &[Rv], cap: Option<&[u64]>) -> ShapeCounts {
    let mut left: Rv = Rv::from_slice(used);
    let mut out: ShapeCounts = shapes.iter().map(|_| 0).collect();
    let mut order: Vec<usize> = (0..shapes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(shapes[i].iter().sum::<u64>()));
    let take = |left: &mut Rv, i: usize, most: u64, out: &mut ShapeCounts| {
        let n = whole_tasks(left, &shapes[i]).min(most);
        if n > 0 {
            for (l, t) in left.iter_mut().zip(shapes[i].iter()) {
                *l = l.saturating_sub(t.saturating_mul(n));
            }
            out[i] += n;
        }
    };
    if let Some(cap) = cap {
        for &i in &order {
            take(&mut left, i, cap.get(i).copied().unwrap_or(0), &mut out);
        }
    }
    for &i in &order {
        take(&mut left, i, u64::MAX, &mut out);
    }
    out
}

pub(super) fn whole_tasks(used: &[u64], task: &[u64]) -> u64 {
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
