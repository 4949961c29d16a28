//! Dense resource vectors used inside the allocator.
//!
//! Resource names are interned once ([`Names`]); inside the allocator an amount vector is a
//! `Vec<u64>` of milli-units indexed by the interned name. Vectors may be shorter than the number
//! of known names (a name interned later is simply absent, i.e. zero), so every helper treats a
//! missing index as zero. A [`Bundle`] is an unreserved vector plus one vector per reservation
//! role (role indices are the allocator's dense role indices).

use std::collections::HashMap;

use gantry_proto::Resources;
use smallvec::SmallVec;

/// Milli-unit amounts indexed by interned resource name (inline up to 6 kinds: no allocation
/// for the usual cpus/mem/disk/gpus).
pub(crate) type Rv = SmallVec<[u64; 6]>;

/// Amount at `i` (0 when absent).
#[inline]
pub(crate) fn at(v: &[u64], i: usize) -> u64 {
    v.get(i).copied().unwrap_or(0)
}

/// `a += b` (saturating).
pub(crate) fn add(a: &mut Rv, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_add(*y);
    }
}

/// `a -= b`, floored at zero.
pub(crate) fn sub(a: &mut Rv, b: &[u64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_sub(*y);
    }
}

/// True when `b` fits in `a`.
pub(crate) fn contains(a: &[u64], b: &[u64]) -> bool {
    b.iter().enumerate().all(|(i, y)| *y == 0 || at(a, i) >= *y)
}

/// True when every amount is zero.
pub(crate) fn is_zero(a: &[u64]) -> bool {
    a.iter().all(|x| *x == 0)
}

/// Element-wise minimum of `a` and `cap` written into `a` (`cap` missing = unlimited).
pub(crate) fn cap_to(a: &mut Rv, cap: &[u64]) {
    for (x, c) in a.iter_mut().zip(cap) {
        if *x > *c {
            *x = *c;
        }
    }
}

/// A dominant share as an exact fraction `num / den` of milli-unit amounts (`den > 0`). Shares
/// are compared by exact cross-multiplication (in 256 bits), so shares that are equal as
/// fractions are equal, whatever their floating-point renderings would say.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Share {
    num: u128,
    den: u128,
}

impl Share {
    /// Nothing allocated.
    pub(crate) const ZERO: Share = Share { num: 0, den: 1 };

    /// The largest `alloc[i] / total[i]` over kinds with a positive `total` (give excluded kinds
    /// a zero total), divided by the weight `weight_milli / 1000`.
    pub(crate) fn dominant(alloc: &[u64], total: &[u64], weight_milli: u64) -> Share {
        let mut best: Option<(u64, u64)> = None;
        for (i, a) in alloc.iter().enumerate() {
            let t = at(total, i);
            if *a == 0 || t == 0 {
                continue;
            }
            match best {
                Some((ba, bt)) if (*a as u128) * (bt as u128) <= (ba as u128) * (t as u128) => {}
                _ => best = Some((*a, t)),
            }
        }
        match best {
            None => Share::ZERO,
            Some((a, t)) => Share {
                num: a as u128 * 1000,
                den: t as u128 * weight_milli.max(1) as u128,
            },
        }
    }
}

/// `a * b` as (high, low) 128-bit halves.
fn mul_wide(a: u128, b: u128) -> (u128, u128) {
    const M: u128 = u64::MAX as u128;
    let (a1, a0, b1, b0) = (a >> 64, a & M, b >> 64, b & M);
    let (p00, p01, p10, p11) = (a0 * b0, a0 * b1, a1 * b0, a1 * b1);
    let mid = (p00 >> 64) + (p01 & M) + (p10 & M);
    let lo = (p00 & M) | (mid << 64);
    let hi = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
    (hi, lo)
}

impl Ord for Share {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if self.den == other.den {
            return self.num.cmp(&other.num);
        }
        // Products of 64-bit factors fit in 128 bits (the usual case: amounts in milli-units
        // times 1000 stay far below 2^64).
        if (self.num | self.den | other.num | other.den) >> 64 == 0 {
            return (self.num * other.den).cmp(&(other.num * self.den));
        }
        mul_wide(self.num, other.den).cmp(&mul_wide(other.num, self.den))
    }
}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Share {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Share {}

/// A small map from dense indices to values, kept as sorted parallel vectors (the key vector is
/// searched; values are touched only on a hit). Cache friendly for the few entries an agent
/// usually has, e.g. its decline filters per framework.
#[derive(Debug, Clone)]
pub(crate) struct VecMap<V> {
    keys: Vec<u32>,
    values: Vec<V>,
}

impl<V> Default for VecMap<V> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            values: Vec::new(),
        }
    }
}

