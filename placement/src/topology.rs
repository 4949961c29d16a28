//! Topology-aware GPU assignment (pure).
//!
//! When a task asks for `k` GPUs, [`assign`] picks `k` free healthy GPUs so that future
//! multi-GPU tasks stay placeable. Candidate choices are compared, in order, by:
//!
//! 1. the number of NUMA nodes they span (fewer is better);
//! 2. the number of local groups (same NUMA node and PCI root) they span (fewer is better);
//! 3. what stays free per NUMA node afterwards, largest first, compared lexicographically
//!    (bigger is better) — so the largest free local group is not broken up when a smaller one
//!    fits (best fit);
//! 4. the same for local groups;
//! 5. lowest GPU indices (determinism).
//!
//! GPUs within a local group are interchangeable, so the search enumerates how many GPUs to take
//! from each group (not every subset), and drops a partial choice as soon as it spans more NUMA
//! nodes and groups than the best complete one. Its work is bounded: past the bound (hosts
//! with very many groups) it falls back to a greedy best fit, so one call costs microseconds
//! on real hosts and well under a millisecond on the largest one an agent may register (256
//! GPUs, each its own group).

use std::cmp::Reverse;
use std::collections::BTreeMap;

/// One GPU as assignment sees it (the slice index is the GPU's identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSlot {
    /// The NUMA node; `None` when unknown (all such GPUs count as one node).
    pub numa_node: Option<u32>,
    /// The PCI root (host bridge / root port); `None` when unknown.
    pub pci_root: Option<String>,
    /// Not failed (a failed GPU is never picked).
    pub healthy: bool,
    /// Not assigned to a running task (and, for the caller, eligible for this one).
    pub free: bool,
}

type GroupKey = (Option<u32>, Option<String>);

struct Group {
    numa: usize,
    members: Vec<usize>,
}

/// The score of a choice; smaller is better.
type Score = (
    usize,
    usize,
    Reverse<Vec<usize>>,
    Reverse<Vec<usize>>,
    Vec<usize>,
);

/// Bound on the search's work before the greedy fallback: one unit per search node, one per
/// group for each complete choice scored. Hosts of up to 16 GPUs in up to 8 local groups
/// stay below it (a test checks); a host of 256 GPUs in 256 groups reaches it in a fraction
/// of a millisecond. The master runs this on its core loop for every whole-GPU task, so an
/// agent's topology must not be able to stall it.
const WORK_LIMIT: usize = 20_000;

/// Picks `k` GPUs among the free healthy `gpus`; returns their indices (ascending), or `None`
/// when fewer than `k` are available.
pub fn assign(gpus: &[GpuSlot], k: usize) -> Option<Vec<usize>> {
    let available: Vec<usize> = (0..gpus.len())
        .filter(|&i| gpus[i].free && gpus[i].healthy)
        .collect();
    if available.len() < k {
        return None;
    }
    if k == 0 {
        return Some(Vec::new());
    }
    let (groups, numa_count) = group(gpus, &available);
    let take = exact(&groups, numa_count, k).unwrap_or_else(|| greedy(&groups, numa_count, k));
    let mut out: Vec<usize> = groups
        .iter()
        .zip(&take)
        .flat_map(|(g, &t)| g.members[..t].iter().copied())
        .collect();
    out.sort_unstable();
    Some(out)
}

/// The `available` GPUs by local group (NUMA node, PCI root), with the number of NUMA nodes.
fn group(gpus: &[GpuSlot], available: &[usize]) -> (Vec<Group>, usize) {
    let mut by_key: BTreeMap<GroupKey, Vec<usize>> = BTreeMap::new();
    for &i in available {
        by_key
            .entry((gpus[i].numa_node, gpus[i].pci_root.clone()))
            .or_default()
            .push(i);
    }
    let numas: Vec<Option<u32>> = {
        let mut v: Vec<Option<u32>> = by_key.keys().map(|k| k.0).collect();
        v.dedup();
        v
    };
    let groups = by_key
        .into_iter()
        .map(|((numa, _), members)| Group {
            numa: numas.iter().position(|n| *n == numa).unwrap_or(0),
            members,
        })
        .collect();
    (groups, numas.len())
}

/// The best takes per group, or `None` when the search's work passed [`WORK_LIMIT`].
fn exact(groups: &[Group], numa_count: usize, k: usize) -> Option<Vec<usize>> {
    let mut rest = vec![0; groups.len() + 1];
    for i in (0..groups.len()).rev() {
        rest[i] = rest[i + 1] + groups[i].members.len();
    }
    let mut search = Search {
        groups,
        numa_count,
        rest,
        take: vec![0; groups.len()],
        numa_groups: vec![0; numa_count],
        spans: (0, 0),
        best: None,
        work: 0,
    };
    search.dfs(0, k);
    match search.best {
        Some((_, take)) if search.work <= WORK_LIMIT => Some(take),
        _ => None,
    }
}

