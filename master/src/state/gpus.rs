//! GPU sharing in the master (pure): which share of each GPU the tasks on an agent hold, what
//! offers show as free per GPU, and which GPUs a task gets.
//!
//! A `gpus` amount below one is a fraction of one GPU (milli-GPU precision); from one up it is
//! whole GPUs ([`GpuAmount`]). The allocator accounts the scalar exactly (milli-units); this
//! module keeps the per-GPU side: fractions on one GPU sum to at most 1000 milli-GPUs, and a
//! whole-GPU task only gets idle GPUs.
//!
//! The master chooses the GPU for a fraction at accept time with the same fragmentation-aware
//! scoring as the placement crate ([`gantry_placement`], policy
//! `--gpu-placement`, default `fgd-pack`), scored against the expected task mix: the shapes
//! the frameworks declared in their demands, the GPU tasks live on the agent, the task itself
//! and one whole GPU (so whole GPUs are not broken up while a partly used GPU has room), and
//! sends the choice with `RunTask` (the agent checks it and falls back to its own choice when
//! it no longer fits). Whole GPUs are chosen at accept time too, with the agent's own
//! topology-aware rule ([`topology::assign`]: fewest NUMA nodes and PCI roots, best fit), so
//! the ledger is exact from the accept on: an accept that follows before the agent's first
//! update still sees which GPUs are taken. (When they were left to the agent, a task asking
//! for a GPU model was refused while tasks without a selector were in flight: they might have
//! taken its GPUs.) A whole-GPU task whose GPUs are not known (launched by an older master)
//! holds its count of idle GPUs as "pending", which other tasks may not take.

use std::collections::BTreeMap;

use gantry_placement::topology::{self, GpuSlot};
use gantry_placement::{
    GpuDemand, ModelId, ModelSet, Models, Node, Placer, Policy, TaskShape, Workload, GPU_MILLI,
};
use gantry_proto::{GpuAmount, GpuFree, GpuInfo, GpuSelector, TaskInfo};

use super::{AgentId, Master};

/// What the tasks of one agent hold of its GPUs.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct GpuLedger {
    /// Milli-GPUs taken per GPU uuid (1000 = whole).
    pub used: BTreeMap<String, u32>,
    /// Whole GPUs of tasks whose GPUs the agent has not reported yet, with their selectors.
    pub pending_whole: Vec<(u64, Option<GpuSelector>)>,
    /// For an accept's ledger that keeps offers' earmarks apart
    /// ([`Master::accept_gpu_ledger`]): the same ledger without them. A task that fits nowhere
    /// the earmarks leave it is chosen from this one, as before earmarks existed: earmarks
    /// steer an accept away from another offer's shares, they never refuse a task that would
    /// have run.
    pub fallback: Option<Box<GpuLedger>>,
}

impl GpuLedger {
    /// Milli-GPUs free on `uuid`.
    pub fn free(&self, uuid: &str) -> u32 {
        GPU_MILLI.saturating_sub(self.used.get(uuid).copied().unwrap_or(0))
    }

    /// Whole GPUs pending for tasks that could use one of `candidates`.
    fn pending_on(&self, candidates: &[&GpuInfo]) -> u64 {
        self.pending_whole
            .iter()
            .filter(|(_, sel)| {
                candidates
                    .iter()
                    .any(|g| GpuSelector::admits(sel.as_ref(), g))
            })
            .map(|(k, _)| k)
            .sum()
    }

    /// Records `milli` taken of `uuid`.
    pub fn take(&mut self, uuid: &str, milli: u32) {
        let v = self.used.entry(uuid.to_string()).or_insert(0);
        *v = v.saturating_add(milli).min(GPU_MILLI);
        if let Some(f) = self.fallback.as_mut() {
            f.take(uuid, milli);
        }
    }
}

