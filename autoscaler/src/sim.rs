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

/// Simulation settings.
#[derive(Debug, Clone, Copy)]
pub struct SimSettings {
    /// Seconds per tick (the core runs once per tick).
    pub tick_s: u64,
    /// Seconds from a create to the node registering.
    pub provision_s: u64,
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
    /// Pending time (arrival to placement), seconds, median.
    pub pending_p50_s: u64,
    /// 99th percentile.
    pub pending_p99_s: u64,
    /// Tasks placed.
    pub placed: u64,
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
    /// Simulated seconds.
    pub span_s: u64,
}

struct SimNode {
    id: String,
    pool: usize,
    ready_at: u64,
    draining: bool,
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

/// Replays `tasks` (sorted by arrival) against `config`'s pools (see the module docs).
pub fn simulate(config: &Config, tasks: &[SimTask], s: SimSettings) -> SimResult {
    let tick = s.tick_s.max(1);
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
    let mut r = SimResult::default();
    let mut nodes: Vec<SimNode> = Vec::new();
    let mut next_id = 0u64;
    let mut pending: Vec<usize> = Vec::new();
    // (end, task, node id)
    let mut running: BinaryHeap<Reverse<(u64, usize, String)>> = BinaryHeap::new();
    let mut placement: BTreeMap<usize, Vec<gantry_placement::GpuShare>> = BTreeMap::new();
    let mut waits: Vec<u64> = Vec::new();
    let mut arrived = 0usize;
    let start = tasks.first().map_or(0, |t| t.arrival);
    let mut t = start;
    let (mut gpu_ms_provisioned, mut gpu_ms_used) = (0u128, 0u128);
    loop {
        // Departures.
        while running.peek().is_some_and(|Reverse((end, _, _))| *end <= t) {
            let Some(Reverse((_, task, node))) = running.pop() else {
                break;
            };
            if let Some(n) = nodes.iter_mut().find(|n| n.id == node) {
                let sh = &shapes[task];
                n.node.cpu_free += sh.cpu_milli;
                n.node.memory_free += sh.memory_mib;
                for g in placement.remove(&task).unwrap_or_default() {
                    if let Some(f) = n.node.gpu_free.get_mut(g.gpu) {
                        *f = (*f + g.milli).min(GPU_MILLI);
                    }
                }
                n.tasks -= 1;
            }
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
        // Placement on registered, not draining nodes, first come first served.
        if !pending.is_empty() {
            let usable: Vec<usize> = (0..nodes.len())
                .filter(|&i| nodes[i].ready_at <= t && !nodes[i].draining)
                .collect();
            if !usable.is_empty() {
                let list = usable.iter().map(|&i| nodes[i].node.clone()).collect();
                if let Ok(mut placer) = Placer::new(list, Policy::BestFit, Workload::default(), 0) {
                    let mut left = Vec::new();
                    for &task in &pending {
                        let sh = &shapes[task];
                        match placer.choose(sh) {
                            Some(p) if placer.commit(&p, sh).is_ok() => {
                                let n = &mut nodes[usable[p.node]];
                                n.tasks += 1;
                                running.push(Reverse((
                                    t + tasks[task].duration,
                                    task,
                                    n.id.clone(),
                                )));
                                placement.insert(task, p.gpus.clone());
                                waits.push(t - tasks[task].arrival);
                                r.placed += 1;
                            }
                            _ => left.push(task),
                        }
                    }
                    for (k, &i) in usable.iter().enumerate() {
                        nodes[i].node = placer.nodes()[k].clone();
                    }
                    pending = left;
                }
            }
        }
        // A core round.
        let mut demand: BTreeMap<(u64, u64, GpuDemand, Vec<String>), u32> = BTreeMap::new();
        for &task in &pending {
            let x = &tasks[task];
            *demand
                .entry((x.cpu_milli, x.mem_mib, x.gpu, x.models.clone()))
                .or_default() += 1;
        }
        let obs = Observation {
            demand: demand
                .into_iter()
                .map(|((cpu, mem, gpu, models), count)| DemandItem {
                    source: "trace".into(),
                    cpu_milli: cpu,
                    mem_mib: mem,
                    gpu,
                    models,
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
                    notice: false,
                })
                .collect(),
            tasks: Vec::new(),
        };
        let now_ms = (t - start) * 1000;
        for a in core.step(now_ms, &obs) {
            match a {
                Action::Create { pool, count, .. } => {
                    let Some(p) = config.pools.iter().position(|x| x.name == pool) else {
                        continue;
                    };
                    let Some(empty) = pool_nodes[p].clone() else {
                        continue;
                    };
                    let mut ids = Vec::new();
                    for _ in 0..count {
                        next_id += 1;
                        let id = format!("{pool}-{next_id}");
                        nodes.push(SimNode {
                            id: id.clone(),
                            pool: p,
                            ready_at: t + s.provision_s,
                            draining: false,
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
        let settled = arrived == tasks.len() && running.is_empty();
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
/// the peak of an elastic run.
pub fn static_fleet(config: &Config, peak: &BTreeMap<String, u32>) -> Config {
    let mut c = config.clone();
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
        let s = SimSettings {
            tick_s: 60,
            provision_s: 120,
        };
        let elastic = simulate(&config, &tasks, s);
        assert_eq!(elastic.placed, 3, "{elastic:?}");
        assert_eq!(elastic.unfittable, 1, "the 8-GPU task: {elastic:?}");
        assert_eq!(elastic.never_placed, 0);
        // Two 1-GPU tasks fill the first node; the half-GPU task, later, needs a second.
        assert_eq!(elastic.nodes_created, 2, "{elastic:?}");
        assert_eq!(elastic.pending_p50_s, 120, "{elastic:?}");
        assert_eq!(elastic.peak_nodes["gpu"], 2);
        assert_eq!(elastic.scale_downs, 2);
        let fixed = simulate(&static_fleet(&config, &elastic.peak_nodes), &tasks, s);
        assert_eq!(fixed.placed, 3);
        assert!(
            elastic.cost > 0.0 && elastic.cost <= fixed.cost,
            "{elastic:?} {fixed:?}"
        );
    }
}
