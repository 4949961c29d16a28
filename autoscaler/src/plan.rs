//! Scale-up planning: which nodes of which pools to add for demand the fleet cannot place.
//!
//! Pure. The demand is simulated on hypothetical nodes with the live path's placement code
//! (`gantry_placement`: [`Node::fits`], a best-fit [`Placer`] per node), first-fit decreasing:
//! - tasks are taken largest first (GPUs, then CPU, then memory);
//! - a task that no pool's empty node can hold (too big, or no pool of an accepted GPU model)
//!   is reported in [`Plan::unfittable`] and never scaled for;
//! - nodes already being provisioned are filled first (they were asked for earlier demand);
//! - then, while tasks remain, one node is opened for the largest remaining task: among the
//!   pools with room left (below `max`, not cooling down) whose empty node holds it, the one
//!   whose node, filled greedily with the remaining tasks, costs least per placed unit (per
//!   milli-GPU placed when the task needs GPUs, else per milli-CPU); ties go to the cheaper
//!   node, then the pool listed first;
//! - a task that fits some pool but none with room left is counted in [`Plan::capped`];
//! - demand that prefers on-demand capacity ([`DemandItem::on_demand`]) is never planned on a
//!   spot pool while some on-demand pool's empty node can hold it (it waits for room there);
//!   spot nodes are filled with the other demand only.
//!
//! Every node planned holds at least one task, so no more nodes are asked for than the demand
//! needs. Identical consecutive nodes are planned at once (same fill while the tasks last).

use std::collections::BTreeMap;

use gantry_placement::{GpuDemand, Models, Node, Placer, Policy, TaskShape, Workload};

/// A pool as the planner sees it.
#[derive(Debug, Clone)]
pub struct PoolShape {
    /// The pool's name.
    pub name: String,
    /// CPU of one node, milli-cores.
    pub cpu_milli: u64,
    /// Memory of one node, MiB.
    pub mem_mib: u64,
    /// GPUs of one node.
    pub gpus: u32,
    /// Their model ("" without GPUs).
    pub gpu_model: String,
    /// Price per node-hour.
    pub price_per_hour: f64,
    /// Spot (interruptible) capacity: demand that prefers on-demand avoids it.
    pub spot: bool,
    /// How many nodes may be added now (max minus the nodes it has; 0 while cooling down).
    pub room: u32,
    /// Nodes asked for and not yet registered with the master.
    pub provisioning: u32,
}

/// Copies of one task shape waiting for room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemandItem {
    /// Who wants it (a framework id or name), for reports.
    pub source: String,
    /// CPU per task, milli-cores.
    pub cpu_milli: u64,
    /// Memory per task, MiB.
    pub mem_mib: u64,
    /// GPUs per task.
    pub gpu: GpuDemand,
    /// Accepted GPU models (empty: any).
    pub models: Vec<String>,
    /// Prefers on-demand capacity (e.g. the openb trace's latency-sensitive `LS` class): never
    /// planned on a spot pool while some on-demand pool's empty node can hold it.
    pub on_demand: bool,
    /// How many tasks.
    pub count: u32,
}

/// Demand no pool can ever hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unfittable {
    /// Who wants it.
    pub source: String,
    /// The task shape, as `cpus:…;mem:…;gpus:…`.
    pub task: String,
    /// Accepted models.
    pub models: Vec<String>,
    /// How many tasks.
    pub count: u32,
}

/// The planner's answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Nodes to add, per pool name.
    pub add: BTreeMap<String, u32>,
    /// Demand no pool can hold.
    pub unfittable: Vec<Unfittable>,
    /// Tasks that fit some pool but no pool with room left now.
    pub capped: u64,
    /// Tasks the planned and provisioning nodes hold.
    pub placed: u64,
}

/// Most tasks one plan looks at (the rest wait for the next round).
pub const MAX_TASKS: u64 = 1_000_000;

/// A task shape, its remaining count, and where it came from.
struct Want {
    shape: TaskShape,
    left: u64,
    item: usize,
    /// Kept off spot pools (it prefers on-demand and an on-demand pool can hold it).
    no_spot: bool,
}

impl DemandItem {
    fn label(&self) -> String {
        let mut s = format!(
            "cpus:{};mem:{}",
            self.cpu_milli as f64 / 1000.0,
            self.mem_mib
        );
        match self.gpu {
            GpuDemand::None => {}
            GpuDemand::Fraction(m) => s.push_str(&format!(";gpus:{}", f64::from(m) / 1000.0)),
            GpuDemand::Whole(k) => s.push_str(&format!(";gpus:{k}")),
        }
        s
    }
}

