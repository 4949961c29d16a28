//! # gantry-placement
//!
//! Fragmentation-aware GPU placement: pure (no I/O, no clock; it depends on `gantry-proto` and
//! `rand` only), one crate shared by framework schedulers (through `gantry_sdk::placement`:
//! pick an agent and its GPUs from offers), the master (whole and fractional GPUs at accept
//! time), the agent (when the master's choice no longer fits) and the simulators
//! (`simulate --openb`).
//!
//! - [`Node`]: a candidate node's free CPU (milli-cores), memory (MiB), GPU model and the free
//!   milli-GPU of each of its GPUs (1000 = a whole idle GPU), beside its capacity.
//! - [`TaskShape`]: what a task asks for: CPU, memory, a [`GpuDemand`] (none, a fraction of one
//!   GPU in milli-GPUs, or whole GPUs) and the acceptable GPU models ([`ModelSet`]).
//! - [`Workload`]: the expected task mix (task shapes with their counts) that the
//!   fragmentation-aware policies score against; [`fgd`] holds the fragmentation measure.
//! - [`Policy`]: `fgd-scarce` ([`Policy::DEFAULT`]), `fgd-fill` and `fgd-pack` (ours), `fgd`,
//!   `fgd-artifact` (FGD as the paper's artifact computes it), `best-fit`, `random`.
//! - [`Placer`]: the cluster's nodes plus the policy; [`Placer::choose`] picks a node and GPUs,
//!   [`Placer::commit`] / [`Placer::release`] keep the free amounts, and per-node results are
//!   cached so that a decision at 1,000+ nodes stays well under a millisecond.
//!
//! Scoring (lower is better; ties go to a seeded random choice among the best, as in the
//! Kubernetes scheduler the paper's baselines ran in):
//! - `random`: every feasible node scores the same; a random GPU with room for a fraction.
//! - `best-fit`: the sum over CPU, memory and GPU of the fraction of the node left free after
//!   placing (the fullest node wins); a fraction goes to the fullest GPU it fits on.
//! - `fgd` (Weng et al., USENIX ATC 2023): the increase of the node's expected fragmented GPU
//!   amount `F(n) = Σ_m p_m · frag(n, m)` over the workload's task shapes `m`, where
//!   `frag(n, m)` is the node's free milli-GPU that shape `m` cannot use (all of it when `m` does
//!   not fit on the node at all; else the free amount of the GPUs with less room than `m`'s
//!   per-GPU demand). The GPU choice on the node is part of the candidate.
//! - `fgd-pack`: `fgd`'s increase of fragmentation, then (on a tie) the best-fit score instead
//!   of a random choice: among moves that fragment equally, fill the fullest node first, which
//!   keeps whole idle nodes for multi-GPU and large-CPU tasks.
//! - `fgd-fill`: like `fgd-pack`, with the fragmentation measure extended by the leftover of
//!   filling the node with copies of each shape, CPU and memory included ([`fgd`] explains it):
//!   it sees GPU slivers that repeated tasks strand and GPUs stranded by CPU running out.
//! - `fgd-scarce`: `fgd-fill` against the workload weighted by the scarcity of the nodes each
//!   shape can use ([`Workload::weighted_by_scarcity`]): model-constrained and many-GPU shapes
//!   weigh in proportion to how little of the cluster can host them.
//! - `fgd-artifact`: FGD with the artifact's fit test, task types and score quantisation
//!   ([`fgd`] lists the differences).
//!
//! Offer-level building blocks for framework schedulers:
//! - [`across`]: place across the offers held: [`across::OfferPlacer`] scores every agent a
//!   framework holds offers on with the policy above (fractions and whole GPUs), the live
//!   path of the cluster-wide [`Placer`] (`batch` uses it; `simulate --openb --live` measures
//!   it through the master's state core).
//! - [`offers`]: fit task requests into the offers held (selectors, attributes, NUMA locality;
//!   least-unusable-leftover scoring).
//! - [`gang`]: all-or-nothing gangs (elastic `min..max`) and which gang may hold offers.
//! - [`request`]: several task shapes placed together, all or nothing, each with a rule:
//!   anywhere, `strict_pack` (every copy on one agent) or `spread` (at most N per agent or per
//!   value of an attribute such as `rack`).
//! - [`shares`]: a [`Node`] per offer with each offered GPU's free share (`offer.gpu_free`) and
//!   a task's shape from its resources, fractions of one GPU included, for the [`Placer`].
//! - [`cost`]: the share of an agent's price a task pays (dominant share over the agent's
//!   shape) and the `price_per_hour` attribute, for the master's usage reports and the
//!   autoscaler's cost book.
//! - [`topology`]: which `k` idle GPUs of one host a whole-GPU task gets (fewest NUMA nodes and
//!   PCI roots, best fit); the master chooses with it at accept time, the agent when the
//!   master's choice no longer fits.

