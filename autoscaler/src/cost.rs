//! Cost per role, framework and user (pure): what the autoscaler's nodes cost, attributed to the
//! tasks that held their resources.
//!
//! A node costs its pool's price per hour while it exists ([`crate::core`] bills it from
//! creation to deletion). A task on it is charged `price × share × time held`, where the time
//! held runs from when the master staged it (its resources are taken from then) to when it
//! ended, and its **share** is dominant over the node's shape: the largest of its GPUs, CPUs and
//! memory over the node's. On a GPU node the GPUs are what a task usually holds most of, so a
//! 1-GPU task on a 2-GPU node pays half the node whatever CPUs it takes (GPU-dominant, as the
//! price of a GPU node is mostly its GPUs). What no task pays for is the pool's **idle cost**:
//! the node's cost minus what its tasks were charged (never below zero: when one task holds a
//! node's GPUs and another most of its memory, their shares can add up to more than the node).
//!
//! The book is fed each round with the tasks active on the autoscaler's nodes and the time;
//! tasks it tracked that are no longer active are returned so the runtime can ask the master
//! when they ended ([`CostBook::ended`] settles each to its end, correcting the last round's
//! charge to the millisecond). Time is Unix milliseconds, the master's task timestamps.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// A node's shape and price, for the shares of the tasks on it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeShape {
    /// Its pool.
    pub pool: String,
    /// The pool's price per node-hour.
    pub price_per_hour: f64,
    /// CPUs, memory (MiB) and GPUs of a node of the pool.
    pub cpus: f64,
    /// Memory, MiB.
    pub mem: f64,
    /// GPUs (whole).
    pub gpus: f64,
}

/// A task active on one of the autoscaler's nodes, as the master shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskObs {
    /// The task id.
    pub id: String,
    /// The node (agent name) it runs on.
    pub node: String,
    /// Its role.
    pub role: String,
    /// Its framework's name (its id when it has none).
    pub framework: String,
    /// The user it runs as (empty when the master does not say).
    pub user: String,
    /// CPUs it holds.
    pub cpus: f64,
    /// Memory it holds, MiB.
    pub mem: f64,
    /// GPUs it holds (fractions included).
    pub gpus: f64,
    /// When the master staged it (Unix ms).
    pub staged_ms: u64,
}

/// Costs attributed so far (in the pools' price unit).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Costs {
    /// Per role.
    pub by_role: BTreeMap<String, f64>,
    /// Per framework (name, else id).
    pub by_framework: BTreeMap<String, f64>,
    /// Per user.
    pub by_user: BTreeMap<String, f64>,
    /// Per pool: what its tasks were charged (its idle cost is its node cost minus this).
    pub by_pool: BTreeMap<String, f64>,
}

/// The task's dominant share of a node of `shape`, at most 1 (the attribution the master's
/// usage reports use too: [`gantry_placement::cost::dominant_share`]).
pub fn share(shape: &NodeShape, t: &TaskObs) -> f64 {
    use gantry_placement::cost::{dominant_share, Amounts};
    dominant_share(
        &Amounts {
            cpus: t.cpus,
            mem: t.mem,
            gpus: t.gpus,
        },
        &Amounts {
            cpus: shape.cpus,
            mem: shape.mem,
            gpus: shape.gpus,
        },
    )
}

#[derive(Debug, Clone)]
struct Tracked {
    task: TaskObs,
    pool: String,
    /// Price per millisecond × share.
    rate: f64,
    charged_until: u64,
}

/// The running attribution ([`Costs`]) and the tasks being charged.
#[derive(Debug, Clone, Default)]
pub struct CostBook {
    tracked: BTreeMap<String, Tracked>,
    costs: Costs,
    /// Where an earlier book stopped charging tasks ([`CostBook::resume`]).
    resume_from: BTreeMap<String, u64>,
}

impl CostBook {
    /// An empty book.
    pub fn new() -> CostBook {
        CostBook::default()
    }

    /// What was attributed so far.
    pub fn costs(&self) -> &Costs {
        &self.costs
    }

    /// One round: charges every task in `active` up to `now_ms` (those on nodes `shape_of`
    /// does not know are not the autoscaler's and are ignored), and returns the ids of tracked
    /// tasks no longer active, for [`CostBook::ended`].
    pub fn observe(
        &mut self,
        now_ms: u64,
        active: &[TaskObs],
        shape_of: impl Fn(&str) -> Option<NodeShape>,
    ) -> Vec<String> {
        let mut seen = BTreeSet::new();
        for t in active {
            let Some(shape) = shape_of(&t.node) else {
                continue;
            };
            seen.insert(t.id.clone());
            let tr = self.tracked.entry(t.id.clone()).or_insert_with(|| Tracked {
                rate: shape.price_per_hour / 3_600_000.0 * share(&shape, t),
                pool: shape.pool.clone(),
                task: t.clone(),
                charged_until: t.staged_ms.max(self.resume_from.remove(&t.id).unwrap_or(0)),
            });
            let to = now_ms.max(tr.charged_until);
            charge(&mut self.costs, tr, to);
        }
        self.tracked
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect()
    }