/// The NUMA node and PCI root of each GPU in the allocator's per-GPU view of `a` (its healthy
/// GPUs outside MIG, in order).
pub(crate) fn gpu_view_topology(a: &super::AgentRec) -> Vec<(Option<u32>, Option<String>)> {
    a.gpus
        .iter()
        .filter(|g| g.healthy && g.mig_profile.is_none())
        .map(|g| (g.numa_node, g.pci_root.clone()))
        .collect()
}

impl Master {
    /// What the live (non-terminal) tasks on `agent` hold of its GPUs.
    pub(crate) fn gpu_ledger(&self, agent: AgentId) -> GpuLedger {
        let mut ledger = GpuLedger::default();
        let Some(a) = self.agents.get(&agent) else {
            return ledger;
        };
        for t in a.tasks.iter().filter_map(|id| self.tasks.get(id)) {
            if t.state.is_terminal() {
                continue;
            }
            let Ok(amount) = t.info.resources.gpu_amount() else {
                continue;
            };
            if amount == GpuAmount::None {
                continue;
            }
            if t.gpus.is_empty() {
                if let GpuAmount::Whole(k) = amount {
                    ledger.pending_whole.push((k, t.info.gpu_selector.clone()));
                }
                continue;
            }
            for uuid in &t.gpus {
                ledger.take(uuid, amount.per_gpu_milli());
            }
        }
        ledger
    }

    /// Milli-GPUs the live tasks on agent `a` hold of each of its GPUs, by position in
    /// `a.gpus`: what [`Master::gpu_ledger`] says for each GPU's uuid, without building the
    /// ledger (no strings copied; this runs for every agent offered, once per cycle).
    fn gpu_used(&self, a: &super::AgentRec) -> Vec<u32> {
        let mut used = vec![0u32; a.gpus.len()];
        for t in a.tasks.iter().filter_map(|id| self.tasks.get(id)) {
            if t.state.is_terminal() || t.gpus.is_empty() {
                continue;
            }
            let milli = match t.info.resources.gpu_amount() {
                Ok(GpuAmount::None) | Err(_) => continue,
                Ok(amount) => amount.per_gpu_milli(),
            };
            for uuid in &t.gpus {
                for (g, u) in a.gpus.iter().zip(used.iter_mut()) {
                    if g.uuid == *uuid {
                        *u = u.saturating_add(milli).min(GPU_MILLI);
                    }
                }
            }
        }
        used
    }

    /// Gives the allocator each GPU agent's free share per GPU, when some framework declared a
    /// demand for GPUs (demand-aware splitting then counts a task's worth only where one GPU
    /// has room for a fraction, or enough GPUs are idle for whole ones, and earmarks them;
    /// `allocator::gpus`). Without such a demand nothing is computed.
    pub(crate) fn sync_gpu_views(&mut self) {
        let wants_gpus = self
            .frameworks
            .keys()
            .flat_map(|f| self.allocator.demands(*f))
            .any(|d| !matches!(d.task.gpu_amount(), Ok(GpuAmount::None)));
        if !wants_gpus {
            return;
        }
        type View = (
            AgentId,
            Vec<u32>,
            Option<Vec<(Option<u32>, Option<String>)>>,
        );
        let views: Vec<View> = self
            .agents
            .values()
            .filter(|a| !a.gpus.is_empty())
            .map(|a| {
                let used = self.gpu_used(a);
                let free: Vec<u32> = a
                    .gpus
                    .iter()
                    .zip(&used)
                    .filter(|(g, _)| g.healthy && g.mig_profile.is_none())
                    .map(|(_, u)| GPU_MILLI.saturating_sub(*u))
                    .collect();
                // The view's topology is set at registration; again only when the view
                // changed size (a GPU's health or MIG mode).
                let topology = (self.allocator.gpu_topology_len(a.id) != free.len())
                    .then(|| gpu_view_topology(a));
                (a.id, free, topology)
            })
            .collect();
        for (id, free, topology) in views {
            self.allocator.set_agent_gpus(id, free);
            if let Some(t) = topology {
                self.allocator.set_agent_gpu_topology(id, t);
            }
        }
    }

