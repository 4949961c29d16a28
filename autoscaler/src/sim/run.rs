//! The replay loop ([`simulate`]) and the static peak fleet it is compared with
//! ([`static_fleet`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use gantry_placement::{GpuDemand, Models, Node, Placer, Policy, TaskShape, Workload, GPU_MILLI};

use super::{checkpoint_split, kill_split, SimResult, SimSettings, SimTask};
use crate::config::Config;
use crate::core::{Action, Core, NodeObs, Observation};
use crate::cost::TaskObs;
use crate::plan::DemandItem;

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
    /// When its notice came.
    noticed_at: Option<u64>,
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
    // The tasks running (for consolidation's observation and moves).
    let mut live_set: std::collections::BTreeSet<usize> = std::collections::BTreeSet::new();
    let mut next_notice = 0usize;
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
            live_set.remove(&task);
            r.finished += 1;
            r.interrupted_tasks_finished += u64::from(killed[task]);
        }
        // Reclaims: interrupted nodes at their notice's deadline; what runs there is killed
        // and requeued, keeping the run time up to its last checkpoint.
        let noticed: BTreeMap<String, Option<u64>> =
            nodes.iter().map(|n| (n.id.clone(), n.noticed_at)).collect();
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
                let since_notice = noticed
                    .get(&id)
                    .copied()
                    .flatten()
                    .map(|n| at.saturating_sub(n.max(run_start[task])));
                let grace = s.checkpoint_on_notice.get(&tasks[task].qos).copied();
                let (kept, lost) = kill_split(ran, since_notice, every, grace);
                left[task] = left[task].saturating_sub(kept).max(1);
                r.work_lost_task_s += lost;
                r.work_lost_gpu_s += lost as f64 * tasks[task].gpu.milli() as f64 / 1000.0;
                r.tasks_interrupted += 1;
                killed[task] = true;
                attempt[task] += 1;
                node_of[task] = None;
                placement.remove(&task);
                live -= 1;
                live_set.remove(&task);
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
        // The file's notices: to the node named, or the pool's busiest registered node not
        // already leaving.
        while next_notice < s.interruptions.len()
            && start.saturating_add(s.interruptions[next_notice].at_s) <= t
        {
            let x = &s.interruptions[next_notice];
            next_notice += 1;
            let at = start.saturating_add(x.at_s);
            let target = nodes
                .iter_mut()
                .filter(|n| {
                    config.pools[n.pool].name == x.pool
                        && n.ready_at <= t
                        && n.reclaim_at.is_none()
                        && x.node.as_ref().is_none_or(|id| *id == n.id)
                        && (x.node.is_some() || !n.draining)
                })
                .max_by_key(|n| (n.tasks, Reverse(n.ready_at)));
            match target {
                Some(n) => n.notice_at = Some(n.notice_at.map_or(at, |y| y.min(at))),
                None => r.interruptions_missed += 1,
            }
        }
        for n in &mut nodes {
            if let Some(at) = n.notice_at.filter(|&x| x <= t && n.reclaim_at.is_none()) {
                n.noticed_at = Some(at);
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
                    live_set.insert(task);
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
            // Consolidation looks at where tasks run.
            tasks: if config.autoscaler.consolidation {
                live_set
                    .iter()
                    .filter_map(|&task| {
                        Some(TaskObs {
                            id: task.to_string(),
                            node: node_of[task].clone()?,
                            cpus: tasks[task].cpu_milli as f64 / 1000.0,
                            mem: tasks[task].mem_mib as f64,
                            gpus: tasks[task].gpu.milli() as f64 / f64::from(GPU_MILLI),
                            role: String::new(),
                            framework: String::new(),
                            user: String::new(),
                            staged_ms: 0,
                        })
                    })
                    .collect()
            } else {
                Vec::new()
            },
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
                            noticed_at: None,
                            node: empty.clone(),
                            tasks: 0,
                        });
                        ids.push(id);
                    }
                    core.created(&pool, &ids, now_ms);
                }
                Action::Drain {
                    node,
                    deadline_secs,
                } => {
                    let Some(i) = nodes.iter().position(|n| n.id == node) else {
                        continue;
                    };
                    nodes[i].draining = true;
                    // A consolidation's drain (a deadline, no notice): the frameworks move its
                    // tasks now. A class that checkpoints on notice keeps all its run time;
                    // a service class (on-demand) restarts elsewhere with the lifetime it has
                    // left; others keep their periodic checkpoints.
                    if deadline_secs.is_none() || nodes[i].reclaim_at.is_some() {
                        continue;
                    }
                    let on: Vec<usize> = live_set
                        .iter()
                        .copied()
                        .filter(|&task| node_of[task].as_deref() == Some(node.as_str()))
                        .collect();
                    for task in on {
                        let x = &tasks[task];
                        let ran = t.saturating_sub(run_start[task]);
                        let every = s.checkpoint_s.get(&x.qos).copied().unwrap_or(0);
                        let (kept, lost) = if s.checkpoint_on_notice.contains_key(&x.qos)
                            || s.on_demand_classes.contains(&x.qos)
                        {
                            (ran, 0)
                        } else {
                            checkpoint_split(ran, every)
                        };
                        left[task] = left[task].saturating_sub(kept).max(1);
                        r.work_lost_task_s += lost;
                        r.work_lost_gpu_s += lost as f64 * x.gpu.milli() as f64 / 1000.0;
                        r.moved_tasks += 1;
                        r.moved_task_s += left[task];
                        release(
                            &mut nodes[i],
                            &shapes[task],
                            placement.remove(&task).unwrap_or_default(),
                        );
                        attempt[task] += 1;
                        node_of[task] = None;
                        live -= 1;
                        live_set.remove(&task);
                        pending.push(task);
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
    r.consolidations = report.pools.iter().map(|p| p.consolidations).sum();
    r.replaced_by_cheaper = report.pools.iter().map(|p| p.replaced_by_cheaper).sum();
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

/// [`simulate`], and with consolidation on, the same run with it off too: the result's
/// `consolidation_saved` is the cost difference (what consolidation saved; negative when it
/// cost more).
pub fn simulate_consolidation(config: &Config, tasks: &[SimTask], s: &SimSettings) -> SimResult {
    let mut r = simulate(config, tasks, s);
    if config.autoscaler.consolidation {
        let mut off = config.clone();
        off.autoscaler.consolidation = false;
        r.consolidation_saved = simulate(&off, tasks, s).cost - r.cost;
    }
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
