//! The policy simulator on the same core (`gantry-autoscaler simulate`): replays a workload
//! (arrivals, durations) against the pools of a configuration, with [`Core`] deciding and
//! `gantry-placement`'s best-fit [`Placer`] placing pending tasks on the registered nodes, and
//! reports cost, provisioned-GPU utilization, pending times and scale events. Pure: the trace
//! and the configuration in, a [`SimResult`] out.
//!
//! The clock advances in ticks (`tick_s`). Each tick: tasks that ended release their node;
//! arrivals join the pending queue (in arrival order); nodes whose provisioning delay passed
//! register; pending tasks are placed first-come first-served on registered nodes that are not
//! draining; what is left is the unplaceable demand of a core round, whose actions create nodes
//! (registering `provision_s` later), drain them (no more placements) and delete them. A task
//! runs for its trace duration from when it is placed. Tasks no pool's empty node can hold are
//! counted and skipped.
//!
//! The Alibaba `openb` pod lists (shared/traces/alibaba-openb) are read by [`parse_openb`]:
//! `creation_time` is the arrival, `deletion_time - creation_time` the duration (seconds).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use gantry_placement::{GpuDemand, Models, Node, Placer, Policy, TaskShape, Workload, GPU_MILLI};
use serde::Serialize;

use crate::config::Config;
use crate::core::{Action, Core, NodeObs, Observation};
use crate::plan::DemandItem;

/// A trace that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TraceError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// One task of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct SimTask {
    /// Arrival, seconds.
    pub arrival: u64,
    /// Run time once placed, seconds.
    pub duration: u64,
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub mem_mib: u64,
    /// GPUs.
    pub gpu: GpuDemand,
    /// Accepted GPU models (empty: any).
    pub models: Vec<String>,
    /// The trace's QoS class (`LS`, `BE`, ...).
    pub qos: String,
}

/// Reads an openb pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
/// pod_phase,creation_time,deletion_time,scheduled_time`).
pub fn parse_openb(text: &str) -> Result<Vec<SimTask>, TraceError> {
    let header = text.lines().next().unwrap_or("");
    if !header.contains("creation_time") || !header.contains("deletion_time") {
        return Err(TraceError {
            line: 1,
            message: "no creation_time/deletion_time columns: a replay needs them (the openb \
                      multigpuNN lists hold task shapes only)"
                .into(),
        });
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| TraceError {
            line: i + 1,
            message,
        };
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 10 {
            return Err(bad(format!("{} fields, expected 11", f.len())));
        }
        let num = |k: usize, what: &str| -> Result<u64, TraceError> {
            f[k].trim()
                .parse()
                .map_err(|_| bad(format!("{what} {:?} is not a number", f[k])))
        };
        let (gpus, milli) = (num(3, "num_gpu")?, num(4, "gpu_milli")?);
        let gpu = match (gpus, milli) {
            (0, _) => GpuDemand::None,
            (1, m) if m < u64::from(GPU_MILLI) => {
                GpuDemand::fraction(m as u32).map_err(|e| bad(e.to_string()))?
            }
            (n, _) => GpuDemand::whole(u32::try_from(n).map_err(|_| bad("num_gpu".into()))?),
        };
        let (created, deleted) = (num(8, "creation_time")?, num(9, "deletion_time")?);
        out.push(SimTask {
            arrival: created,
            duration: deleted.saturating_sub(created).max(1),
            cpu_milli: num(1, "cpu_milli")?,
            mem_mib: num(2, "memory_mib")?,
            gpu,
            models: f[5]
                .split('|')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            qos: f[6].to_string(),
        });
    }
    out.sort_by_key(|t| t.arrival);
    Ok(out)
}

/// The spot interruption model: a seeded Poisson process per spot node. Each spot node gets
/// its termination notice an exponentially distributed time after it registers, with rate
/// `rate_per_node_hour` (so the chance of a notice within any hour of a node's life is
/// `1 − e^(−rate)`, the same for every hour: the process is memoryless). A node's draw depends
/// on the seed and its id only, so a run is reproducible and one node's fate does not depend
/// on the others'. After the notice the node drains (no new placements) and is reclaimed at the
/// notice's deadline (the configuration's `notice_deadline`): what still runs there is killed.
#[derive(Debug, Clone, Default)]
pub struct SpotModel {
    /// Notices per spot node-hour; 0: none.
    pub rate_per_node_hour: f64,
    /// The seed of the draws.
    pub seed: u64,
    /// Exact notice times for chosen nodes, seconds after they register (overrides the rate).
    pub fixed: BTreeMap<String, u64>,
}