    /// What offer `offer` on `agent` may use of each GPU: `base` (what [`Master::gpu_free`]
    /// says) net of the shares other outstanding offers earmarked there; an offer that
    /// earmarked shares itself (a fraction's task's worth, `allocator::gpus`) lists only those.
    /// Two frameworks holding offers on one agent then never count the same share: what one
    /// launches is never what the other was told is free.
    pub(crate) fn offer_gpu_free(
        &self,
        agent: AgentId,
        offer: gantry_proto::OfferId,
        mut base: Vec<GpuFree>,
    ) -> Vec<GpuFree> {
        let own = self.allocator.offer_earmarks(offer);
        let marked = self.allocator.agent_earmarks(agent);
        if own.is_empty() && marked.is_empty() {
            return base;
        }
        let Some(a) = self.agents.get(&agent) else {
            return base;
        };
        // The allocator's per-GPU view: healthy GPUs outside MIG, in order (sync_gpu_views).
        let view: Vec<&GpuInfo> = a
            .gpus
            .iter()
            .filter(|g| g.healthy && g.mig_profile.is_none())
            .collect();
        let earmark = |uuid: &str, marks: &mut dyn Iterator<Item = (usize, u32)>| -> u32 {
            marks
                .filter(|(i, _)| view.get(*i).is_some_and(|g| g.uuid == uuid))
                .map(|(_, m)| m)
                .sum()
        };
        let memory = |uuid: &str, milli: u32| {
            view.iter().find(|g| g.uuid == uuid).map_or(0, |g| {
                g.memory_mib * u64::from(milli) / u64::from(GPU_MILLI)
            })
        };
        if !own.is_empty() {
            base.retain_mut(|g| {
                let m = earmark(&g.uuid, &mut own.iter().map(|(i, m)| (*i as usize, *m)));
                g.free_milli = g.free_milli.min(m);
                g.free_memory_mib = memory(&g.uuid, g.free_milli);
                g.free_milli > 0
            });
            return base;
        }
        for g in &mut base {
            let m = earmark(&g.uuid, &mut marked.iter().copied().enumerate());
            if m > 0 {
                g.free_milli = g.free_milli.saturating_sub(m);
                g.free_memory_mib = memory(&g.uuid, g.free_milli);
            }
        }
        base
    }

    /// The GPU ledger an accept of `accepted` (offers on `agent`) draws from: what the live
    /// tasks hold ([`Master::gpu_ledger`]) plus the shares other outstanding offers earmarked;
    /// when every accepted offer earmarked shares, only those are free (the tasks go where the
    /// offers said, as [`Master::offer_gpu_free`] told the framework). `None` when nothing on
    /// the agent is earmarked (the ledger is then built at the first task with GPUs).
    pub(crate) fn accept_gpu_ledger(
        &self,
        agent: AgentId,
        accepted: &[gantry_proto::OfferId],
    ) -> Option<GpuLedger> {
        let marked = self.allocator.agent_earmarks(agent);
        if marked.is_empty() {
            return None;
        }
        let a = self.agents.get(&agent)?;
        let plain = self.gpu_ledger(agent);
        let mut ledger = plain.clone();
        let own: Vec<(u32, u32)> = accepted
            .iter()
            .flat_map(|o| self.allocator.offer_earmarks(*o).iter().copied())
            .collect();
        let only_own = accepted
            .iter()
            .all(|o| !self.allocator.offer_earmarks(*o).is_empty());
        let view = a
            .gpus
            .iter()
            .filter(|g| g.healthy && g.mig_profile.is_none());
        for (i, g) in view.enumerate() {
            let free = ledger.free(&g.uuid);
            let mine: u32 = own
                .iter()
                .filter(|(j, _)| *j as usize == i)
                .map(|(_, m)| *m)
                .sum();
            let others = marked.get(i).copied().unwrap_or(0).saturating_sub(mine);
            let keep = if only_own {
                mine.min(free)
            } else {
                free.saturating_sub(others)
            };
            ledger.take(&g.uuid, free - keep);
        }
        ledger.fallback = Some(Box::new(plain));
        Some(ledger)
    }