#![warn(missing_docs)]

pub mod across;
pub mod cost;
pub mod fgd;
pub mod gang;
pub mod offers;
pub mod request;
pub mod shares;
pub mod topology;

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

pub use fgd::{Measure, Workload};

/// Milli-GPUs in one whole GPU.
pub const GPU_MILLI: u32 = 1000;

/// At most this many distinct GPU models (a [`ModelSet`] is a 64-bit mask).
pub const MAX_MODELS: usize = 64;

/// Invalid placement input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("more than {MAX_MODELS} distinct GPU models")]
    /// Too many distinct GPU models.
    TooManyModels,
    #[error("a GPU fraction must be 1..=999 milli-GPUs, got {0}")]
    /// A GPU fraction outside 1..=999 milli-GPUs.
    BadFraction(u32),
    #[error("a whole-GPU demand must be at least 1 GPU")]
    /// A whole-GPU demand of zero GPUs.
    ZeroGpus,
    #[error("node {node}: GPU {gpu} has {free} milli-GPUs free, above {GPU_MILLI}")]
    /// A GPU with more milli-GPUs free than a GPU has.
    BadGpu {
        /// The node's index.
        node: usize,
        /// The GPU's index on the node.
        gpu: usize,
        /// The milli-GPUs it claims free.
        free: u32,
    },
    #[error("node {node}: free resources above its capacity")]
    /// A node with more free than its capacity.
    FreeAboveCapacity {
        /// The node's index.
        node: usize,
    },
    #[error(
        "unknown placement policy {0:?} (expected fgd-fill, fgd-pack, fgd-scarce, fgd, fgd-artifact, best-fit or random)"
    )]
    /// A policy name that is not known.
    UnknownPolicy(String),
    #[error("placement does not match node {0}'s free resources")]
    /// A placement that does not fit the node it names.
    Mismatch(usize),
}

/// A GPU model, interned by [`Models`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(u8);

impl ModelId {
    /// The model's index in its [`Models`].
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// The GPU models a task accepts; empty means any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModelSet(u64);

impl ModelSet {
    /// Any model.
    pub const ANY: ModelSet = ModelSet(0);

    /// This set plus `model`.
    pub fn with(self, model: ModelId) -> ModelSet {
        ModelSet(self.0 | (1u64 << model.0))
    }

    /// Whether a GPU of `model` is acceptable.
    pub fn accepts(self, model: ModelId) -> bool {
        self.0 == 0 || self.0 & (1u64 << model.0) != 0
    }

    /// Whether any model is acceptable.
    pub fn is_any(self) -> bool {
        self.0 == 0
    }
}

/// Interns GPU model names.
#[derive(Debug, Clone, Default)]
pub struct Models {
    names: Vec<String>,
}

impl Models {
    /// No models yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `name`, adding it when new.
    pub fn intern(&mut self, name: &str) -> Result<ModelId, PlacementError> {
        if let Some(id) = self.get(name) {
            return Ok(id);
        }
        if self.names.len() >= MAX_MODELS {
            return Err(PlacementError::TooManyModels);
        }
        let id = u8::try_from(self.names.len()).map_err(|_| PlacementError::TooManyModels)?;
        self.names.push(name.to_string());
        Ok(ModelId(id))
    }

    /// The id of `name`, if interned.
    pub fn get(&self, name: &str) -> Option<ModelId> {
        self.names
            .iter()
            .position(|n| n == name)
            .and_then(|i| u8::try_from(i).ok())
            .map(ModelId)
    }

    /// The name of `id`.
    pub fn name(&self, id: ModelId) -> Option<&str> {
        self.names.get(id.index()).map(String::as_str)
    }