    /// A tracked task ended at `end_ms` (`None`: the master no longer knows; it stays charged
    /// up to the last round that saw it). Charges or refunds the difference and forgets it.
    pub fn ended(&mut self, id: &str, end_ms: Option<u64>) {
        if let Some(mut tr) = self.tracked.remove(id) {
            if let Some(end) = end_ms {
                let to = end.max(tr.task.staged_ms);
                charge(&mut self.costs, &mut tr, to);
            }
        }
    }

    /// Continues an earlier book (another process's): each task in `charged` was charged up
    /// to that time (Unix ms) and is charged from there when it is next observed.
    pub fn resume(&mut self, charged: BTreeMap<String, u64>) {
        self.resume_from = charged;
    }

    /// Up to when each tracked task was charged (Unix ms), for [`CostBook::resume`].
    pub fn charged(&self) -> BTreeMap<String, u64> {
        let mut out = self.resume_from.clone();
        out.extend(
            self.tracked
                .iter()
                .map(|(id, t)| (id.clone(), t.charged_until)),
        );
        out
    }

    /// Tasks being charged.
    pub fn tracked(&self) -> usize {
        self.tracked.len()
    }
}

/// Charges `tr` from where it was charged to `to` (a refund when `to` is earlier).
fn charge(costs: &mut Costs, tr: &mut Tracked, to: u64) {
    let ms = to as f64 - tr.charged_until as f64;
    let amount = ms * tr.rate;
    tr.charged_until = to;
    if amount == 0.0 {
        return;
    }
    let t = &tr.task;
    for (map, key) in [
        (&mut costs.by_role, &t.role),
        (&mut costs.by_framework, &t.framework),
        (&mut costs.by_user, &t.user),
        (&mut costs.by_pool, &tr.pool),
    ] {
        *map.entry(key.clone()).or_default() += amount;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_node() -> NodeShape {
        NodeShape {
            pool: "gpu".into(),
            price_per_hour: 36.0,
            cpus: 8.0,
            mem: 32768.0,
            gpus: 2.0,
        }
    }

    fn task(id: &str, fw: &str, gpus: f64, cpus: f64, staged_ms: u64) -> TaskObs {
        TaskObs {
            id: id.into(),
            node: "n1".into(),
            role: "ml".into(),
            framework: fw.into(),
            user: "alice".into(),
            cpus,
            mem: 1024.0,
            gpus,
            staged_ms,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn shares_are_dominant_over_the_node_shape() {
        let n = gpu_node();
        assert!(close(share(&n, &task("a", "f", 1.0, 1.0, 0)), 0.5));
        // A CPU-heavy task without GPUs pays its CPU share.
        assert!(close(share(&n, &task("b", "f", 0.0, 6.0, 0)), 0.75));
        // A fraction of a GPU.
        assert!(close(share(&n, &task("c", "f", 0.25, 0.5, 0)), 0.125));
        // Never more than the node.
        assert!(close(share(&n, &task("d", "f", 4.0, 1.0, 0)), 1.0));
    }

    #[test]
    fn a_task_pays_its_share_from_staging_to_its_end_exactly() {
        let mut book = CostBook::new();
        let shape = |node: &str| (node == "n1").then(gpu_node);
        let hour = 3_600_000;
        let t = task("a", "train", 1.0, 1.0, 1000);
        // Rounds every half hour; a task on another node is not ours.
        let mut other = task("x", "train", 1.0, 1.0, 1000);
        other.node = "elsewhere".into();
        assert!(book
            .observe(1000 + hour / 2, &[t.clone(), other], shape)
            .is_empty());
        assert!(close(book.costs().by_framework["train"], 9.0));
        assert!(book
            .observe(1000 + hour, std::slice::from_ref(&t), shape)
            .is_empty());
        assert!(close(book.costs().by_framework["train"], 18.0));
        // The next round no longer sees it: it ended 6 minutes before that round, which the
        // settlement refunds.
        let left = book.observe(1000 + hour + hour / 10, &[], shape);
        assert_eq!(left, ["a"]);
        book.ended("a", Some(1000 + hour - hour / 10));
        let c = book.costs();
        assert!(close(c.by_framework["train"], 18.0 * 0.9), "{c:?}");
        assert!(close(c.by_role["ml"], 16.2) && close(c.by_user["alice"], 16.2));
        assert!(close(c.by_pool["gpu"], 16.2));
        assert!(!c.by_framework.contains_key("elsewhere"));
        assert_eq!(book.tracked(), 0);
        // Settled once: a second end changes nothing.
        book.ended("a", Some(1000 + 2 * hour));
        assert!(close(book.costs().by_framework["train"], 16.2));
    }

    #[test]
    fn a_task_the_master_forgot_stays_charged_to_its_last_round() {
        let mut book = CostBook::new();
        let shape = |_: &str| Some(gpu_node());
        let t = task("a", "f", 2.0, 1.0, 0);
        book.observe(3_600_000, &[t], shape);
        let left = book.observe(7_200_000, &[], shape);
        book.ended(&left[0], None);
        assert!(close(book.costs().by_framework["f"], 36.0));
    }
}
