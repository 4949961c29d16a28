//! Consolidation (pure): which busy nodes could go because every task on them fits in the room
//! the other nodes have, simulated with the live path's placement code.
//!
//! Each node's own tasks are first placed on it alone (best-fit, the master's GPU choice inside
//! an agent), which gives the room it has left; then a candidate's tasks, largest first, are
//! placed over the other busy nodes' room with a best-fit [`Placer`] (idle nodes are
//! scale-down's: moving work onto a node that would otherwise go saves nothing). A node is a candidate when all
//! of them fit. Candidates come most expensive first (then fewest tasks, then id), as removing
//! the priciest node saves most. The simulation is of capacity: the frameworks, not the
//! autoscaler, decide where the drained tasks go next, which is why the core drains one node at a
//! time and looks again.

use gantry_placement::{GpuDemand, ModelSet, Models, Node, Placer, Policy, TaskShape, Workload};

/// A registered node that is not leaving, and the tasks on it.
#[derive(Debug, Clone)]
pub struct NodeLoad {
    /// The node id.
    pub id: String,
    /// Its pool's price per node-hour.
    pub price_per_hour: f64,
    /// CPU of the node, milli-cores.
    pub cpu_milli: u64,
    /// Memory of the node, MiB.
    pub mem_mib: u64,
    /// GPUs of the node.
    pub gpus: u32,
    /// Their model ("" without GPUs).
    pub gpu_model: String,
    /// Its tasks: CPU (milli), memory (MiB), GPUs.
    pub tasks: Vec<(u64, u64, GpuDemand)>,
}

/// A task's GPUs as the placer sees them (`gpus` as the master shows them: whole or a fraction).
pub fn gpu_demand(gpus: f64) -> GpuDemand {
    if gpus <= 0.0 {
        GpuDemand::None
    } else if gpus.fract() == 0.0 {
        GpuDemand::Whole(gpus as u32)
    } else {
        GpuDemand::Fraction((gpus * 1000.0).round().clamp(1.0, 999.0) as u32)
    }
}

/// The indices of the busy nodes whose every task fits elsewhere, best to remove first.
pub fn candidates(nodes: &[NodeLoad]) -> Vec<usize> {
    let mut models = Models::new();
    // Any model: a task already runs on its node's model, and the pools' models are the
    // autoscaler's own (model selectors of moved tasks are the frameworks' to honour).
    let shape_of = |t: &(u64, u64, GpuDemand)| TaskShape {
        cpu_milli: t.0,
        memory_mib: t.1,
        gpu: t.2,
        models: ModelSet::ANY,
    };
    // Interning fails only past 64 models: such a node takes no tasks here.
    let ids: Vec<_> = nodes
        .iter()
        .map(|n| models.intern(&n.gpu_model).ok())
        .collect();
    let workload = Workload::new(
        nodes
            .iter()
            .flat_map(|n| n.tasks.iter())
            .map(|t| (shape_of(t), 1)),
    );
    // Each node with its own tasks on it: the room it has left (None: over-full, or a model
    // that could not be named; such a node is neither a target nor a candidate).
    let loaded: Vec<Option<Node>> = nodes
        .iter()
        .zip(&ids)
        .map(|(n, m)| {
            let node = Node::idle((*m)?, n.cpu_milli, n.mem_mib, n.gpus as usize);
            let mut alone = Placer::new(vec![node], Policy::BestFit, workload.clone(), 0).ok()?;
            for t in largest_first(&n.tasks) {
                alone.place(&shape_of(t))?;
            }
            alone.nodes().first().cloned()
        })
        .collect();
    // The busy nodes' free room summed: a candidate whose tasks ask for more than the others
    // have free in all cannot fit (a cheap bound before the placer's simulation).
    let free = |n: &Node| {
        (
            u128::from(n.cpu_free),
            u128::from(n.memory_free),
            n.gpu_free_total() as u128,
        )
    };
    let busy_free = loaded
        .iter()
        .zip(nodes)
        .filter(|(_, n)| !n.tasks.is_empty())
        .filter_map(|(l, _)| l.as_ref().map(free))
        .fold((0u128, 0u128, 0u128), |a, b| {
            (a.0 + b.0, a.1 + b.1, a.2 + b.2)
        });
    let mut out: Vec<usize> = (0..nodes.len())
        .filter(|&c| !nodes[c].tasks.is_empty() && loaded[c].is_some())
        .filter(|&c| {
            let own = loaded[c].as_ref().map_or((0, 0, 0), free);
            let need = nodes[c].tasks.iter().fold((0u128, 0u128, 0u128), |a, t| {
                (
                    a.0 + u128::from(t.0),
                    a.1 + u128::from(t.1),
                    a.2 + u128::from(t.2.milli()),
                )
            });
            need.0 <= busy_free.0 - own.0
                && need.1 <= busy_free.1 - own.1
                && need.2 <= busy_free.2 - own.2
        })
        .filter(|&c| {
            // Onto busy nodes only: an idle node is scale-down's, and moving work onto it
            // instead of letting it go saves nothing.
            let others: Vec<Node> = loaded
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != c && !nodes[*i].tasks.is_empty())
                .filter_map(|(_, n)| n.clone())
                .collect();
            let Ok(mut placer) = Placer::new(others, Policy::BestFit, workload.clone(), 0) else {
                return false;
            };
            largest_first(&nodes[c].tasks)
                .into_iter()
                .all(|t| placer.place(&shape_of(t)).is_some())
        })
        .collect();
    out.sort_by(|&a, &b| {
        nodes[b]
            .price_per_hour
            .total_cmp(&nodes[a].price_per_hour)
            .then(nodes[a].tasks.len().cmp(&nodes[b].tasks.len()))
            .then(nodes[a].id.cmp(&nodes[b].id))
    });
    out
}