impl SpotModel {
    /// Seconds after it registers at which spot node `id` gets its notice (`None`: never).
    pub fn notice_after(&self, id: &str) -> Option<u64> {
        use rand::{RngExt, SeedableRng};
        if let Some(&s) = self.fixed.get(id) {
            return Some(s);
        }
        if !(self.rate_per_node_hour.is_finite() && self.rate_per_node_hour > 0.0) {
            return None;
        }
        // FNV-1a of the id, mixed with the seed.
        let tag = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(self.seed ^ tag);
        // U in (0, 1]: -ln(U) is an exponential draw of mean 1.
        let u: f64 = 1.0 - rng.random::<f64>();
        let hours = -u.ln() / self.rate_per_node_hour;
        Some((hours * 3600.0).round().min(u64::MAX as f64 / 2.0) as u64)
    }
}

/// Of `ran` seconds a task ran since its attempt started, what a kill keeps (the whole
/// checkpoint intervals: it restarts from its last checkpoint) and what it loses; `interval`
/// 0: no checkpoints, everything is lost.
pub fn checkpoint_split(ran: u64, interval: u64) -> (u64, u64) {
    if interval == 0 {
        return (0, ran);
    }
    let kept = ran / interval * interval;
    (kept, ran - kept)
}

/// Simulation settings.
#[derive(Debug, Clone)]
pub struct SimSettings {
    /// Seconds per tick (the core runs once per tick).
    pub tick_s: u64,
    /// Seconds from a create to the node registering.
    pub provision_s: u64,
    /// Spot notices.
    pub spot: SpotModel,
    /// Checkpoint interval per QoS class, seconds of run time (a class not listed, or 0:
    /// no checkpoints).
    pub checkpoint_s: BTreeMap<String, u64>,
    /// QoS classes that prefer on-demand capacity: their tasks are placed on on-demand nodes
    /// and planned on on-demand pools only (when some on-demand pool can hold them).
    pub on_demand_classes: Vec<String>,
}

impl SimSettings {
    /// No spot notices; `BE` and `Burstable` tasks checkpoint every 10 minutes and may run on
    /// spot; `LS` and `Guaranteed` tasks (services) do not checkpoint and prefer on-demand.
    pub fn new(tick_s: u64, provision_s: u64) -> SimSettings {
        SimSettings {
            tick_s,
            provision_s,
            spot: SpotModel::default(),
            checkpoint_s: BTreeMap::from([("BE".into(), 600), ("Burstable".into(), 600)]),
            on_demand_classes: vec!["LS".into(), "Guaranteed".into()],
        }
    }
}

/// What a run cost and how it served the workload.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SimResult {
    /// Sum over pools of node-seconds × price.
    pub cost: f64,
    /// Per pool: cost.
    pub cost_per_pool: BTreeMap<String, f64>,
    /// Allocated GPU time over provisioned GPU time (all nodes, any phase).
    pub gpu_utilization: f64,
    /// Provisioned GPU-hours.
    pub gpu_hours: f64,
    /// Pending time (arrival to first placement), seconds, median.
    pub pending_p50_s: u64,
    /// 99th percentile.
    pub pending_p99_s: u64,
    /// Tasks placed (at least once).
    pub placed: u64,
    /// Tasks that ran to their end.
    pub finished: u64,
    /// Tasks no pool can hold (skipped).
    pub unfittable: u64,
    /// Tasks still pending at the end.
    pub never_placed: u64,
    /// Scale-up decisions.
    pub scale_ups: u64,
    /// Nodes drained for idleness.
    pub scale_downs: u64,
    /// Nodes created.
    pub nodes_created: u64,
    /// Most nodes at once, per pool.
    pub peak_nodes: BTreeMap<String, u32>,
    /// Spot notices (nodes interrupted), all pools.
    pub interruptions: u64,
    /// Nodes the core created to replace interrupted ones.
    pub replacements: u64,
    /// Of those, in an on-demand fallback pool.
    pub fallback_replacements: u64,
    /// Tasks killed when an interrupted node was reclaimed (each kill counts).
    pub tasks_interrupted: u64,
    /// Tasks killed at least once that then ran to their end (interruptions survived).
    pub interrupted_tasks_finished: u64,
    /// Run time lost to kills: seconds run since the task's last checkpoint, summed.
    pub work_lost_task_s: u64,
    /// The same, weighted by the tasks' GPUs (GPU-seconds).
    pub work_lost_gpu_s: f64,
    /// Simulated seconds.
    pub span_s: u64,
}