    /// How many models are interned.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no model is interned.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The set of the given model names (interning them); no names is [`ModelSet::ANY`].
    pub fn set<'a>(
        &mut self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<ModelSet, PlacementError> {
        let mut set = ModelSet::ANY;
        for name in names {
            let name = name.trim();
            if !name.is_empty() {
                set = set.with(self.intern(name)?);
            }
        }
        Ok(set)
    }
}

/// A task's GPU demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuDemand {
    /// No GPU.
    None,
    /// A share of one GPU, 1..=999 milli-GPUs.
    Fraction(u32),
    /// Whole idle GPUs on one node.
    Whole(u32),
}

impl GpuDemand {
    /// A checked fraction (1..=999); 1000 is `Whole(1)`.
    pub fn fraction(milli: u32) -> Result<GpuDemand, PlacementError> {
        match milli {
            GPU_MILLI => Ok(GpuDemand::Whole(1)),
            1..=999 => Ok(GpuDemand::Fraction(milli)),
            _ => Err(PlacementError::BadFraction(milli)),
        }
    }

    /// A checked number of whole GPUs (0 is `None`).
    pub fn whole(count: u32) -> GpuDemand {
        if count == 0 {
            GpuDemand::None
        } else {
            GpuDemand::Whole(count)
        }
    }

    /// Total milli-GPUs asked for.
    pub fn milli(self) -> u64 {
        match self {
            GpuDemand::None => 0,
            GpuDemand::Fraction(m) => u64::from(m),
            GpuDemand::Whole(n) => u64::from(n) * u64::from(GPU_MILLI),
        }
    }
}

/// What a task asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskShape {
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// GPUs.
    pub gpu: GpuDemand,
    /// Acceptable GPU models.
    pub models: ModelSet,
}

/// A candidate node: capacity and what is free now.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// The node's GPU model.
    pub model: ModelId,
    /// CPU capacity, milli-cores.
    pub cpu_capacity: u64,
    /// Memory capacity, MiB.
    pub memory_capacity: u64,
    /// Free CPU, milli-cores.
    pub cpu_free: u64,
    /// Free memory, MiB.
    pub memory_free: u64,
    /// Free milli-GPUs of each GPU (its capacity is [`GPU_MILLI`]).
    pub gpu_free: Vec<u32>,
}

impl Node {
    /// An idle node.
    pub fn idle(model: ModelId, cpu_milli: u64, memory_mib: u64, gpus: usize) -> Node {
        Node {
            model,
            cpu_capacity: cpu_milli,
            memory_capacity: memory_mib,
            cpu_free: cpu_milli,
            memory_free: memory_mib,
            gpu_free: vec![GPU_MILLI; gpus],
        }
    }

    fn check(&self, index: usize) -> Result<(), PlacementError> {
        if self.cpu_free > self.cpu_capacity || self.memory_free > self.memory_capacity {
            return Err(PlacementError::FreeAboveCapacity { node: index });
        }
        for (gpu, &free) in self.gpu_free.iter().enumerate() {
            if free > GPU_MILLI {
                return Err(PlacementError::BadGpu {
                    node: index,
                    gpu,
                    free,
                });
            }
        }
        Ok(())
    }

    /// Free milli-GPUs over all GPUs.
    pub fn gpu_free_total(&self) -> u64 {
        self.gpu_free.iter().map(|&f| u64::from(f)).sum()
    }

    /// Whether CPU, memory and model allow `task` here (GPU room aside).
    fn fits_host(&self, task: &TaskShape) -> bool {
        task.cpu_milli <= self.cpu_free
            && task.memory_mib <= self.memory_free
            && (task.gpu == GpuDemand::None || task.models.accepts(self.model))
    }

    /// Whether `task` fits here.
    pub fn fits(&self, task: &TaskShape) -> bool {
        self.fits_host(task)
            && match task.gpu {
                GpuDemand::None => true,
                GpuDemand::Fraction(d) => self.gpu_free.iter().any(|&f| f >= d),
                GpuDemand::Whole(k) => self.idle_gpus() >= k as usize,
            }
    }

    fn idle_gpus(&self) -> usize {
        self.gpu_free.iter().filter(|&&f| f == GPU_MILLI).count()
    }

    /// The first `k` idle GPUs.
    fn first_idle(&self, k: u32) -> Vec<GpuShare> {
        self.gpu_free
            .iter()
            .enumerate()
            .filter(|(_, &f)| f == GPU_MILLI)
            .take(k as usize)
            .map(|(i, _)| GpuShare {
                gpu: i,
                milli: GPU_MILLI,
            })
            .collect()
    }
}