struct Search<'a> {
    groups: &'a [Group],
    numa_count: usize,
    /// `rest[i]`: the free GPUs of groups `i..`.
    rest: Vec<usize>,
    take: Vec<usize>,
    /// Per NUMA node, how many of its groups the partial choice takes from.
    numa_groups: Vec<usize>,
    /// NUMA nodes and groups the partial choice spans (the score's first two terms).
    spans: (usize, usize),
    best: Option<(Score, Vec<usize>)>,
    work: usize,
}

impl Search<'_> {
    fn dfs(&mut self, i: usize, remaining: usize) {
        self.work += 1;
        if self.work > WORK_LIMIT {
            return;
        }
        // Spans only grow deeper down: a partial choice already spanning more than the best
        // complete one cannot beat it.
        if let Some((b, _)) = &self.best {
            if self.spans > (b.0, b.1) {
                return;
            }
        }
        if remaining == 0 {
            self.work += self.groups.len();
            let s = score(self.groups, self.numa_count, &self.take);
            let better = match &self.best {
                Some((b, _)) => s < *b,
                None => true,
            };
            if better {
                self.best = Some((s, self.take.clone()));
            }
            return;
        }
        if i == self.groups.len() {
            return;
        }
        let numa = self.groups[i].numa;
        let max = self.groups[i].members.len().min(remaining);
        let min = remaining.saturating_sub(self.rest[i + 1]);
        for t in (min..=max).rev() {
            self.take[i] = t;
            let saved = self.spans;
            if t > 0 {
                self.spans.1 += 1;
                if self.numa_groups[numa] == 0 {
                    self.spans.0 += 1;
                }
                self.numa_groups[numa] += 1;
            }
            self.dfs(i + 1, remaining - t);
            if t > 0 {
                self.numa_groups[numa] -= 1;
            }
            self.spans = saved;
        }
        self.take[i] = 0;
    }
}

fn score(groups: &[Group], numa_count: usize, take: &[usize]) -> Score {
    let mut numa_taken = vec![false; numa_count];
    let mut numa_left = vec![0usize; numa_count];
    let mut group_left = Vec::with_capacity(groups.len());
    let mut spans = 0;
    let mut chosen = Vec::new();
    for (g, &t) in groups.iter().zip(take) {
        if t > 0 {
            numa_taken[g.numa] = true;
            spans += 1;
            chosen.extend_from_slice(&g.members[..t]);
        }
        numa_left[g.numa] += g.members.len() - t;
        group_left.push(g.members.len() - t);
    }
    numa_left.sort_unstable_by(|a, b| b.cmp(a));
    group_left.sort_unstable_by(|a, b| b.cmp(a));
    chosen.sort_unstable();
    let numa_span = numa_taken.iter().filter(|t| **t).count();
    (
        numa_span,
        spans,
        Reverse(numa_left),
        Reverse(group_left),
        chosen,
    )
}