/// Plans the nodes to add for `demand` (see the module docs).
pub fn plan(pools: &[PoolShape], demand: &[DemandItem]) -> Plan {
    let mut out = Plan::default();
    let mut models = Models::new();
    // Interning can only fail past 64 models: such a pool or task then matches nothing.
    let pool_model: Vec<_> = pools
        .iter()
        .map(|p| models.intern(&p.gpu_model).ok())
        .collect();
    let empty: Vec<Option<Node>> = pools
        .iter()
        .zip(&pool_model)
        .map(|(p, m)| m.map(|m| Node::idle(m, p.cpu_milli, p.mem_mib, p.gpus as usize)))
        .collect();
    let mut wants: Vec<Want> = Vec::new();
    let mut budget = MAX_TASKS;
    for (i, d) in demand.iter().enumerate() {
        if d.count == 0 {
            continue;
        }
        let shape = models
            .set(d.models.iter().map(String::as_str))
            .ok()
            .map(|set| TaskShape {
                cpu_milli: d.cpu_milli,
                memory_mib: d.mem_mib,
                gpu: d.gpu,
                models: set,
            });
        let fits_somewhere = shape.is_some_and(|s| empty.iter().flatten().any(|n| n.fits(&s)));
        let Some(shape) = shape.filter(|_| fits_somewhere) else {
            out.unfittable.push(Unfittable {
                source: d.source.clone(),
                task: d.label(),
                models: d.models.clone(),
                count: d.count,
            });
            continue;
        };
        let take = u64::from(d.count).min(budget);
        budget -= take;
        out.capped += u64::from(d.count) - take;
        if take > 0 {
            let no_spot = d.on_demand
                && pools
                    .iter()
                    .zip(&empty)
                    .any(|(p, n)| !p.spot && n.as_ref().is_some_and(|n| n.fits(&shape)));
            wants.push(Want {
                shape,
                left: take,
                item: i,
                no_spot,
            });
        }
    }
    // Largest first: GPUs, then CPU, then memory; the demand's order breaks ties.
    wants.sort_by(|a, b| {
        (b.shape.gpu.milli(), b.shape.cpu_milli, b.shape.memory_mib)
            .cmp(&(a.shape.gpu.milli(), a.shape.cpu_milli, a.shape.memory_mib))
            .then(a.item.cmp(&b.item))
    });
    let workload = Workload::new(wants.iter().map(|w| (w.shape, w.left)));

    // Provisioning nodes first.
    for (p, pool) in pools.iter().enumerate() {
        let Some(node) = &empty[p] else { continue };
        for _ in 0..pool.provisioning {
            if wants.iter().all(|w| w.left == 0) {
                break;
            }
            let fill = fill_node(node, pool.spot, &wants, &workload);
            out.placed += take(&mut wants, &fill, 1);
        }
    }

    let mut room: Vec<u32> = pools.iter().map(|p| p.room).collect();
    while let Some(first) = wants.iter().position(|w| w.left > 0) {
        let shape = wants[first].shape;
        let mut best: Option<(f64, f64, usize, Vec<u64>)> = None;
        for (p, pool) in pools.iter().enumerate() {
            let Some(node) = &empty[p] else { continue };
            if room[p] == 0 || !node.fits(&shape) || (pool.spot && wants[first].no_spot) {
                continue;
            }
            let fill = fill_node(node, pool.spot, &wants, &workload);
            let units: u64 = fill
                .iter()
                .zip(&wants)
                .map(|(n, w)| {
                    n * if shape.gpu == GpuDemand::None {
                        w.shape.cpu_milli.max(1)
                    } else {
                        w.shape.gpu.milli()
                    }
                })
                .sum();
            if units == 0 {
                continue;
            }
            let per_unit = pool.price_per_hour / units as f64;
            let better = match &best {
                None => true,
                Some((u, price, _, _)) => {
                    per_unit < *u || (per_unit == *u && pool.price_per_hour < *price)
                }
            };
            if better {
                best = Some((per_unit, pool.price_per_hour, p, fill));
            }
        }
        let Some((_, _, p, fill)) = best else {
            // Fits some pool, but none with room now.
            out.capped += wants[first].left;
            wants[first].left = 0;
            continue;
        };
        // The same node again while every shape it holds has as many copies left.
        let repeat = fill
            .iter()
            .zip(&wants)
            .filter(|(n, _)| **n > 0)
            .map(|(n, w)| w.left / n)
            .min()
            .unwrap_or(1)
            .clamp(1, u64::from(room[p]));
        out.placed += take(&mut wants, &fill, repeat);
        room[p] -= repeat as u32;
        *out.add.entry(pools[p].name.clone()).or_default() += repeat as u32;
    }
    out
}