struct SimNode {
    id: String,
    pool: usize,
    spot: bool,
    ready_at: u64,
    draining: bool,
    /// When its notice comes (spot).
    notice_at: Option<u64>,
    /// When it is reclaimed (its notice's deadline), once noticed.
    reclaim_at: Option<u64>,
    node: Node,
    tasks: u32,
}

fn shape_of(t: &SimTask, models: &mut Models) -> TaskShape {
    TaskShape {
        cpu_milli: t.cpu_milli,
        memory_mib: t.mem_mib,
        gpu: t.gpu,
        models: models
            .set(t.models.iter().map(String::as_str))
            .unwrap_or_default(),
    }
}

/// Gives `task`'s resources back to its node.
fn release(n: &mut SimNode, sh: &TaskShape, gpus: Vec<gantry_placement::GpuShare>) {
    n.node.cpu_free += sh.cpu_milli;
    n.node.memory_free += sh.memory_mib;
    for g in gpus {
        if let Some(f) = n.node.gpu_free.get_mut(g.gpu) {
            *f = (*f + g.milli).min(GPU_MILLI);
        }
    }
    n.tasks = n.tasks.saturating_sub(1);
}

/// Places `pending` tasks (in order) on `usable` nodes with the best-fit placer, on-demand
/// preferring tasks (`no_spot`) on on-demand nodes only, the others on spot nodes first;
/// returns the placed tasks with their node index and GPU shares, and the tasks left.
#[allow(clippy::type_complexity)]
fn place(
    nodes: &mut [SimNode],
    usable: &[usize],
    pending: &[usize],
    shapes: &[TaskShape],
    no_spot: &[bool],
) -> (
    Vec<(usize, usize, Vec<gantry_placement::GpuShare>)>,
    Vec<usize>,
) {
    let groups: [Vec<usize>; 2] = [
        usable.iter().copied().filter(|&i| nodes[i].spot).collect(),
        usable.iter().copied().filter(|&i| !nodes[i].spot).collect(),
    ];
    let mut placers: Vec<Option<Placer>> = groups
        .iter()
        .map(|g| {
            let list = g.iter().map(|&i| nodes[i].node.clone()).collect();
            (!g.is_empty())
                .then(|| Placer::new(list, Policy::BestFit, Workload::default(), 0).ok())
                .flatten()
        })
        .collect();
    let (mut placed, mut left) = (Vec::new(), Vec::new());
    for &task in pending {
        let sh = &shapes[task];
        let order: &[usize] = if no_spot[task] { &[1] } else { &[0, 1] };
        let mut done = false;
        for &g in order {
            let Some(placer) = placers[g].as_mut() else {
                continue;
            };
            if let Some(p) = placer.choose(sh) {
                if placer.commit(&p, sh).is_ok() {
                    placed.push((task, groups[g][p.node], p.gpus.clone()));
                    done = true;
                    break;
                }
            }
        }
        if !done {
            left.push(task);
        }
    }
    for (g, placer) in placers.iter().enumerate() {
        if let Some(placer) = placer {
            for (k, &i) in groups[g].iter().enumerate() {
                nodes[i].node = placer.nodes()[k].clone();
            }
        }
    }
    for &(_, i, _) in &placed {
        nodes[i].tasks += 1;
    }
    (placed, left)
}