/// Best fit without search: the smallest NUMA node that fits `k` (else the largest nodes
/// first), and within it the smallest groups that fit (else the largest first).
fn greedy(groups: &[Group], numa_count: usize, k: usize) -> Vec<usize> {
    let mut numa_free = vec![0usize; numa_count];
    for g in groups {
        numa_free[g.numa] += g.members.len();
    }
    let mut numa_order: Vec<usize> = (0..numa_count).collect();
    match (0..numa_count)
        .filter(|&n| numa_free[n] >= k)
        .min_by_key(|&n| (numa_free[n], n))
    {
        Some(n) => numa_order = vec![n],
        None => numa_order.sort_by_key(|&n| (Reverse(numa_free[n]), n)),
    }
    let mut take = vec![0; groups.len()];
    let mut remaining = k;
    for n in numa_order {
        let mut idx: Vec<usize> = (0..groups.len()).filter(|&i| groups[i].numa == n).collect();
        match idx
            .iter()
            .copied()
            .filter(|&i| groups[i].members.len() >= remaining)
            .min_by_key(|&i| (groups[i].members.len(), i))
        {
            Some(i) => idx = vec![i],
            None => idx.sort_by_key(|&i| (Reverse(groups[i].members.len()), i)),
        }
        for i in idx {
            let t = groups[i].members.len().min(remaining);
            take[i] = t;
            remaining -= t;
            if remaining == 0 {
                return take;
            }
        }
    }
    take
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn slot(numa: u32, root: &str) -> GpuSlot {
        GpuSlot {
            numa_node: Some(numa),
            pci_root: Some(root.to_string()),
            healthy: true,
            free: true,
        }
    }

    #[test]
    fn two_of_four_on_one_numa_node() {
        let gpus = vec![slot(0, "a"), slot(0, "a"), slot(1, "b"), slot(1, "b")];
        let got = assign(&gpus, 2).unwrap();
        assert_eq!(got, vec![0, 1]);
        // With GPU 1 busy, the only same-node pair is on node 1.
        let mut busy = gpus.clone();
        busy[1].free = false;
        assert_eq!(assign(&busy, 2).unwrap(), vec![2, 3]);
        // Unhealthy GPUs are never picked.
        busy[2].healthy = false;
        assert_eq!(assign(&busy, 2).unwrap(), vec![0, 3]);
        assert_eq!(assign(&busy, 3), None);
    }

    #[test]
    fn does_not_break_the_largest_group() {
        // Node 0 has 4 free, node 1 has 2 free: a 2-GPU task goes to node 1.
        let gpus = vec![
            slot(0, "a"),
            slot(0, "a"),
            slot(0, "a"),
            slot(0, "a"),
            slot(1, "b"),
            slot(1, "b"),
        ];
        assert_eq!(assign(&gpus, 2).unwrap(), vec![4, 5]);
        // A 1-GPU task too.
        assert_eq!(assign(&gpus, 1).unwrap(), vec![4]);
        // A 3-GPU task must use node 0.
        assert_eq!(assign(&gpus, 3).unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn prefers_one_pci_root_within_a_node() {
        let gpus = vec![
            slot(0, "a"),
            slot(0, "b"),
            slot(0, "b"),
            slot(0, "c"),
            slot(0, "c"),
            slot(0, "c"),
        ];
        assert_eq!(assign(&gpus, 2).unwrap(), vec![1, 2]);
        assert_eq!(assign(&gpus, 3).unwrap(), vec![3, 4, 5]);
        assert_eq!(assign(&gpus, 1).unwrap(), vec![0]);
    }

    #[test]
    fn spans_nodes_only_when_needed() {
        let gpus = vec![
            slot(0, "a"),
            slot(0, "a"),
            slot(1, "b"),
            slot(1, "b"),
            slot(1, "b"),
        ];
        let got = assign(&gpus, 4).unwrap();
        // Both ways of spanning the two nodes leave one GPU free: lowest indices win.
        assert_eq!(got, vec![0, 1, 2, 3]);
        let mut gpus = gpus;
        gpus.push(slot(1, "b"));
        // Node 1 (4 free) holds the task alone.
        assert_eq!(assign(&gpus, 4).unwrap(), vec![2, 3, 4, 5]);
        assert_eq!(assign(&gpus, 0), Some(vec![]));
        assert_eq!(assign(&gpus, 7), None);
    }

    #[test]
    fn unknown_topology_is_one_group() {
        let gpus: Vec<GpuSlot> = (0..4)
            .map(|_| GpuSlot {
                numa_node: None,
                pci_root: None,
                healthy: true,
                free: true,
            })
            .collect();
        assert_eq!(assign(&gpus, 3).unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn greedy_fallback_is_valid() {
        let groups = vec![
            Group {
                numa: 0,
                members: vec![0],
            },
            Group {
                numa: 0,
                members: vec![1, 2],
            },
            Group {
                numa: 1,
                members: vec![3, 4, 5],
            },
        ];
        assert_eq!(greedy(&groups, 2, 2), vec![0, 2, 0]);
        assert_eq!(greedy(&groups, 2, 3), vec![1, 2, 0]);
        assert_eq!(greedy(&groups, 2, 1), vec![1, 0, 0]);
        assert_eq!(greedy(&groups, 2, 5).iter().sum::<usize>(), 5);
    }

    /// Every task size on hosts of up to 16 GPUs in up to 8 local groups is searched exactly
    /// (the work bound is not reached); the largest host an agent may register is not, and
    /// still gets a valid answer.
    #[test]
    fn the_work_bound_spares_real_hosts_and_caps_huge_ones() {
        let hosts: [(&str, Vec<GpuSlot>); 3] = [
            (
                "8 GPUs, 2 nodes x 4 roots",
                (0..8)
                    .map(|i| slot(i / 4, &format!("r{}", i / 2)))
                    .collect(),
            ),
            (
                "16 GPUs, 2 nodes x 8 roots",
                (0..16)
                    .map(|i| slot(i / 8, &format!("r{}", i / 2)))
                    .collect(),
            ),
            (
                "16 GPUs, 4 nodes x 8 roots",
                (0..16)
                    .map(|i| slot(i / 4, &format!("r{}", i / 2)))
                    .collect(),
            ),
        ];
        for (name, gpus) in &hosts {
            let all: Vec<usize> = (0..gpus.len()).collect();
            let (groups, numas) = group(gpus, &all);
            for k in 1..=gpus.len() {
                assert!(exact(&groups, numas, k).is_some(), "{name}, k = {k}");
            }
        }
        let huge: Vec<GpuSlot> = (0..256).map(|i| slot(i, &format!("r{i}"))).collect();
        let all: Vec<usize> = (0..256).collect();
        let (groups, numas) = group(&huge, &all);
        assert!(exact(&groups, numas, 8).is_none(), "256 groups: greedy");
        let got = assign(&huge, 8).unwrap();
        assert_eq!(got.len(), 8);
    }

    fn arb_gpus() -> impl Strategy<Value = Vec<GpuSlot>> {
        prop::collection::vec(
            (
                prop::option::of(0u32..3),
                prop::option::of(0u8..3),
                prop::bool::weighted(0.9),
                prop::bool::weighted(0.8),
            ),
            0..10,
        )
        .prop_map(|v| {
            v.into_iter()
                .map(|(n, r, healthy, free)| GpuSlot {
                    numa_node: n,
                    pci_root: r.map(|r| format!("root{r}")),
                    healthy,
                    free,
                })
                .collect()
        })
    }

    /// Brute-force score of a set, as [`score`] computes it for group takes.
    fn subset_score(
        gpus: &[GpuSlot],
        set: &[usize],
    ) -> (usize, usize, Reverse<Vec<usize>>, Reverse<Vec<usize>>) {
        let avail: Vec<usize> = (0..gpus.len())
            .filter(|&i| gpus[i].free && gpus[i].healthy)
            .collect();
        let mut numa: BTreeMap<Option<u32>, (usize, bool)> = BTreeMap::new();
        let mut grp: BTreeMap<GroupKey, (usize, bool)> = BTreeMap::new();
        for &i in &avail {
            let chosen = set.contains(&i);
            let e = numa.entry(gpus[i].numa_node).or_default();
            e.0 += usize::from(!chosen);
            e.1 |= chosen;
            let e = grp
                .entry((gpus[i].numa_node, gpus[i].pci_root.clone()))
                .or_default();
            e.0 += usize::from(!chosen);
            e.1 |= chosen;
        }
        let mut nl: Vec<usize> = numa.values().map(|v| v.0).collect();
        let mut gl: Vec<usize> = grp.values().map(|v| v.0).collect();
        nl.sort_unstable_by(|a, b| b.cmp(a));
        gl.sort_unstable_by(|a, b| b.cmp(a));
        (
            numa.values().filter(|v| v.1).count(),
            grp.values().filter(|v| v.1).count(),
            Reverse(nl),
            Reverse(gl),
        )
    }

    proptest! {
        #[test]
        fn assignment_is_valid_and_optimal(gpus in arb_gpus(), k in 0usize..6) {
            let avail: Vec<usize> = (0..gpus.len()).filter(|&i| gpus[i].free && gpus[i].healthy).collect();
            let got = assign(&gpus, k);
            prop_assert_eq!(got.is_some(), avail.len() >= k);
            let Some(got) = got else { return Ok(()) };
            prop_assert_eq!(got.len(), k);
            let mut dedup = got.clone();
            dedup.dedup();
            prop_assert_eq!(dedup.len(), k);
            for &i in &got {
                prop_assert!(gpus[i].free && gpus[i].healthy);
            }
            // Same NUMA node whenever one node can hold the task.
            let mut per_node: BTreeMap<Option<u32>, usize> = BTreeMap::new();
            for &i in &avail { *per_node.entry(gpus[i].numa_node).or_default() += 1; }
            if k > 0 && per_node.values().any(|&c| c >= k) {
                let nodes: std::collections::BTreeSet<_> = got.iter().map(|&i| gpus[i].numa_node).collect();
                prop_assert_eq!(nodes.len(), 1);
            }
            // No subset of the available GPUs scores better.
            let best = subset_score(&gpus, &got);
            let n = avail.len();
            for mask in 0u32..(1 << n) {
                if mask.count_ones() as usize != k { continue; }
                let set: Vec<usize> = (0..n).filter(|b| mask & (1 << b) != 0).map(|b| avail[b]).collect();
                prop_assert!(subset_score(&gpus, &set) >= best, "{:?} beats {:?}", set, got);
            }
            // Deterministic.
            prop_assert_eq!(assign(&gpus, k), Some(got));
        }
    }
}