    /// Free share and memory of each healthy GPU of `agent`, for offers.
    pub(crate) fn gpu_free(&self, agent: AgentId) -> Vec<GpuFree> {
        let Some(a) = self.agents.get(&agent).filter(|a| !a.gpus.is_empty()) else {
            return Vec::new();
        };
        let used = self.gpu_used(a);
        a.gpus
            .iter()
            .zip(&used)
            .filter(|(g, _)| g.healthy)
            .map(|(g, u)| {
                let free = GPU_MILLI.saturating_sub(*u);
                GpuFree {
                    uuid: g.uuid.clone(),
                    free_milli: free,
                    free_memory_mib: g.memory_mib * u64::from(free) / u64::from(GPU_MILLI),
                }
            })
            .collect()
    }

    /// The GPUs for `task`: `Ok(vec![])` for tasks without GPUs; for a fraction of one GPU,
    /// the GPU it shares (fragmentation-aware); for whole GPUs, `k` idle ones of one NUMA node
    /// and PCI root where possible ([`topology::assign`], the agent's own rule). `Err` when no
    /// admissible GPU of the agent has room. `ledger` is what the agent's live tasks hold
    /// ([`Master::gpu_ledger`]) plus what earlier tasks of the same accept were given.
    ///
    /// Choosing whole GPUs here, not leaving them to the agent, keeps the ledger exact from the
    /// accept on: the next accept (and offer) sees which GPUs are taken before the agent's
    /// first update arrives.
    pub(crate) fn choose_gpus(
        &self,
        agent: AgentId,
        task: &TaskInfo,
        ledger: &GpuLedger,
    ) -> Result<Vec<String>, String> {
        let tid = task.task_id;
        let amount = task
            .resources
            .gpu_amount()
            .map_err(|e| format!("task {tid}: {e}"))?;
        if amount == GpuAmount::None {
            // CPU tasks cost nothing here (an accept may launch many).
            return Ok(Vec::new());
        }
        let gpus: &[GpuInfo] = self
            .agents
            .get(&agent)
            .map(|a| a.gpus.as_slice())
            .unwrap_or_default();
        let selector = task.gpu_selector.as_ref();
        let admits = |g: &GpuInfo| g.healthy && GpuSelector::admits(selector, g);
        let candidates: Vec<&GpuInfo> = gpus.iter().filter(|g| admits(g)).collect();
        let milli = match amount {
            GpuAmount::None => return Ok(Vec::new()),
            GpuAmount::Whole(k) => {
                let idle = candidates
                    .iter()
                    .filter(|g| ledger.free(&g.uuid) == GPU_MILLI)
                    .count() as u64;
                let pending = ledger.pending_on(&candidates);
                let needed = k + pending;
                let short = || {
                    format!(
                        "task {tid}: asks for {k} whole GPUs{}; the agent has {idle} idle GPUs it may use{}",
                        describe(selector),
                        if pending > 0 {
                            format!(", {pending} of them promised to tasks being launched")
                        } else {
                            String::new()
                        }
                    )
                };
                if idle < needed {
                    return Err(short());
                }
                let slots: Vec<GpuSlot> = gpus
                    .iter()
                    .map(|g| GpuSlot {
                        numa_node: g.numa_node,
                        pci_root: g.pci_root.clone(),
                        healthy: g.healthy,
                        free: admits(g) && ledger.free(&g.uuid) == GPU_MILLI,
                    })
                    .collect();
                let picked = usize::try_from(k)
                    .ok()
                    .and_then(|k| topology::assign(&slots, k))
                    .ok_or_else(short)?;
                return Ok(picked
                    .into_iter()
                    .filter_map(|i| gpus.get(i))
                    .map(|g| g.uuid.clone())
                    .collect());
            }
            GpuAmount::Fraction(m) => m,
        };
        // Whole GPUs promised to launching tasks stay idle: a fraction may not take the last
        // ones of them.
        let idle = candidates
            .iter()
            .filter(|g| ledger.free(&g.uuid) == GPU_MILLI)
            .count() as u64;
        let pending = ledger.pending_on(&candidates);
        // The GPUs the placement may consider: every admissible one except idle GPUs owed to
        // whole-GPU tasks being launched (partly used ones count for the fragmentation measure
        // even when the fraction does not fit them).
        let usable: Vec<&GpuInfo> = candidates
            .iter()
            .copied()
            .filter(|g| ledger.free(&g.uuid) < GPU_MILLI || idle > pending)
            .collect();
        if !usable.iter().any(|g| ledger.free(&g.uuid) >= milli) {
            return Err(format!(
                "task {tid}: no GPU{} on the agent has {} milli-GPUs free",
                describe(selector),
                milli
            ));
        }
        let policy = self.config.gpu_placement;
        let shape = TaskShape {
            cpu_milli: 0,
            memory_mib: 0,
            gpu: GpuDemand::Fraction(milli),
            models: ModelSet::ANY,
        };
        // The expected mix: what the frameworks declared, what runs on this agent, this task,
        // and one whole GPU (keeping whole GPUs usable is always worth something).
        let whole = TaskShape {
            gpu: GpuDemand::Whole(1),
            ..shape
        };
        let workload = Workload::new(
            self.declared_gpu_shapes()
                .into_iter()
                .chain(self.agent_gpu_shapes(agent))
                .chain([(shape, 1), (whole, 1)]),
        );
        let mut models = Models::new();
        let model: ModelId = models.intern("gpu").map_err(|e| e.to_string())?;
        let node = Node {
            gpu_free: usable.iter().map(|g| ledger.free(&g.uuid)).collect(),
            ..Node::idle(model, 0, 0, 0)
        };
        let chosen = Placer::new(vec![node], policy, workload, 0)
            .ok()
            .and_then(|mut p| p.choose(&shape))
            .and_then(|p| p.gpus.first().map(|s| s.gpu))
            .and_then(|i| usable.get(i))
            .or_else(|| usable.iter().find(|g| ledger.free(&g.uuid) >= milli))
            .map(|g| g.uuid.clone());
        Ok(chosen.into_iter().collect())
    }

