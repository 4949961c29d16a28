//! [`Placer`]: the cluster's nodes plus a [`Policy`]; scores every feasible node (per-node
//! results cached per workload shape), picks one (seeded random tie-breaking) and keeps the
//! free amounts as placements are committed and released.

use super::{
    GpuDemand, GpuShare, Measure, ModelSet, Node, Placement, PlacementError, Policy, TaskShape,
    Workload, GPU_MILLI,
};
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::HashMap;

/// A candidate's score: compared lexicographically, lower is better.
type Score = (i64, u64);

/// One node's best candidate for a task: the score and, for a fraction, the GPU.
#[derive(Debug, Clone, Copy)]
struct Eval {
    score: Score,
    gpu: usize,
}

/// A cached [`Eval`] for a (node, workload shape) pair, valid while the node's stamp matches.
#[derive(Debug, Clone, Copy)]
struct Cached {
    stamp: u32,
    eval: Option<Eval>,
}

const NO_STAMP: u32 = 0;

/// The cluster's nodes and a policy: chooses placements and tracks what they take.
#[derive(Debug, Clone)]
pub struct Placer {
    nodes: Vec<Node>,
    policy: Policy,
    workload: Workload,
    rng: Pcg64Mcg,
    /// Each node's expected fragmentation now ([`Workload::fragmentation`]).
    frag: Vec<i64>,
    /// Each node's fragmentation under [`Measure::FgdFill`] (`fgd-fill`) or
    /// [`Measure::ShareFill`] (`fgd-scarce`); empty for the other policies.
    fill: Vec<i64>,
    /// Bumped whenever a node changes; cache entries of older stamps are stale.
    stamp: Vec<u32>,
    /// `nodes × workload classes` cached evaluations (fragmentation-aware policies only).
    cache: Vec<Cached>,
}

impl Placer {
    /// A placer over `nodes`. `workload` is the expected task mix (used by `fgd` and `fgd-pack`;
    /// an empty one makes them plain best-fit / random); `seed` drives random choices.
    pub fn new(
        nodes: Vec<Node>,
        policy: Policy,
        workload: Workload,
        seed: u64,
    ) -> Result<Placer, PlacementError> {
        for (i, node) in nodes.iter().enumerate() {
            node.check(i)?;
        }
        let workload = if matches!(policy, Policy::FgdScarce | Policy::FgdBlend) {
            workload.weighted_by_scarcity(&nodes)
        } else {
            workload
        };
        let measure = measure_of(policy);
        let base = if policy == Policy::FgdArtifact {
            Measure::Artifact
        } else {
            Measure::Fgd
        };
        let frag = nodes
            .iter()
            .map(|n| workload.fragmentation(base, n))
            .collect();
        let fill = if matches!(measure, Measure::FgdFill | Measure::ShareFill) {
            nodes
                .iter()
                .map(|n| workload.fragmentation(measure, n))
                .collect()
        } else {
            Vec::new()
        };
        let cache_len = if policy.needs_workload() {
            nodes.len() * workload.classes()
        } else {
            0
        };
        Ok(Placer {
            stamp: vec![NO_STAMP + 1; nodes.len()],
            frag,
            fill,
            cache: vec![
                Cached {
                    stamp: NO_STAMP,
                    eval: None
                };
                cache_len
            ],
            nodes,
            policy,
            workload,
            rng: Pcg64Mcg::seed_from_u64(seed),
        })
    }