/// Whether one empty node of the shape (`cpu_milli`, `mem_mib`, `gpus` of one model) holds
/// every task in `tasks` (best-fit, largest first: the live path's placer): a replacement
/// node for them (Karpenter's "replace").
pub fn holds_all(tasks: &[(u64, u64, GpuDemand)], cpu_milli: u64, mem_mib: u64, gpus: u32) -> bool {
    nodes_to_hold(tasks, cpu_milli, mem_mib, gpus, 1) == Some(1)
}

/// The fewest empty nodes of the shape (`cpu_milli`, `mem_mib`, `gpus` of one model), at most
/// `max`, that hold every task in `tasks` between them (best-fit, largest first: the live
/// path's placer); `None` when `max` of them do not (or `tasks` is empty). Replacing one node
/// by several cheaper ones asks for this many.
pub fn nodes_to_hold(
    tasks: &[(u64, u64, GpuDemand)],
    cpu_milli: u64,
    mem_mib: u64,
    gpus: u32,
    max: u32,
) -> Option<u32> {
    if tasks.is_empty() {
        return None;
    }
    let mut models = Models::new();
    let model = models.intern("").ok()?;
    let order = largest_first(tasks);
    // At least as many nodes as the GPUs, CPU and memory asked for need.
    let need = |total: u128, per: u64| total.div_ceil(u128::from(per.max(1))) as u32;
    let gpu_milli: u128 = tasks.iter().map(|t| u128::from(t.2.milli())).sum();
    let least = need(tasks.iter().map(|t| u128::from(t.0)).sum(), cpu_milli)
        .max(need(tasks.iter().map(|t| u128::from(t.1)).sum(), mem_mib))
        .max(if gpu_milli == 0 {
            1
        } else {
            need(
                gpu_milli,
                u64::from(gpus) * u64::from(gantry_placement::GPU_MILLI),
            )
        })
        .max(1);
    (least..=max).find(|&n| {
        let nodes = vec![Node::idle(model, cpu_milli, mem_mib, gpus as usize); n as usize];
        let Ok(mut placer) = Placer::new(nodes, Policy::BestFit, Workload::default(), 0) else {
            return false;
        };
        order.iter().all(|t| {
            placer
                .place(&TaskShape {
                    cpu_milli: t.0,
                    memory_mib: t.1,
                    gpu: t.2,
                    models: ModelSet::ANY,
                })
                .is_some()
        })
    })
}