impl<V: Default> VecMap<V> {
    /// The value of `k`.
    #[inline]
    pub(crate) fn get(&self, k: &u32) -> Option<&V> {
        if self.keys.is_empty() {
            return None;
        }
        self.keys.binary_search(k).ok().map(|i| &self.values[i])
    }

    /// The value of `k`, mutable.
    pub(crate) fn get_mut(&mut self, k: &u32) -> Option<&mut V> {
        match self.keys.binary_search(k) {
            Ok(i) => Some(&mut self.values[i]),
            Err(_) => None,
        }
    }

    /// The value of `k`, inserted as default if absent.
    pub(crate) fn or_default(&mut self, k: u32) -> &mut V {
        let i = match self.keys.binary_search(&k) {
            Ok(i) => i,
            Err(i) => {
                self.keys.insert(i, k);
                self.values.insert(i, V::default());
                i
            }
        };
        &mut self.values[i]
    }

    /// Removes `k`.
    pub(crate) fn remove(&mut self, k: &u32) -> Option<V> {
        match self.keys.binary_search(k) {
            Ok(i) => {
                self.keys.remove(i);
                Some(self.values.remove(i))
            }
            Err(_) => None,
        }
    }

    /// Keys in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &u32> {
        self.keys.iter()
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Values, mutable, in key order.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.values.iter_mut()
    }

    /// (key, value) pairs in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u32, &V)> {
        self.keys.iter().zip(self.values.iter())
    }
}

/// Interned resource names.
#[derive(Debug, Default, Clone)]
pub(crate) struct Names {
    list: Vec<String>,
    map: HashMap<String, usize>,
}

impl Names {
    /// The index of `name`, interning it if new.
    pub(crate) fn intern(&mut self, name: &str) -> usize {
        if let Some(i) = self.map.get(name) {
            return *i;
        }
        let i = self.list.len();
        self.list.push(name.to_string());
        self.map.insert(name.to_string(), i);
        i
    }

    /// The index of `name` if it was interned.
    pub(crate) fn lookup(&self, name: &str) -> Option<usize> {
        self.map.get(name).copied()
    }

    /// Number of interned names.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The name at `i`.
    pub(crate) fn name(&self, i: usize) -> &str {
        &self.list[i]
    }

    /// Converts, interning unknown names.
    pub(crate) fn rv(&mut self, r: &Resources) -> Rv {
        let mut v = Rv::new();
        for (name, milli) in r.iter() {
            let i = self.intern(name);
            if v.len() <= i {
                v.resize(i + 1, 0);
            }
            v[i] = milli;
        }
        v
    }

    /// Converts without interning; `None` if `r` names a resource never seen (non-zero).
    pub(crate) fn try_rv(&self, r: &Resources) -> Option<Rv> {
        let mut v = Rv::new();
        for (name, milli) in r.iter() {
            let i = self.lookup(name)?;
            if v.len() <= i {
                v.resize(i + 1, 0);
            }
            v[i] = milli;
        }
        Some(v)
    }

    /// [`Names::try_rv`] of each, leaving out those that name a resource never seen.
    pub(crate) fn try_rvs(&self, rs: &[Resources]) -> Vec<Rv> {
        rs.iter().filter_map(|r| self.try_rv(r)).collect()
    }

    /// Converts back to named resources.
    pub(crate) fn res(&self, v: &[u64]) -> Resources {
        let mut r = Resources::new();
        for (i, m) in v.iter().enumerate() {
            if *m > 0 {
                r.set_milli(&self.list[i], *m);
            }
        }
        r
    }
}

/// Unreserved amounts plus reserved amounts per (dense) role index, sorted by role, no empty
/// reservation entries.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Bundle {
    pub(crate) unres: Rv,
    pub(crate) resv: Vec<(u32, Rv)>,
}

impl Bundle {
    /// Unreserved plus every reservation.
    pub(crate) fn total(&self) -> Rv {
        let mut t = self.unres.clone();
        for (_, r) in &self.resv {
            add(&mut t, r);
        }
        t
    }

    /// True when empty.
    pub(crate) fn is_zero(&self) -> bool {
        is_zero(&self.unres) && self.resv.iter().all(|(_, r)| is_zero(r))
    }

    /// The reservation of `role` (empty slice when none).
    pub(crate) fn resv_of(&self, role: u32) -> &[u64] {
        match self.resv.binary_search_by_key(&role, |(r, _)| *r) {
            Ok(i) => &self.resv[i].1,
            Err(_) => &[],
        }
    }

    fn resv_mut(&mut self, role: u32) -> &mut Rv {
        match self.resv.binary_search_by_key(&role, |(r, _)| *r) {
            Ok(i) => &mut self.resv[i].1,
            Err(i) => {
                self.resv.insert(i, (role, Rv::new()));
                &mut self.resv[i].1
            }
        }
    }