    /// The candidate nodes, as they are now.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The policy in use.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Chooses where `task` goes, or `None` when it fits nowhere. Does not commit.
    pub fn choose(&mut self, task: &TaskShape) -> Option<Placement> {
        if let GpuDemand::Fraction(d) = task.gpu {
            if d == 0 || d >= GPU_MILLI {
                return None;
            }
        }
        if task.gpu == GpuDemand::Whole(0) {
            return None;
        }
        let class = if self.policy.needs_workload() {
            self.workload.class_index(task)
        } else {
            None
        };
        // Evaluations are cached per class (the model list aside), so check it first.
        let any_model = TaskShape {
            models: ModelSet::ANY,
            ..*task
        };
        let mut best: Option<(Score, usize, usize)> = None;
        let mut ties = 0u64;
        // Nodes in the same state score the same: on a cold cache (a shape's first task, when
        // every node is evaluated) identical nodes are evaluated once.
        let mut same_state: HashMap<Node, Option<Eval>> = HashMap::new();
        for i in 0..self.nodes.len() {
            let eval = match class {
                Some(c) => {
                    if task.gpu != GpuDemand::None && !task.models.accepts(self.nodes[i].model) {
                        continue;
                    }
                    let slot = i * self.workload.classes() + c;
                    let cached = self.cache[slot];
                    if cached.stamp == self.stamp[i] {
                        cached.eval
                    } else {
                        let eval = match same_state.get(&self.nodes[i]) {
                            Some(&eval) => eval,
                            None => {
                                let eval = self.evaluate(i, &any_model);
                                same_state.insert(self.nodes[i].clone(), eval);
                                eval
                            }
                        };
                        self.cache[slot] = Cached {
                            stamp: self.stamp[i],
                            eval,
                        };
                        eval
                    }
                }
                None => self.evaluate(i, task),
            };
            let Some(eval) = eval else { continue };
            match best {
                Some((score, _, _)) if eval.score > score => {}
                Some((score, _, _)) if eval.score == score => {
                    // Reservoir sampling keeps a uniform choice among equal scores.
                    ties += 1;
                    if self.rng.random_range(0..ties) == 0 {
                        best = Some((eval.score, i, eval.gpu));
                    }
                }
                _ => {
                    ties = 1;
                    best = Some((eval.score, i, eval.gpu));
                }
            }
        }
        let (_, node, gpu) = best?;
        let gpus = match task.gpu {
            GpuDemand::None => Vec::new(),
            GpuDemand::Fraction(d) => {
                let gpu = if self.policy == Policy::Random {
                    // A random GPU with room, as the random policy promises.
                    let fitting: Vec<usize> = self.nodes[node]
                        .gpu_free
                        .iter()
                        .enumerate()
                        .filter(|(_, &f)| f >= d)
                        .map(|(g, _)| g)
                        .collect();
                    fitting[self.rng.random_range(0..fitting.len())]
                } else {
                    gpu
                };
                vec![GpuShare { gpu, milli: d }]
            }
            GpuDemand::Whole(k) => self.nodes[node].first_idle(k),
        };
        Some(Placement { node, gpus })
    }

    /// Sets what is free on node `i` now (its capacity stays): how a caller whose view of a
    /// node comes from outside (a new offer for the agent, an offer used or rescinded) keeps
    /// the placer current; only that node is evaluated again. A node with nothing free fits
    /// nothing. `gpu_free` must have one entry per GPU of the node.
    pub fn set_free(
        &mut self,
        i: usize,
        cpu_free: u64,
        memory_free: u64,
        gpu_free: &[u32],
    ) -> Result<(), PlacementError> {
        let node = self.nodes.get(i).ok_or(PlacementError::Mismatch(i))?;
        if gpu_free.len() != node.gpu_free.len() {
            return Err(PlacementError::Mismatch(i));
        }
        let mut next = node.clone();
        next.cpu_free = cpu_free;
        next.memory_free = memory_free;
        next.gpu_free.copy_from_slice(gpu_free);
        next.check(i)?;
        if next != self.nodes[i] {
            self.nodes[i] = next;
            self.touched(i);
        }
        Ok(())
    }

    /// Chooses and commits; `None` when the task fits nowhere.
    pub fn place(&mut self, task: &TaskShape) -> Option<Placement> {
        let placement = self.choose(task)?;
        self.commit(&placement, task).ok()?;
        Some(placement)
    }

    /// Takes what `placement` gives `task` from its node.
    pub fn commit(
        &mut self,
        placement: &Placement,
        task: &TaskShape,
    ) -> Result<(), PlacementError> {
        let node = self
            .nodes
            .get(placement.node)
            .ok_or(PlacementError::Mismatch(placement.node))?;
        let ok = node.fits_host(task)
            && placement
                .gpus
                .iter()
                .map(|g| u64::from(g.milli))
                .sum::<u64>()
                == task.gpu.milli()
            && placement
                .gpus
                .iter()
                .all(|g| node.gpu_free.get(g.gpu).is_some_and(|&f| f >= g.milli))
            && distinct(&placement.gpus);
        if !ok {
            return Err(PlacementError::Mismatch(placement.node));
        }
        let node = &mut self.nodes[placement.node];
        node.cpu_free -= task.cpu_milli;
        node.memory_free -= task.memory_mib;
        for g in &placement.gpus {
            node.gpu_free[g.gpu] -= g.milli;
        }
        self.touched(placement.node);
        Ok(())
    }

    /// Gives back what `placement` took for `task` (a task ended).
    pub fn release(
        &mut self,
        placement: &Placement,
        task: &TaskShape,
    ) -> Result<(), PlacementError> {
        let node = self
            .nodes
            .get(placement.node)
            .ok_or(PlacementError::Mismatch(placement.node))?;
        let ok = node.cpu_free + task.cpu_milli <= node.cpu_capacity
            && node.memory_free + task.memory_mib <= node.memory_capacity
            && placement.gpus.iter().all(|g| {
                node.gpu_free
                    .get(g.gpu)
                    .is_some_and(|&f| f + g.milli <= GPU_MILLI)
            })
            && distinct(&placement.gpus);
        if !ok {
            return Err(PlacementError::Mismatch(placement.node));
        }
        let node = &mut self.nodes[placement.node];
        node.cpu_free += task.cpu_milli;
        node.memory_free += task.memory_mib;
        for g in &placement.gpus {
            node.gpu_free[g.gpu] += g.milli;
        }
        self.touched(placement.node);
        Ok(())
    }