fn largest_first(tasks: &[(u64, u64, GpuDemand)]) -> Vec<&(u64, u64, GpuDemand)> {
    let mut v: Vec<_> = tasks.iter().collect();
    v.sort_by_key(|t| std::cmp::Reverse((t.2.milli(), t.0, t.1)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, price: f64, tasks: &[u32]) -> NodeLoad {
        NodeLoad {
            id: id.into(),
            price_per_hour: price,
            cpu_milli: 8000,
            mem_mib: 32768,
            gpus: 2,
            gpu_model: "A100".into(),
            tasks: tasks
                .iter()
                .map(|&g| (500, 64, GpuDemand::Whole(g)))
                .collect(),
        }
    }

    #[test]
    fn half_full_nodes_consolidate_most_expensive_first() {
        let nodes = [
            node("a", 36.0, &[1]),
            node("b", 72.0, &[1]),
            node("c", 36.0, &[]),
        ];
        // b's task fits a or c; a's fits b or c; c is idle (scale-down's business).
        assert_eq!(candidates(&nodes), [1, 0]);
    }

    #[test]
    fn a_node_whose_tasks_do_not_fit_elsewhere_stays() {
        let nodes = [node("a", 36.0, &[2]), node("b", 36.0, &[1])];
        // a's 2-GPU task fits nowhere else; b's 1-GPU task has no room on a.
        assert!(candidates(&nodes).is_empty());
        let nodes = [
            node("a", 36.0, &[1, 1]),
            node("b", 36.0, &[1]),
            node("c", 36.0, &[1]),
        ];
        // b's task fits c (and c's fits b); a's two fit one each on b and c. Fewest tasks
        // first at one price.
        assert_eq!(candidates(&nodes), [1, 2, 0]);
    }

    #[test]
    fn every_task_of_the_candidate_must_fit() {
        // Two 1-GPU tasks on b; only one GPU free elsewhere (and none for a's task).
        let nodes = [node("a", 36.0, &[1]), node("b", 36.0, &[1, 1])];
        assert!(candidates(&nodes).is_empty());
        // CPU counts too: a's task needs more CPU than b has left.
        let mut nodes = [node("a", 36.0, &[1]), node("b", 36.0, &[1])];
        nodes[0].tasks[0].0 = 6000;
        nodes[1].tasks[0].0 = 6000;
        assert!(candidates(&nodes).is_empty());
    }

    #[test]
    fn the_fewest_nodes_that_hold_the_tasks() {
        let tasks = [
            (500, 64, GpuDemand::Whole(2)),
            (500, 64, GpuDemand::Whole(1)),
            (500, 64, GpuDemand::Whole(1)),
        ];
        // Four GPUs of work: one 4-GPU node, two 2-GPU nodes, four 1-GPU nodes (the 2-GPU
        // task fits none of those: never).
        assert_eq!(nodes_to_hold(&tasks, 8000, 32768, 4, 8), Some(1));
        assert_eq!(nodes_to_hold(&tasks, 8000, 32768, 2, 8), Some(2));
        assert_eq!(nodes_to_hold(&tasks, 8000, 32768, 1, 8), None);
        // Bounded by max; memory counts too.
        assert_eq!(nodes_to_hold(&tasks, 8000, 32768, 2, 1), None);
        assert_eq!(nodes_to_hold(&tasks, 8000, 100, 2, 8), Some(3));
        assert_eq!(nodes_to_hold(&[], 8000, 32768, 2, 8), None);
        assert!(holds_all(&tasks, 8000, 32768, 4));
        assert!(!holds_all(&tasks, 8000, 32768, 2));
    }

    #[test]
    fn gpu_amounts_read_as_whole_or_fractions() {
        assert_eq!(gpu_demand(0.0), GpuDemand::None);
        assert_eq!(gpu_demand(2.0), GpuDemand::Whole(2));
        assert_eq!(gpu_demand(0.25), GpuDemand::Fraction(250));
    }
}
