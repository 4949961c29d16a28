//! Decline filters of one agent, indexed by framework.
//!
//! A filter refuses a [`Bundle`]: unreserved resources and each role's reserved resources are
//! kept apart, so refusing unreserved resources does not refuse the same amounts reserved.
//!
//! Filters are kept as sorted parallel vectors (framework indices, then the filters inline). An
//! agent that collected many filters (e.g. thousands of frameworks that all declined it with a
//! long filter) also gets two bitsets over framework indices: "has a filter" and "has a filter
//! covering the agent's whole total". Then checking a framework during the allocation scan is a
//! bit test, with no search and no access to the filter data in the common case.

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::dense::{Bundle, VecMap};
use super::slab::Slab;
use super::Millis;

/// Refused resource bundles, interned and reference counted: declines tend to refuse the same
/// shapes over and over, and an agent can carry thousands of filters. Ids are keys of the
/// allocator's generic [`Slab`] (freed ids are reused).
#[derive(Debug, Default)]
pub(crate) struct RefusedPool {
    vecs: Slab<Refused>,
    map: FxHashMap<Bundle, u32>,
    /// What [`RefusedPool::get`] answers for an id no filter holds (never asked in practice).
    empty: Bundle,
}

/// One interned bundle and the filters that refer to it.
#[derive(Debug)]
struct Refused {
    bundle: Bundle,
    count: u32,
}

impl RefusedPool {
    /// The id of `v`, with one more reference.
    pub(crate) fn intern(&mut self, v: Bundle) -> u32 {
        if let Some(&id) = self.map.get(&v) {
            if let Some(r) = self.vecs.get_mut(id) {
                r.count += 1;
            }
            return id;
        }
        let id = self.vecs.insert(Refused {
            bundle: v.clone(),
            count: 1,
        });
        self.map.insert(v, id);
        id
    }

    /// Drops one reference.
    pub(crate) fn release(&mut self, id: u32) {
        let Some(r) = self.vecs.get_mut(id) else {
            return;
        };
        r.count = r.count.saturating_sub(1);
        if r.count == 0 {
            if let Some(r) = self.vecs.remove(id) {
                self.map.remove(&r.bundle);
            }
        }
    }

    /// The bundle of `id`.
    #[inline]
    pub(crate) fn get(&self, id: u32) -> &Bundle {
        self.vecs.get(id).map_or(&self.empty, |r| &r.bundle)
    }
}

/// A filter: refused resources (interned) until a time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Filter {
    pub(crate) refused: u32,
    pub(crate) expires: Millis,
    /// The refused resources cover the agent's whole total (set by [`AgentFilters`]).
    pub(crate) covers: bool,
}

/// From this many filtered frameworks on, the bitsets are kept.
const BITS_FROM: usize = 48;

/// The filters of one agent.
#[derive(Debug, Default)]
pub(crate) struct AgentFilters {
    map: VecMap<SmallVec<[Filter; 1]>>,
    /// Bit f: framework f has a filter (kept only when `bits_on`).
    any: Vec<u64>,
    /// Bit f: one of framework f's filters covers the agent's whole total.
    full: Vec<u64>,
    bits_on: bool,
}

fn set_bit(v: &mut Vec<u64>, i: u32, on: bool) {
    let (w, b) = ((i / 64) as usize, i % 64);
    if v.len() <= w {
        if !on {
            return;
        }
        v.resize(w + 1, 0);
    }
    if on {
        v[w] |= 1 << b;
    } else {
        v[w] &= !(1 << b);
    }
}

#[inline]
fn bit(v: &[u64], i: u32) -> bool {
    v.get((i / 64) as usize)
        .is_some_and(|w| w & (1 << (i % 64)) != 0)
}

impl AgentFilters {
    /// Frameworks with a filter here.
    pub(crate) fn frameworks(&self) -> impl Iterator<Item = &u32> {
        self.map.keys()
    }

    /// True when framework `f` has a filter here.
    pub(crate) fn has(&self, f: u32) -> bool {
        self.map.get(&f).is_some()
    }

    /// Drops every filter, releasing their refused vectors.
    pub(crate) fn clear(&mut self, pool: &mut RefusedPool) {
        for (_, list) in self.map.iter() {
            for x in list {
                pool.release(x.refused);
            }
        }
        *self = AgentFilters::default();
    }

    /// Adds a filter for framework `f`; `total` is the agent's current total.
    pub(crate) fn add(&mut self, f: u32, mut filter: Filter, total: &Bundle, pool: &RefusedPool) {
        let covers = pool.get(filter.refused).contains(total);
        filter.covers = covers;
        self.map.or_default(f).push(filter);
        if self.bits_on {
            set_bit(&mut self.any, f, true);
            if covers {
                set_bit(&mut self.full, f, true);
            }
        } else if self.map.len() >= BITS_FROM {
            self.rebuild(total, pool);
        }
    }

    /// Recomputes the bitsets (after the agent's total changed, or when turning them on).
    pub(crate) fn rebuild(&mut self, total: &Bundle, pool: &RefusedPool) {
        for list in self.map.values_mut() {
            for x in list.iter_mut() {
                x.covers = pool.get(x.refused).contains(total);
            }
        }
        self.any.clear();
        self.full.clear();
        self.bits_on = self.map.len() >= BITS_FROM;
        if !self.bits_on {
            return;
        }
        for (f, list) in self.map.iter() {
            set_bit(&mut self.any, *f, true);
            if list.iter().any(|x| pool.get(x.refused).contains(total)) {
                set_bit(&mut self.full, *f, true);
            }
        }
    }