    fn measure(&self) -> Measure {
        measure_of(self.policy)
    }

    fn touched(&mut self, node: usize) {
        let base = if self.policy == Policy::FgdArtifact {
            Measure::Artifact
        } else {
            Measure::Fgd
        };
        self.frag[node] = self.workload.fragmentation(base, &self.nodes[node]);
        let measure = self.measure();
        if let Some(f) = self.fill.get_mut(node) {
            *f = self.workload.fragmentation(measure, &self.nodes[node]);
        }
        self.stamp[node] = self.stamp[node].wrapping_add(1).max(NO_STAMP + 1);
    }

    /// The best candidate on node `i` for `task` under the policy.
    fn evaluate(&self, i: usize, task: &TaskShape) -> Option<Eval> {
        let node = &self.nodes[i];
        if !node.fits(task) {
            return None;
        }
        match self.policy {
            Policy::Random => Some(Eval {
                score: (0, 0),
                gpu: 0,
            }),
            Policy::BestFit => {
                let gpu = tightest_gpu(node, task.gpu);
                Some(Eval {
                    score: (0, best_fit(node, task)),
                    gpu: gpu.unwrap_or(0),
                })
            }
            Policy::FgdArtifact => {
                let (delta, gpu) =
                    self.workload
                        .best_delta(Measure::Artifact, node, self.frag[i], task)?;
                Some(Eval {
                    score: (self.workload.artifact_score(delta), 0),
                    gpu: gpu.unwrap_or(0),
                })
            }
            Policy::Fgd
            | Policy::FgdPack
            | Policy::FgdFill
            | Policy::FgdScarce
            | Policy::FgdBlend => {
                let measure = self.measure();
                let (delta, gpu) = if matches!(measure, Measure::FgdFill | Measure::ShareFill) {
                    self.workload
                        .best_delta(measure, node, self.fill[i], task)?
                } else {
                    self.workload
                        .best_delta(Measure::Fgd, node, self.frag[i], task)?
                };
                let delta = if self.policy == Policy::FgdBlend {
                    // FGD's change for the same placement (the same GPU for a fraction).
                    delta
                        + self
                            .workload
                            .delta_at(Measure::Fgd, node, self.frag[i], task, gpu)
                } else {
                    delta
                };
                let pack = if self.policy != Policy::Fgd {
                    best_fit(node, task)
                } else {
                    0
                };
                Some(Eval {
                    score: (delta, pack),
                    gpu: gpu.unwrap_or(0),
                })
            }
        }
    }
}

/// The fragmentation measure a policy scores with.
fn measure_of(policy: Policy) -> Measure {
    match policy {
        Policy::FgdFill => Measure::FgdFill,
        Policy::FgdScarce | Policy::FgdBlend => Measure::ShareFill,
        Policy::FgdArtifact => Measure::Artifact,
        _ => Measure::Fgd,
    }
}

fn distinct(gpus: &[GpuShare]) -> bool {
    gpus.iter()
        .enumerate()
        .all(|(i, a)| gpus[..i].iter().all(|b| b.gpu != a.gpu))
}

/// For a fraction, the fitting GPU with the least room (first on ties).
fn tightest_gpu(node: &Node, demand: GpuDemand) -> Option<usize> {
    let GpuDemand::Fraction(d) = demand else {
        return None;
    };
    node.gpu_free
        .iter()
        .enumerate()
        .filter(|(_, &f)| f >= d)
        .min_by_key(|(g, &f)| (f, *g))
        .map(|(g, _)| g)
}

/// Best-fit score (lower = fuller node after placing): the free fraction of CPU, memory and
/// GPU left on the node after the task, summed, in millionths.
fn best_fit(node: &Node, task: &TaskShape) -> u64 {
    const SCALE: u64 = 1_000_000;
    let frac = |free: u64, cap: u64| free.saturating_mul(SCALE).checked_div(cap).unwrap_or(0);
    let gpu_cap = node.gpu_free.len() as u64 * u64::from(GPU_MILLI);
    frac(node.cpu_free - task.cpu_milli, node.cpu_capacity)
        + frac(node.memory_free - task.memory_mib, node.memory_capacity)
        + frac(node.gpu_free_total() - task.gpu.milli(), gpu_cap)
}