    /// Adds `amount` to the reservation of `role`.
    pub(crate) fn add_resv(&mut self, role: u32, amount: &[u64]) {
        if is_zero(amount) {
            return;
        }
        add(self.resv_mut(role), amount);
    }

    /// `self += other`.
    pub(crate) fn add(&mut self, other: &Bundle) {
        add(&mut self.unres, &other.unres);
        for (role, r) in &other.resv {
            self.add_resv(*role, r);
        }
    }

    /// `self -= other`, floored at zero per pool.
    pub(crate) fn sub(&mut self, other: &Bundle) {
        sub(&mut self.unres, &other.unres);
        for (role, r) in &other.resv {
            if let Ok(i) = self.resv.binary_search_by_key(role, |(x, _)| *x) {
                sub(&mut self.resv[i].1, r);
            }
        }
        self.resv.retain(|(_, r)| !is_zero(r));
    }

    /// True when every pool of `other` fits in the same pool of `self`.
    pub(crate) fn contains(&self, other: &Bundle) -> bool {
        contains(&self.unres, &other.unres)
            && other
                .resv
                .iter()
                .all(|(role, r)| contains(self.resv_of(*role), r))
    }

    /// The pool-wise minimum of `self` and `other`.
    pub(crate) fn min(&self, other: &Bundle) -> Bundle {
        let mut out = Bundle {
            unres: self
                .unres
                .iter()
                .enumerate()
                .map(|(i, x)| (*x).min(at(&other.unres, i)))
                .collect(),
            resv: Vec::new(),
        };
        for (role, r) in &self.resv {
            let o = other.resv_of(*role);
            let m: Rv = r
                .iter()
                .enumerate()
                .map(|(i, x)| (*x).min(at(o, i)))
                .collect();
            out.add_resv(*role, &m);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_of_different_lengths_mix() {
        let mut a: Rv = Rv::from_slice(&[5]);
        add(&mut a, &[1, 2]);
        assert_eq!(&a[..], &[6, 2]);
        assert!(contains(&a, &[6]));
        assert!(!contains(&a, &[0, 0, 1]));
        assert!(contains(&a, &[0, 0, 0]));
        sub(&mut a, &[10]);
        assert_eq!(&a[..], &[0, 2]);
        let mut c: Rv = Rv::from_slice(&[3, 9]);
        cap_to(&mut c, &[1]);
        assert_eq!(&c[..], &[1, 9]);
    }

    #[test]
    fn bundles_keep_pools_apart() {
        let mut b = Bundle {
            unres: Rv::from_slice(&[4, 0]),
            resv: vec![],
        };
        b.add_resv(2, &[1]);
        b.add_resv(1, &[0, 3]);
        assert_eq!(
            b.resv.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(&b.total()[..], &[5, 3]);
        let small = Bundle {
            unres: Rv::from_slice(&[1]),
            resv: vec![(2, Rv::from_slice(&[1]))],
        };
        assert!(b.contains(&small));
        let wrong_pool = Bundle {
            unres: Rv::new(),
            resv: vec![(3, Rv::from_slice(&[1]))],
        };
        assert!(!b.contains(&wrong_pool));
        b.sub(&small);
        assert_eq!(b.resv.len(), 1);
        assert_eq!(&b.unres[..], &[3, 0]);
    }

    #[test]
    fn shares_compare_exactly() {
        // 1000/3000 and 1536000/4608000 are both exactly 1/3 (as floats they may differ).
        let a = Share::dominant(&[1000, 1_536_000], &[3000, 4_608_000], 1000);
        let b = Share::dominant(&[1000, 1_024_000], &[3000, 4_608_000], 1000);
        assert_eq!(a, b);
        assert!(Share::dominant(&[1001], &[3000], 1000) > a);
        // Weight 3: a third of the share; the weight applies to the dominant kind.
        assert_eq!(
            Share::dominant(&[3000, 0], &[3000, 10], 3000),
            Share::dominant(&[1000], &[3000], 1000)
        );
        // Excluded kinds have a zero total; nothing allocated is zero.
        assert_eq!(Share::dominant(&[5, 0], &[0, 10], 1000), Share::ZERO);
        // Large amounts do not overflow the comparison.
        let big = Share::dominant(&[u64::MAX - 1], &[u64::MAX], 1);
        let bigger = Share::dominant(&[u64::MAX], &[u64::MAX], 1);
        assert!(big < bigger);
        assert_eq!(mul_wide(u128::MAX, 2), (1, u128::MAX - 1));
        // The 64-bit fast path and the wide path agree.
        let small = Share { num: 3, den: 9 };
        let wide = Share {
            num: 1 << 70,
            den: 3 << 70,
        };
        assert_eq!(small, wide);
        assert!(Share { num: 4, den: 9 } > wide);
    }
}