    /// Drops all filters of framework `f`; true if it had any.
    pub(crate) fn remove(&mut self, f: u32, pool: &mut RefusedPool) -> bool {
        let removed = self.map.remove(&f);
        let had = removed.is_some();
        for x in removed.iter().flatten() {
            pool.release(x.refused);
        }
        if had && self.bits_on {
            set_bit(&mut self.any, f, false);
            set_bit(&mut self.full, f, false);
        }
        had
    }

    /// Drops framework `f`'s filters that expired at `now`. Returns (any dropped, none left).
    pub(crate) fn expire(
        &mut self,
        f: u32,
        now: Millis,
        total: &Bundle,
        pool: &mut RefusedPool,
    ) -> (bool, bool) {
        let Some(list) = self.map.get_mut(&f) else {
            return (false, false);
        };
        let before = list.len();
        list.retain(|x| {
            let keep = x.expires > now;
            if !keep {
                pool.release(x.refused);
            }
            keep
        });
        let changed = list.len() != before;
        if list.is_empty() {
            self.remove(f, pool);
            return (changed, true);
        }
        if changed && self.bits_on {
            let covers = list.iter().any(|x| pool.get(x.refused).contains(total));
            set_bit(&mut self.full, f, covers);
        }
        (changed, false)
    }

    /// True when an active filter of framework `f` covers `offer` (what would be offered).
    /// Filters that expired by `now` must have been dropped with [`AgentFilters::expire`]
    /// before (the allocation cycle does that first), so a "covers everything" bit is trusted.
    #[inline]
    pub(crate) fn blocks(&self, f: u32, offer: &Bundle, now: Millis, pool: &RefusedPool) -> bool {
        if self.bits_on {
            if !bit(&self.any, f) {
                return false;
            }
            if bit(&self.full, f) {
                return true;
            }
        } else if self.map.len() == 0 {
            return false;
        }
        self.map.get(&f).is_some_and(|list| {
            list.iter()
                .any(|x| x.expires > now && pool.get(x.refused).contains(offer))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rv(v: &[u64]) -> Bundle {
        Bundle {
            unres: v.iter().copied().collect(),
            resv: Vec::new(),
        }
    }

    #[test]
    fn small_and_large_filter_sets_agree() {
        let total = rv(&[10, 10]);
        let mut pool = RefusedPool::default();
        let mut small = AgentFilters::default();
        let mut large = AgentFilters::default();
        for f in 0..100u32 {
            let refused = if f % 3 == 0 {
                rv(&[10, 10])
            } else {
                rv(&[5, 5])
            };
            let expires = 100 + f as u64;
            if f < 10 {
                let filter = Filter {
                    refused: pool.intern(refused.clone()),
                    expires,
                    covers: false,
                };
                small.add(f, filter, &total, &pool);
            }
            let filter = Filter {
                refused: pool.intern(refused),
                expires,
                covers: false,
            };
            large.add(f, filter, &total, &pool);
        }
        assert_eq!(pool.vecs.len(), 2, "interned");
        assert!(large.bits_on && !small.bits_on);
        for f in 0..10u32 {
            for offer in [rv(&[10, 10]), rv(&[5, 5]), rv(&[6, 0])] {
                assert_eq!(
                    small.blocks(f, &offer, 50, &pool),
                    large.blocks(f, &offer, 50, &pool),
                    "f{f} {offer:?}"
                );
            }
        }
        assert!(large.blocks(3, &rv(&[10, 10]), 50, &pool));
        assert!(!large.blocks(4, &rv(&[10, 10]), 50, &pool));
        assert!(large.blocks(4, &rv(&[5, 5]), 50, &pool));
        assert!(!large.blocks(200, &rv(&[1, 1]), 50, &pool));
        // Expiry.
        assert_eq!(large.expire(3, 103, &total, &mut pool), (true, true));
        assert!(!large.blocks(3, &rv(&[1, 1]), 200, &pool));
        assert!(large.remove(6, &mut pool));
        assert!(!large.blocks(6, &rv(&[1, 1]), 50, &pool));
        // A bigger total: no filter covers it any more, but the partial check still works.
        large.rebuild(&rv(&[20, 20]), &pool);
        assert!(large.blocks(9, &rv(&[10, 10]), 50, &pool));
        assert!(!large.blocks(9, &rv(&[11, 10]), 50, &pool));
        large.clear(&mut pool);
        small.clear(&mut pool);
        assert!(pool.map.is_empty(), "every reference released");
        assert_eq!(pool.vecs.len(), 0, "every bundle freed");
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;
    use crate::allocator::dense::Rv;

    #[test]
    fn reserved_and_unreserved_are_refused_apart() {
        let mut pool = RefusedPool::default();
        let mut filters = AgentFilters::default();
        let mut total = Bundle {
            unres: Rv::from_slice(&[2000, 2048]),
            resv: Vec::new(),
        };
        total.add_resv(1, &[1000, 1024]);
        let refused = Bundle {
            unres: Rv::from_slice(&[2000, 2048]),
            resv: Vec::new(),
        };
        let filter = Filter {
            refused: pool.intern(refused),
            expires: 100,
            covers: false,
        };
        filters.add(7, filter, &total, &pool);
        let mut reserved = Bundle::default();
        reserved.add_resv(1, &[1000, 1024]);
        assert!(
            !filters.blocks(7, &reserved, 50, &pool),
            "reserved was not refused"
        );
        let unreserved = Bundle {
            unres: Rv::from_slice(&[1000, 1024]),
            resv: Vec::new(),
        };
        assert!(filters.blocks(7, &unreserved, 50, &pool));
        filters.clear(&mut pool);
    }
}