/// Replays `tasks` (sorted by arrival) against `config`'s pools (see the module docs).
pub fn simulate(config: &Config, tasks: &[SimTask], s: &SimSettings) -> SimResult {
    let tick = s.tick_s.max(1);
    let notice_s = config.autoscaler.notice_deadline.as_secs();
    let mut core = Core::new(config.clone());
    let mut models = Models::new();
    // A pool whose model cannot be interned (past 64 models) gets no node and holds nothing.
    let pool_nodes: Vec<Option<Node>> = config
        .pools
        .iter()
        .map(|p| {
            let m = models.intern(p.gpu_model.as_deref().unwrap_or("")).ok()?;
            Some(Node::idle(
                m,
                (p.cpus * 1000.0) as u64,
                p.mem,
                p.gpus as usize,
            ))
        })
        .collect();
    let total_min: usize = config.pools.iter().map(|p| p.min as usize).sum();
    let mut stuck_ticks = 0u32;
    let shapes: Vec<TaskShape> = tasks.iter().map(|t| shape_of(t, &mut models)).collect();
    // Tasks kept off spot: their class prefers on-demand and an on-demand pool can hold them.
    let no_spot: Vec<bool> = tasks
        .iter()
        .zip(&shapes)
        .map(|(t, sh)| {
            s.on_demand_classes.contains(&t.qos)
                && config
                    .pools
                    .iter()
                    .zip(&pool_nodes)
                    .any(|(p, n)| !p.spot && n.as_ref().is_some_and(|n| n.fits(sh)))
        })
        .collect();
    let mut r = SimResult::default();
    let mut nodes: Vec<SimNode> = Vec::new();
    let mut next_id = 0u64;
    let mut pending: Vec<usize> = Vec::new();
    // Per task: run time still to go, when its attempt started, its attempt, its node.
    let mut left: Vec<u64> = tasks.iter().map(|t| t.duration).collect();
    let mut run_start = vec![0u64; tasks.len()];
    let mut attempt = vec![0u32; tasks.len()];
    let mut node_of: Vec<Option<String>> = vec![None; tasks.len()];
    let mut killed = vec![false; tasks.len()];
    let mut placed_once = vec![false; tasks.len()];
    let mut live = 0usize;
    // (end, task, attempt)
    let mut running: BinaryHeap<Reverse<(u64, usize, u32)>> = BinaryHeap::new();
    let mut placement: BTreeMap<usize, Vec<gantry_placement::GpuShare>> = BTreeMap::new();
    let mut waits: Vec<u64> = Vec::new();
    let mut arrived = 0usize;
    let start = tasks.first().map_or(0, |t| t.arrival);
    let mut t = start;
    let (mut gpu_ms_provisioned, mut gpu_ms_used) = (0u128, 0u128);
    loop {
        // Departures (a task whose node was reclaimed before its end is not one).
        while running.peek().is_some_and(|Reverse((end, _, _))| *end <= t) {
            let Some(Reverse((end, task, at))) = running.pop() else {
                break;
            };
            if attempt[task] != at {
                continue;
            }
            let Some(id) = node_of[task].clone() else {
                continue;
            };
            let Some(n) = nodes.iter_mut().find(|n| n.id == id) else {
                continue;
            };
            if n.reclaim_at.is_some_and(|r| r < end) {
                continue; // killed there first (below)
            }
            release(
                n,
                &shapes[task],
                placement.remove(&task).unwrap_or_default(),
            );
            node_of[task] = None;
            live -= 1;
            r.finished += 1;
            r.interrupted_tasks_finished += u64::from(killed[task]);
        }
        // Reclaims: interrupted nodes at their notice's deadline; what runs there is killed
        // and requeued, keeping the run time up to its last checkpoint.
        let reclaimed: Vec<(String, u64)> = nodes
            .iter()
            .filter_map(|n| Some((n.id.clone(), n.reclaim_at.filter(|&x| x <= t)?)))
            .collect();
        for (id, at) in reclaimed {
            for task in 0..tasks.len() {
                if node_of[task].as_deref() != Some(id.as_str()) {
                    continue;
                }
                let ran = at.saturating_sub(run_start[task]);
                let every = s.checkpoint_s.get(&tasks[task].qos).copied().unwrap_or(0);
                let (kept, lost) = checkpoint_split(ran, every);
                left[task] = left[task].saturating_sub(kept).max(1);
                r.work_lost_task_s += lost;
                r.work_lost_gpu_s += lost as f64 * tasks[task].gpu.milli() as f64 / 1000.0;
                r.tasks_interrupted += 1;
                killed[task] = true;
                attempt[task] += 1;
                node_of[task] = None;
                placement.remove(&task);
                live -= 1;
                pending.push(task);
            }
            nodes.retain(|n| n.id != id);
            core.deleted(&id, (at.max(start) - start) * 1000);
        }
        // Arrivals (tasks no pool can hold are skipped).
        while arrived < tasks.len() && tasks[arrived].arrival <= t {
            if pool_nodes
                .iter()
                .flatten()
                .any(|n| n.fits(&shapes[arrived]))
            {
                pending.push(arrived);
            } else {
                r.unfittable += 1;
            }
            arrived += 1;
        }
        // First come first served (requeued tasks keep their arrival).
        pending.sort_by_key(|&i| (tasks[i].arrival, i));
        // Notices: the node drains itself (as `gantry-agent notice-termination` does) and is
        // reclaimed at the deadline.
        for n in &mut nodes {
            if let Some(at) = n.notice_at.filter(|&x| x <= t && n.reclaim_at.is_none()) {
                n.reclaim_at = Some(at + notice_s);
                n.draining = true;
            }
        }
        // Placement on registered, not draining nodes.
        if !pending.is_empty() {
            let usable: Vec<usize> = (0..nodes.len())
                .filter(|&i| nodes[i].ready_at <= t && !nodes[i].draining)
                .collect();
            if !usable.is_empty() {
                let (placed, rest) = place(&mut nodes, &usable, &pending, &shapes, &no_spot);
                for (task, i, gpus) in placed {
                    running.push(Reverse((t + left[task], task, attempt[task])));
                    node_of[task] = Some(nodes[i].id.clone());
                    run_start[task] = t;
                    placement.insert(task, gpus);
                    live += 1;
                    if !placed_once[task] {
                        placed_once[task] = true;
                        waits.push(t - tasks[task].arrival);
                        r.placed += 1;
                    }
                }
                pending = rest;
            }
        }
        // A core round.
        let mut demand: BTreeMap<(u64, u64, GpuDemand, Vec<String>, bool), u32> = BTreeMap::new();
        for &task in &pending {
            let x = &tasks[task];
            *demand
                .entry((
                    x.cpu_milli,
                    x.mem_mib,
                    x.gpu,
                    x.models.clone(),
                    no_spot[task],
                ))
                .or_default() += 1;
        }
        let obs = Observation {
            demand: demand
                .into_iter()
                .map(|((cpu, mem, gpu, models, on_demand), count)| DemandItem {
                    source: "trace".into(),
                    cpu_milli: cpu,
                    mem_mib: mem,
                    gpu,
                    models,
                    on_demand,
                    count,
                })
                .collect(),
            nodes: nodes
                .iter()
                .map(|n| NodeObs {
                    id: n.id.clone(),
                    registered: n.ready_at <= t,
                    busy: n.tasks > 0,
                    draining: n.draining,
                    notice: n.reclaim_at.is_some(),
                })
                .collect(),
            tasks: Vec::new(),
        };
        let now_ms = (t - start) * 1000;
        for a in core.step(now_ms, &obs) {
            match a {
                Action::Create {
                    pool,
                    count,
                    reason,
                } => {
                    let Some(p) = config.pools.iter().position(|x| x.name == pool) else {
                        continue;
                    };
                    let Some(empty) = pool_nodes[p].clone() else {
                        continue;
                    };
                    if reason == "replace" {
                        r.replacements += u64::from(count);
                        if !config.pools[p].spot {
                            r.fallback_replacements += u64::from(count);
                        }
                    }
                    let spot = config.pools[p].spot;
                    let mut ids = Vec::new();
                    for _ in 0..count {
                        next_id += 1;
                        let id = format!("{pool}-{next_id}");
                        let ready_at = t + s.provision_s;
                        nodes.push(SimNode {
                            notice_at: spot
                                .then(|| s.spot.notice_after(&id))
                                .flatten()
                                .map(|after| ready_at.saturating_add(after)),
                            id: id.clone(),
                            pool: p,
                            spot,
                            ready_at,
                            draining: false,
                            reclaim_at: None,
                            node: empty.clone(),
                            tasks: 0,
                        });
                        ids.push(id);
                    }
                    core.created(&pool, &ids, now_ms);
                }
                Action::Drain { node, .. } => {
                    if let Some(n) = nodes.iter_mut().find(|n| n.id == node) {
                        n.draining = true;
                    }
                }
                Action::Delete { node } => {
                    nodes.retain(|n| n.id != node || n.tasks > 0);
                    if !nodes.iter().any(|n| n.id == node) {
                        core.deleted(&node, now_ms);
                    }
                }
            }
        }
        for (p, spec) in config.pools.iter().enumerate() {
            let n = nodes.iter().filter(|n| n.pool == p).count() as u32;
            let e = r.peak_nodes.entry(spec.name.clone()).or_default();
            *e = (*e).max(n);
        }
        // This tick's GPU time.
        for n in &nodes {
            let cap = n.node.gpu_free.len() as u128 * u128::from(GPU_MILLI);
            gpu_ms_provisioned += cap * u128::from(tick);
            gpu_ms_used += (cap - n.node.gpu_free_total() as u128) * u128::from(tick);
        }
        let settled = arrived == tasks.len() && live == 0;
        if settled && pending.is_empty() && nodes.len() <= total_min {
            break;
        }
        // Pending tasks that fit a pool but none with room, with nothing left to free any.
        stuck_ticks = if settled && !pending.is_empty() {
            stuck_ticks + 1
        } else {
            0
        };
        if stuck_ticks > 1000 {
            break;
        }
        t += tick;
        if t - start > 400 * 24 * 3600 {
            break; // a bound: the trace spans ~150 days
        }
    }
    let report = core.report((t - start) * 1000);
    r.never_placed = pending.len() as u64;
    r.cost = report.total_cost;
    r.cost_per_pool = report
        .pools
        .iter()
        .map(|p| (p.name.clone(), p.cost))
        .collect();
    r.scale_ups = report.pools.iter().map(|p| p.scale_ups).sum();
    r.scale_downs = report.pools.iter().map(|p| p.scale_downs).sum();
    r.nodes_created = report.pools.iter().map(|p| p.nodes_created).sum();
    r.interruptions = report.pools.iter().map(|p| p.interruptions).sum();
    r.gpu_hours = gpu_ms_provisioned as f64 / 1000.0 / 3600.0;
    r.gpu_utilization = if gpu_ms_provisioned == 0 {
        0.0
    } else {
        gpu_ms_used as f64 / gpu_ms_provisioned as f64
    };
    waits.sort_unstable();
    let pct = |q: f64| {
        if waits.is_empty() {
            0
        } else {
            waits[((waits.len() - 1) as f64 * q).round() as usize]
        }
    };
    r.pending_p50_s = pct(0.5);
    r.pending_p99_s = pct(0.99);
    r.span_s = t - start;
    r
}