    /// GPU task shapes the frameworks declared (`Demand`), with their counts, as part of the
    /// workload the fragmentation-aware policies score against.
    fn declared_gpu_shapes(&self) -> Vec<(TaskShape, u64)> {
        self.frameworks
            .keys()
            .filter_map(|f| self.allocator.demand(*f))
            .filter_map(|d| Some((gpu_shape(&d.task)?, u64::from(d.count))))
            .collect()
    }

    /// GPU task shapes of the live tasks on `agent` (each counted once).
    fn agent_gpu_shapes(&self, agent: AgentId) -> Vec<(TaskShape, u64)> {
        let Some(a) = self.agents.get(&agent) else {
            return Vec::new();
        };
        a.tasks
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .filter(|t| !t.state.is_terminal())
            .filter_map(|t| Some((gpu_shape(&t.info.resources)?, 1)))
            .collect()
    }
}

/// The placement shape of a task's GPU demand (CPU and memory are the allocator's business).
fn gpu_shape(r: &gantry_proto::Resources) -> Option<TaskShape> {
    let gpu = match r.gpu_amount().ok()? {
        GpuAmount::None => return None,
        GpuAmount::Fraction(m) => GpuDemand::Fraction(m),
        GpuAmount::Whole(k) => GpuDemand::Whole(u32::try_from(k).ok()?),
    };
    Some(TaskShape {
        cpu_milli: 0,
        memory_mib: 0,
        gpu,
        models: ModelSet::ANY,
    })
}

fn describe(selector: Option<&GpuSelector>) -> String {
    match selector {
        Some(s) => format!(" matching the selector ({s})"),
        None => String::new(),
    }
}

/// Parses a `--gpu-placement` value.
pub fn parse_policy(text: &str) -> Result<Policy, String> {
    text.parse::<Policy>().map_err(|e| e.to_string())
}
