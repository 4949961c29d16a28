//! Quota: guarantees (and their nesting), limits and the headroom still owed to guarantees.

use super::*;

impl Allocator {
    pub(super) fn consumed(&self, r: u32) -> Rv {
        let role = &self.roles[r as usize];
        let mut c = role.alloc_unres.clone();
        dense::add(&mut c, &role.reserved);
        c
    }

    pub(super) fn remaining_guarantee(&self, r: u32) -> Rv {
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
    pub(super) fn below_guarantee(&self, r: u32) -> bool {
        self.below.get(r as usize).copied().unwrap_or(false)
    }

    pub(super) fn set_below(&mut self, r: u32) {
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
    pub(super) fn top_guaranteed(&self, r: u32) -> bool {
        self.roles[r as usize].guarantee.is_some()
            && self
                .chain(r)
                .skip(1)
                .all(|n| self.roles[n as usize].guarantee.is_none())
    }

    pub(super) fn recompute_required(&mut self) {
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

    /// A role's quota as [`Allocator::set_quota`] took it: (guarantee, limit), `None` for a
    /// part it does not have (and for a role the allocator does not know).
    pub fn quota(&self, role: &str) -> (Option<Resources>, Option<ResourceLimits>) {
        let Some(r) = self.role_ids.get(role).copied().filter(|r| *r != 0) else {
            return (None, None);
        };
        let role = &self.roles[r as usize];
        let guarantee = role.guarantee.as_ref().map(|g| self.names.res(g));
        let limit = role.limit.as_ref().map(|l| {
            let mut out = ResourceLimits::new();
            for (j, x) in l.iter().enumerate() {
                if *x != u64::MAX {
                    out.set_milli(self.names.name(j), *x);
                }
            }
            out
        });
        (guarantee, limit)
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
    pub(super) fn check_nested_guarantee(
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
}