/// A share of one GPU given to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuShare {
    /// Index into [`Node::gpu_free`].
    pub gpu: usize,
    /// Milli-GPUs taken from it.
    pub milli: u32,
}

/// Where a task goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Index of the chosen node.
    pub node: usize,
    /// The GPU shares given to the task (empty without GPUs).
    pub gpus: Vec<GpuShare>,
}

/// A placement policy (see the module documentation for the scoring).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// FGD plus the repeated-fill leftover, then best-fit on ties (ours).
    FgdFill,
    /// FGD then best-fit on ties (ours).
    FgdPack,
    /// `fgd-fill` against the workload weighted by node scarcity (ours, see
    /// [`Workload::weighted_by_scarcity`]).
    FgdScarce,
    /// Fragmentation Gradient Descent.
    Fgd,
    /// Fragmentation Gradient Descent as the paper's artifact computes it (see [`fgd`]).
    FgdArtifact,
    /// The node that leaves the least free after placing (classic best fit).
    BestFit,
    /// A uniformly random feasible node (the baseline).
    Random,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Policy; 7] = [
        Policy::FgdFill,
        Policy::FgdPack,
        Policy::FgdScarce,
        Policy::Fgd,
        Policy::FgdArtifact,
        Policy::BestFit,
        Policy::Random,
    ];

    /// The default for scheduling against a known workload: `fgd-scarce`. It replaces a
    /// per-mix choice between `fgd-fill` and `fgd-pack` by thresholds fitted to the public
    /// openb lists; the scarcity weights come from the node list instead.
    pub const DEFAULT: Policy = Policy::FgdScarce;

    /// The policy's name on the command line (`fgd-fill`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Policy::FgdFill => "fgd-fill",
            Policy::FgdPack => "fgd-pack",
            Policy::FgdScarce => "fgd-scarce",
            Policy::Fgd => "fgd",
            Policy::FgdArtifact => "fgd-artifact",
            Policy::BestFit => "best-fit",
            Policy::Random => "random",
        }
    }

    /// Whether the policy scores against a [`Workload`].
    pub fn needs_workload(self) -> bool {
        matches!(
            self,
            Policy::Fgd
                | Policy::FgdArtifact
                | Policy::FgdPack
                | Policy::FgdFill
                | Policy::FgdScarce
        )
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = PlacementError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| PlacementError::UnknownPolicy(s.to_string()))
    }
}

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
    /// Each node's fragmentation under [`Measure::FgdFill`] (`fgd-fill` only).
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
        let workload = if policy == Policy::FgdScarce {
            workload.weighted_by_scarcity(&nodes)
        } else {
            workload
        };
        let measure = if matches!(policy, Policy::FgdFill | Policy::FgdScarce) {
            Measure::FgdFill
        } else {
            Measure::Fgd
        };
        let base = if policy == Policy::FgdArtifact {
            Measure::Artifact
        } else {
            Measure::Fgd
        };
        let frag = nodes
            .iter()
            .map(|n| workload.fragmentation(base, n))
            .collect();
        let fill = if measure == Measure::FgdFill {
            nodes
                .iter()
                .map(|n| workload.fragmentation(Measure::FgdFill, n))
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
        match self.policy {
            Policy::FgdFill | Policy::FgdScarce => Measure::FgdFill,
            Policy::FgdArtifact => Measure::Artifact,
            _ => Measure::Fgd,
        }
    }

    fn touched(&mut self, node: usize) {
        let base = if self.policy == Policy::FgdArtifact {
            Measure::Artifact
        } else {
            Measure::Fgd
        };
        self.frag[node] = self.workload.fragmentation(base, &self.nodes[node]);
        if let Some(f) = self.fill.get_mut(node) {
            *f = self
                .workload
                .fragmentation(Measure::FgdFill, &self.nodes[node]);
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
            Policy::Fgd | Policy::FgdPack | Policy::FgdFill | Policy::FgdScarce => {
                let (delta, gpu) = if self.measure() == Measure::FgdFill {
                    self.workload
                        .best_delta(Measure::FgdFill, node, self.fill[i], task)?
                } else {
                    self.workload
                        .best_delta(Measure::Fgd, node, self.frag[i], task)?
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

#[cfg(test)]
mod tests;