/// Takes `fill` (copies per want) `times` times; how many tasks that is.
fn take(wants: &mut [Want], fill: &[u64], times: u64) -> u64 {
    let mut n = 0;
    for (w, f) in wants.iter_mut().zip(fill) {
        let k = (f * times).min(w.left);
        w.left -= k;
        n += k;
    }
    n
}

/// How many copies of each want one empty `node` holds, largest wants first, placed with
/// the live path's placer (best-fit on this one node); a `spot` node takes no want kept off
/// spot.
fn fill_node(node: &Node, spot: bool, wants: &[Want], workload: &Workload) -> Vec<u64> {
    let mut fill = vec![0u64; wants.len()];
    let Ok(mut placer) = Placer::new(vec![node.clone()], Policy::BestFit, workload.clone(), 0)
    else {
        return fill;
    };
    for (i, w) in wants.iter().enumerate() {
        if spot && w.no_spot {
            continue;
        }
        while fill[i] < w.left {
            let Some(at) = placer.choose(&w.shape) else {
                break;
            };
            if placer.commit(&at, &w.shape).is_err() {
                break;
            }
            fill[i] += 1;
        }
    }
    fill
}

#[cfg(test)]
pub(crate) use tests::gpu_task;

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, gpus: u32, model: &str, price: f64, room: u32) -> PoolShape {
        PoolShape {
            name: name.into(),
            cpu_milli: 32_000,
            mem_mib: 256_000,
            gpus,
            gpu_model: model.into(),
            price_per_hour: price,
            spot: false,
            room,
            provisioning: 0,
        }
    }

    pub(crate) fn gpu_task(gpus: u32, count: u32, models: &[&str]) -> DemandItem {
        DemandItem {
            source: "fw".into(),
            cpu_milli: 1000,
            mem_mib: 1024,
            gpu: GpuDemand::whole(gpus),
            models: models.iter().map(|s| s.to_string()).collect(),
            on_demand: false,
            count,
        }
    }

    #[test]
    fn the_cheapest_per_placed_gpu_wins_and_no_more_nodes_than_needed() {
        // 8 one-GPU tasks: an 8-GPU node at 20/h (2.5 per GPU) beats 4-GPU nodes at 12/h (3).
        let pools = [
            pool("small", 4, "A", 12.0, 10),
            pool("big", 8, "A", 20.0, 10),
        ];
        let p = plan(&pools, &[gpu_task(1, 8, &[])]);
        assert_eq!(p.add, BTreeMap::from([("big".to_string(), 1)]));
        assert_eq!(p.placed, 8);
        // 3 tasks: a full small node (12/h for 3 GPUs = 4) beats a big one (20/3 = 6.7).
        let p = plan(&pools, &[gpu_task(1, 3, &[])]);
        assert_eq!(p.add, BTreeMap::from([("small".to_string(), 1)]));
        // 10 tasks: one big node for 8, then a small one for 2.
        let p = plan(&pools, &[gpu_task(1, 10, &[])]);
        assert_eq!(
            p.add,
            BTreeMap::from([("big".to_string(), 1), ("small".to_string(), 1)])
        );
    }

    #[test]
    fn max_sizes_and_model_selectors_are_respected() {
        let pools = [pool("a", 4, "A100", 4.0, 1), pool("h", 4, "H100", 10.0, 5)];
        // Wants H100 only: the cheaper A100 pool is never chosen.
        let p = plan(&pools, &[gpu_task(2, 4, &["H100"])]);
        assert_eq!(p.add, BTreeMap::from([("h".to_string(), 2)]));
        // Any model: one A100 node (its room), the rest on H100s.
        let p = plan(&pools, &[gpu_task(4, 3, &[])]);
        assert_eq!(
            p.add,
            BTreeMap::from([("a".to_string(), 1), ("h".to_string(), 2)])
        );
        // No room at all: capped, nothing added.
        let pools = [pool("a", 4, "A100", 4.0, 0)];
        let p = plan(&pools, &[gpu_task(1, 5, &[])]);
        assert!(p.add.is_empty());
        assert_eq!(p.capped, 5);
    }

    #[test]
    fn a_task_no_pool_can_hold_is_reported_not_scaled_for() {
        let pools = [pool("a", 4, "A100", 4.0, 10)];
        let p = plan(
            &pools,
            &[
                gpu_task(8, 2, &[]),
                gpu_task(1, 1, &["H100"]),
                gpu_task(1, 1, &[]),
            ],
        );
        assert_eq!(p.add, BTreeMap::from([("a".to_string(), 1)]));
        assert_eq!(p.unfittable.len(), 2);
        assert_eq!(p.unfittable[0].task, "cpus:1;mem:1024;gpus:8");
        assert_eq!(p.unfittable[1].models, ["H100"]);
    }

    #[test]
    fn provisioning_nodes_absorb_demand_first() {
        let mut a = pool("a", 4, "A100", 4.0, 10);
        a.provisioning = 1;
        let p = plan(&[a.clone()], &[gpu_task(1, 4, &[])]);
        assert!(p.add.is_empty(), "{p:?}");
        let p = plan(&[a], &[gpu_task(1, 6, &[])]);
        assert_eq!(p.add, BTreeMap::from([("a".to_string(), 1)]));
    }

    #[test]
    fn cpu_only_demand_uses_cpu_pools_and_fractions_share_gpus() {
        let cpu = PoolShape {
            gpus: 0,
            gpu_model: String::new(),
            ..pool("cpu", 0, "", 1.0, 10)
        };
        let pools = [cpu, pool("a", 4, "A100", 4.0, 10)];
        let d = DemandItem {
            gpu: GpuDemand::None,
            cpu_milli: 8000,
            ..gpu_task(0, 8, &[])
        };
        let p = plan(&pools, &[d]);
        assert_eq!(p.add, BTreeMap::from([("cpu".to_string(), 2)]));
        // Four half-GPU tasks fit two GPUs of one node.
        let d = DemandItem {
            gpu: GpuDemand::Fraction(500),
            ..gpu_task(0, 4, &[])
        };
        let p = plan(&pools, &[d]);
        assert_eq!(p.add, BTreeMap::from([("a".to_string(), 1)]));
    }

    #[test]
    fn on_demand_demand_avoids_spot_pools_that_an_on_demand_pool_can_replace() {
        let mut spot = pool("spot", 4, "A100", 1.0, 10);
        spot.spot = true;
        let od = pool("od", 4, "A100", 4.0, 10);
        let ls = DemandItem {
            on_demand: true,
            ..gpu_task(1, 4, &[])
        };
        // Latency-sensitive: on demand, though spot is 4x cheaper.
        let p = plan(&[spot.clone(), od.clone()], std::slice::from_ref(&ls));
        assert_eq!(p.add, BTreeMap::from([("od".to_string(), 1)]));
        // Best effort: spot.
        let p = plan(&[spot.clone(), od.clone()], &[gpu_task(1, 4, &[])]);
        assert_eq!(p.add, BTreeMap::from([("spot".to_string(), 1)]));
        // Both: one node of each; the spot node is not filled with the LS tasks.
        let p = plan(
            &[spot.clone(), od.clone()],
            &[ls.clone(), gpu_task(1, 2, &[])],
        );
        assert_eq!(
            p.add,
            BTreeMap::from([("od".to_string(), 1), ("spot".to_string(), 1)])
        );
        // A provisioning spot node does not absorb them either.
        let mut busy_spot = spot.clone();
        busy_spot.provisioning = 1;
        let p = plan(&[busy_spot, od.clone()], std::slice::from_ref(&ls));
        assert_eq!(p.add, BTreeMap::from([("od".to_string(), 1)]));
        // The on-demand pool full: they wait (capped), never spill onto spot.
        let full = pool("od", 4, "A100", 4.0, 0);
        let p = plan(&[spot.clone(), full], std::slice::from_ref(&ls));
        assert!(p.add.is_empty(), "{p:?}");
        assert_eq!(p.capped, 4);
        // No on-demand pool can hold them at all (only spot has H100s): spot it is.
        let mut h = pool("h-spot", 4, "H100", 1.0, 10);
        h.spot = true;
        let ls_h = DemandItem {
            on_demand: true,
            ..gpu_task(1, 2, &["H100"])
        };
        let p = plan(&[h, od], &[ls_h]);
        assert_eq!(p.add, BTreeMap::from([("h-spot".to_string(), 1)]));
    }
}
