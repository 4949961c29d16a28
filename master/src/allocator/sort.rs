//! The role tree and the sort keys: interned resource vectors, exact dominant shares (DRF),
//! the per-role sorted sets of children and frameworks, and charging allocations up the tree.

use super::*;

impl Allocator {
    pub(super) fn rv(&mut self, r: &Resources) -> Rv {
        let v = self.names.rv(r);
        self.sync_names();
        v
    }

    pub(super) fn sync_names(&mut self) {
        while self.excluded.len() < self.names.len() {
            let i = self.excluded.len();
            let name = self.names.name(i).to_string();
            self.excluded.push(
                self.config.fairness_excluded_resources.contains(&name)
                    || NEVER_IN_SHARES.contains(&name.as_str()),
            );
        }
    }

    pub(super) fn recompute_share_total(&mut self) {
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
    pub(super) fn share_of(&self, v: &[u64], weight_milli: u64) -> Share {
        Share::dominant(v, &self.share_total, weight_milli)
    }

    pub(super) fn bundle(&mut self, r: &OfferResources) -> Bundle {
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
    pub(super) fn try_bundle(&self, r: &OfferResources) -> Option<Bundle> {
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
    pub(super) fn cached_offer_resources(&mut self, b: &Bundle) -> OfferResources {
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

    pub(super) fn offer_resources(&self, b: &Bundle) -> OfferResources {
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
    pub(super) fn role_index(&mut self, name: &str) -> u32 {
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

    pub(super) fn role_key(&self, r: u32) -> SortKey {
        let role = &self.roles[r as usize];
        SortKey {
            share: self.share_of(&role.alloc, weight_milli(role.weight)),
            offers: role.offers,
            prefix: name_prefix(&role.name),
            name: role.name.clone(),
            idx: r,
        }
    }

    pub(super) fn self_key(&self, r: u32) -> SortKey {
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
    pub(super) fn refresh_role_chain(&mut self, r: u32) {
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
    pub(super) fn refresh_sorted_singleton(&mut self, r: u32) {
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
    pub(super) fn refresh_fw_singleton(&mut self, r: u32) {
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

    pub(super) fn fw_key(&self, f: u32, ri: usize) -> SortKey {
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

    pub(super) fn refresh_fw_key(&mut self, f: u32, ri: usize) {
        let new = self.fw_key(f, ri);
        let fr = &mut self
            .frameworks
            .get_mut(f)
            .expect("allocator invariant: live framework slot")
            .roles[ri];
        if fr.key != new {
            if fr.out_of_order() {
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
    pub(super) fn rekey_all(&mut self) {
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
        for f in 0..self.frameworks.capacity() as u32 {
            if self.frameworks.get(f).is_none() {
                continue;
            }
            for ri in 0..self.fw(f).roles.len() {
                let key = self.fw_key(f, ri);
                let role = self.fw(f).roles[ri].role;
                if !self.fw(f).roles[ri].out_of_order() {
                    self.roles[role as usize].frameworks.insert(key.clone());
                }
                self.fw_mut(f).roles[ri].key = key;
            }
        }
        self.keys_stale = false;
    }

    pub(super) fn chain(&self, r: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(Some(r), move |n| self.roles[*n as usize].parent).filter(|n| *n != 0)
    }

    /// Changes an allocation (offered or in use) of framework `f` in role `role` by `b`.
    pub(super) fn charge(&mut self, f: u32, role: u32, b: &Bundle, add: bool) {
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

    pub(super) fn add_reserved_to_roles(&mut self, b: &Bundle, add: bool) {
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
}