/// `config` with every pool fixed at `peak[pool]` nodes (min = max): a static fleet sized for
/// the peak of an elastic run. A spot pool with a `fallback` counts on its on-demand fallback
/// (a static fleet is bought on demand); one without stays spot.
pub fn static_fleet(config: &Config, peak: &BTreeMap<String, u32>) -> Config {
    let mut c = config.clone();
    let mut peak = peak.clone();
    for p in &config.pools {
        if let (true, Some(f)) = (p.spot, &p.fallback) {
            let n = peak.remove(&p.name).unwrap_or(0);
            *peak.entry(f.clone()).or_default() += n;
        }
    }
    c.pools
        .retain(|p| peak.get(&p.name).copied().unwrap_or(0) > 0);
    for p in &mut c.pools {
        let n = peak.get(&p.name).copied().unwrap_or(0);
        p.min = n;
        p.max = n;
        p.fallback = None;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOLS: &str = r#"
        [[pool]]
        name = "gpu"
        cpus = 16
        mem = 65536
        gpus = 2
        gpu_model = "G2"
        price_per_hour = 3.6
        max = 10
        scale_down_cooldown = "10m"
        provider = { kind = "local" }
    "#;

    const TRACE: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,1000,1024,1,1000,,LS,Running,0,3600,0
p1,1000,1024,1,1000,,LS,Running,0,3600,0
p2,1000,1024,1,500,,BE,Running,1800,5400,1800
p3,1000,1024,8,1000,,BE,Running,1800,5400,1800
";

    #[test]
    fn the_openb_format_is_read() {
        let t = parse_openb(TRACE).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t[2].gpu, GpuDemand::Fraction(500));
        assert_eq!(t[3].gpu, GpuDemand::Whole(8));
        assert_eq!((t[0].arrival, t[0].duration), (0, 3600));
        assert_eq!(t[2].qos, "BE");
        let header = TRACE.lines().next().unwrap();
        let e = parse_openb(&format!("{header}\np,x,1,1,1,,LS,R,0,1,0\n")).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("cpu_milli"), "{e}");
        let e =
            parse_openb("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1\n").unwrap_err();
        assert!(e.message.contains("creation_time"), "{e}");
    }

    #[test]
    fn an_elastic_fleet_serves_the_trace_and_costs_less_than_a_static_peak_one() {
        let config = Config::parse(POOLS).unwrap();
        let tasks = parse_openb(TRACE).unwrap();
        let s = SimSettings::new(60, 120);
        let elastic = simulate(&config, &tasks, &s);
        assert_eq!(elastic.placed, 3, "{elastic:?}");
        assert_eq!(elastic.unfittable, 1, "the 8-GPU task: {elastic:?}");
        assert_eq!(elastic.never_placed, 0);
        // Two 1-GPU tasks fill the first node; the half-GPU task, later, needs a second.
        assert_eq!(elastic.nodes_created, 2, "{elastic:?}");
        assert_eq!(elastic.pending_p50_s, 120, "{elastic:?}");
        assert_eq!(elastic.peak_nodes["gpu"], 2);
        assert_eq!(elastic.scale_downs, 2);
        let fixed = simulate(&static_fleet(&config, &elastic.peak_nodes), &tasks, &s);
        assert_eq!(fixed.placed, 3);
        assert!(
            elastic.cost > 0.0 && elastic.cost <= fixed.cost,
            "{elastic:?} {fixed:?}"
        );
    }

    const SPOT_POOLS: &str = r#"
        [autoscaler]
        notice_deadline = "2m"
        spot_failures_before_fallback = 1

        [[pool]]
        name = "spot"
        cpus = 16
        mem = 65536
        gpus = 2
        gpu_model = "G2"
        price_per_hour = 1.0
        spot = true
        fallback = "od"
        max = 10
        scale_down_cooldown = "10m"
        provider = { kind = "local" }

        [[pool]]
        name = "od"
        cpus = 16
        mem = 65536
        gpus = 2
        gpu_model = "G2"
        price_per_hour = 3.0
        max = 10
        scale_down_cooldown = "10m"
        provider = { kind = "local" }
    "#;

    #[test]
    fn the_interruption_model_is_seeded_memoryless_and_at_its_rate() {
        let m = SpotModel {
            rate_per_node_hour: 0.5,
            seed: 7,
            fixed: BTreeMap::from([("pinned".to_string(), 42)]),
        };
        // Reproducible, per node id; the fixed time wins.
        assert_eq!(m.notice_after("a-1"), m.notice_after("a-1"));
        assert_ne!(m.notice_after("a-1"), m.notice_after("a-2"));
        assert_eq!(m.notice_after("pinned"), Some(42));
        let other = SpotModel {
            seed: 8,
            ..m.clone()
        };
        assert_ne!(m.notice_after("a-1"), other.notice_after("a-1"));
        // No rate, no notices.
        assert_eq!(SpotModel::default().notice_after("a-1"), None);
        // An exponential of rate 0.5/h: mean 2 h, and P(notice within an hour) = 1 - e^-0.5
        // (39.3%), over 4,000 nodes.
        let draws: Vec<u64> = (0..4000)
            .map(|i| m.notice_after(&format!("n-{i}")).unwrap())
            .collect();
        let mean_h = draws.iter().sum::<u64>() as f64 / draws.len() as f64 / 3600.0;
        assert!((mean_h - 2.0).abs() < 0.1, "mean {mean_h} h");
        let first_hour = draws.iter().filter(|&&s| s < 3600).count() as f64 / 4000.0;
        assert!((first_hour - 0.393).abs() < 0.03, "{first_hour}");
        // Memoryless: of the nodes that lived an hour, the same share goes in the second.
        let lived: Vec<u64> = draws.iter().copied().filter(|&s| s >= 3600).collect();
        let second = lived.iter().filter(|&&s| s < 7200).count() as f64 / lived.len() as f64;
        assert!((second - 0.393).abs() < 0.04, "{second}");
    }

    #[test]
    fn a_kill_keeps_whole_checkpoint_intervals() {
        assert_eq!(checkpoint_split(1120, 600), (600, 520));
        assert_eq!(checkpoint_split(1200, 600), (1200, 0));
        assert_eq!(checkpoint_split(599, 600), (0, 599));
        assert_eq!(checkpoint_split(1120, 0), (0, 1120), "no checkpoints");
        assert_eq!(checkpoint_split(0, 600), (0, 0));
    }

    #[test]
    fn an_interrupted_task_loses_what_ran_since_its_checkpoint_and_finishes_on_demand() {
        let config = Config::parse(SPOT_POOLS).unwrap();
        let header = TRACE.lines().next().unwrap();
        let tasks = parse_openb(&format!(
            "{header}\nbe,1000,1024,1,1000,,BE,Running,0,3600,0\n"
        ))
        .unwrap();
        let mut s = SimSettings::new(60, 120);
        // The first spot node (`spot-1`, registered at 120 s) gets its notice 1,000 s later.
        s.spot.fixed.insert("spot-1".into(), 1000);
        let r = simulate(&config, &tasks, &s);
        // The BE task goes to spot (3x cheaper), placed at 120 s. Notice at 1,120 s (seen at
        // the 1,140 s tick): the node drains and the core replaces it on demand (one
        // interruption in a row is the fallback's threshold); reclaimed at 1,240 s: the task
        // ran 1,120 s, kept 600 (its checkpoint), lost 520; the on-demand node registers at
        // 1,260 s and runs the remaining 3,000 s.
        assert_eq!(r.interruptions, 1, "{r:?}");
        assert_eq!(r.tasks_interrupted, 1, "{r:?}");
        assert_eq!(r.interrupted_tasks_finished, 1, "{r:?}");
        assert_eq!(r.finished, 1);
        assert_eq!(r.work_lost_task_s, 520, "{r:?}");
        assert!((r.work_lost_gpu_s - 520.0).abs() < 1e-9);
        assert_eq!((r.replacements, r.fallback_replacements), (1, 1), "{r:?}");
        assert_eq!(r.pending_p50_s, 120, "first placement only");
        assert_eq!(r.peak_nodes["spot"], 1);
        assert_eq!(r.peak_nodes["od"], 1);
        // Cost: the spot node from 0 to its reclaim (1,240 s) at 1/h; the on-demand node from
        // 1,140 s to its scale-down (its task ends at 4,260 s, then 10 min idle, then a tick
        // to drain and one to delete) at 3/h.
        let spot = r.cost_per_pool["spot"];
        assert!((spot - 1240.0 / 3600.0).abs() < 1e-9, "{spot}");
        let od_s = r.cost_per_pool["od"] * 3600.0 / 3.0;
        assert!(
            (4260.0 + 600.0 - 1140.0..=4260.0 + 600.0 + 180.0 - 1140.0).contains(&od_s),
            "{od_s}"
        );

        // Without the notice: no loss, one spot node, cheaper.
        let calm = simulate(&config, &tasks, &SimSettings::new(60, 120));
        assert_eq!((calm.interruptions, calm.work_lost_task_s), (0, 0));
        assert!(calm.cost < r.cost);
        // A class that does not checkpoint loses everything it ran.
        let mut s2 = s.clone();
        s2.checkpoint_s.clear();
        let r2 = simulate(&config, &tasks, &s2);
        assert_eq!(r2.work_lost_task_s, 1120, "{r2:?}");
    }

    #[test]
    fn latency_sensitive_tasks_run_on_demand_and_best_effort_ones_on_spot() {
        let config = Config::parse(SPOT_POOLS).unwrap();
        let header = TRACE.lines().next().unwrap();
        let tasks = parse_openb(&format!(
            "{header}\nls,1000,1024,1,1000,,LS,Running,0,3600,0\n\
             be,1000,1024,1,1000,,BE,Running,0,3600,0\n"
        ))
        .unwrap();
        let r = simulate(&config, &tasks, &SimSettings::new(60, 120));
        assert_eq!(r.finished, 2);
        // One node of each: the LS task's on demand though spot is cheaper, the BE task's on
        // spot (one 2-GPU node could have held both).
        assert_eq!((r.peak_nodes["od"], r.peak_nodes["spot"]), (1, 1), "{r:?}");
        // Without QoS acted on: one spot node holds both.
        let mut s = SimSettings::new(60, 120);
        s.on_demand_classes.clear();
        let r = simulate(&config, &tasks, &s);
        assert_eq!((r.peak_nodes["od"], r.peak_nodes["spot"]), (0, 1), "{r:?}");
        // The static fleet is bought on demand: the spot pool's peak counts on its fallback.
        let fixed = static_fleet(&config, &r.peak_nodes);
        assert_eq!(fixed.pools.len(), 1);
        assert_eq!(
            (fixed.pools[0].name.as_str(), fixed.pools[0].min),
            ("od", 1)
        );
    }
}
