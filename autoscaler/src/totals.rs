//! The autoscaler's own cost report, carried across restarts and HA failovers.
//!
//! A [`Core`](crate::core::Core) starts from nothing each time a copy starts or starts
//! leading; its report alone would start again from zero. After each round the runtime saves
//! the cumulative figures ([`Totals::from_report`]) to a [`TotalsStore`] — etcd when the
//! autoscaler runs with `--etcd` (the key `PREFIX/totals`, beside its election), a local file
//! otherwise — and a copy that starts leading loads them and adds them to its own
//! ([`Totals::carry`]). The seconds between the last saved round and the takeover are not
//! billed (at most a round plus the lease TTL; docs/autoscaling.md). Totals that cannot be
//! read are never overwritten: the runtime saves only after a successful load.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::core::Report;
use crate::cost::Costs;

/// One pool's cumulative figures (as in [`crate::core::PoolReport`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PoolTotals {
    /// Node-seconds.
    pub node_seconds: f64,
    /// Node cost.
    pub cost: f64,
    /// Termination notices.
    pub interruptions: u64,
    /// Scale-up decisions.
    pub scale_ups: u64,
    /// Nodes drained for being idle.
    pub scale_downs: u64,
    /// Busy nodes drained by consolidation.
    pub consolidations: u64,
    /// Of those, replaced by cheaper nodes.
    pub replaced_by_cheaper: u64,
    /// Nodes created.
    pub nodes_created: u64,
    /// Nodes that did not register in time.
    pub provision_failures: u64,
}

/// The cumulative figures of every earlier leader (what [`TotalsStore`] keeps).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// Per pool name (a pool no longer configured keeps its figures here and in
    /// `total_cost`).
    pub pools: BTreeMap<String, PoolTotals>,
    /// Sum of the pools' costs.
    pub total_cost: f64,
    /// Attributed cost per role, framework, user and pool.
    pub by_role: BTreeMap<String, f64>,
    /// Per framework.
    pub by_framework: BTreeMap<String, f64>,
    /// Per user.
    pub by_user: BTreeMap<String, f64>,
    /// Per pool: what tasks were charged.
    pub by_pool: BTreeMap<String, f64>,
    /// The tasks being charged and up to when (Unix ms), so the next leader charges them
    /// from there ([`crate::cost::CostBook::resume`]) and not again from their start.
    pub charged_until: BTreeMap<String, u64>,
}

fn add_map(to: &mut BTreeMap<String, f64>, from: &BTreeMap<String, f64>) {
    for (k, v) in from {
        *to.entry(k.clone()).or_default() += v;
    }
}

impl Totals {
    /// The cumulative figures of `report` (one that already carries the earlier totals); the
    /// runtime adds `charged_until` from its book.
    pub fn from_report(report: &Report) -> Totals {
        Totals {
            pools: report
                .pools
                .iter()
                .map(|p| {
                    (
                        p.name.clone(),
                        PoolTotals {
                            node_seconds: p.node_seconds,
                            cost: p.cost,
                            interruptions: p.interruptions,
                            scale_ups: p.scale_ups,
                            scale_downs: p.scale_downs,
                            consolidations: p.consolidations,
                            replaced_by_cheaper: p.replaced_by_cheaper,
                            nodes_created: p.nodes_created,
                            provision_failures: p.provision_failures,
                        },
                    )
                })
                .collect(),
            total_cost: report.total_cost,
            by_role: report.costs.by_role.clone(),
            by_framework: report.costs.by_framework.clone(),
            by_user: report.costs.by_user.clone(),
            by_pool: report.costs.by_pool.clone(),
            charged_until: BTreeMap::new(),
        }
    }

    /// Adds these totals to `report` (a fresh core's, before
    /// [`Report::attribute`](crate::core::Report::attribute)) and to `costs` (the runtime's
    /// attribution), so the report continues them. A pool no longer configured counts in
    /// `total_cost` only.
    pub fn carry(&self, report: &mut Report, costs: &mut Costs) {
        let mut total = 0.0;
        for p in &mut report.pools {
            let Some(t) = self.pools.get(&p.name) else {
                continue;
            };
            p.node_seconds += t.node_seconds;
            p.cost += t.cost;
            p.idle_cost += t.cost;
            p.interruptions += t.interruptions;
            p.scale_ups += t.scale_ups;
            p.scale_downs += t.scale_downs;
            p.consolidations += t.consolidations;
            p.replaced_by_cheaper += t.replaced_by_cheaper;
            p.nodes_created += t.nodes_created;
            p.provision_failures += t.provision_failures;
            total += t.cost;
        }
        let gone: f64 = self
            .pools
            .iter()
            .filter(|(name, _)| !report.pools.iter().any(|p| &p.name == *name))
            .map(|(_, t)| t.cost)
            .sum();
        report.total_cost += total + gone;
        add_map(&mut costs.by_role, &self.by_role);
        add_map(&mut costs.by_framework, &self.by_framework);
        add_map(&mut costs.by_user, &self.by_user);
        add_map(&mut costs.by_pool, &self.by_pool);
    }
}

/// Totals that could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum TotalsError {
    /// The store did not answer.
    #[error("{0}")]
    Io(String),
    /// What it holds is not totals (left as it is).
    #[error("{what}: not the autoscaler's totals: {message}")]
    Corrupt {
        /// Where.
        what: String,
        /// The parse error.
        message: String,
    },
}

/// Where the totals survive the process.
pub trait TotalsStore: Send {
    /// The saved totals (`None`: none saved yet).
    fn load(&mut self) -> Result<Option<Totals>, TotalsError>;
    /// Replaces them.
    fn save(&mut self, totals: &Totals) -> Result<(), TotalsError>;
}

/// Reads totals from JSON bytes (`what` names the place, for the error).
pub fn decode(what: &str, bytes: &[u8]) -> Result<Totals, TotalsError> {
    serde_json::from_slice(bytes).map_err(|e| TotalsError::Corrupt {
        what: what.to_string(),
        message: e.to_string(),
    })
}

/// A local JSON file, written atomically (a temporary file and a rename).
#[derive(Debug, Clone)]
pub struct FileStore {
    /// The file.
    pub path: PathBuf,
}

impl TotalsStore for FileStore {
    fn load(&mut self) -> Result<Option<Totals>, TotalsError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => decode(&self.path.display().to_string(), &bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(TotalsError::Io(format!(
                "reading {}: {e}",
                self.path.display()
            ))),
        }
    }

    fn save(&mut self, totals: &Totals) -> Result<(), TotalsError> {
        crate::runtime::write_atomic(&self.path, totals)
            .map_err(|e| TotalsError::Io(format!("writing {}: {e}", self.path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::core::Core;

    const POOLS: &str = r#"
        [[pool]]
        name = "gpu"
        cpus = 16
        mem = 65536
        gpus = 2
        gpu_model = "A100"
        price_per_hour = 36
        max = 4
        provider = { kind = "local" }
    "#;

    #[test]
    fn a_new_core_continues_the_saved_totals() {
        let config = Config::parse(POOLS).unwrap();
        let mut first = Core::new(config.clone());
        first.created("gpu", &["n1".into()], 0);
        let mut r1 = first.report(3_600_000);
        let mut costs = Costs::default();
        costs.by_role.insert("ml".into(), 10.0);
        costs.by_pool.insert("gpu".into(), 10.0);
        Totals::default().carry(&mut r1, &mut costs);
        r1.attribute(&costs);
        let saved = Totals::from_report(&r1);
        assert_eq!(saved.pools["gpu"].nodes_created, 1);
        assert!((saved.total_cost - 36.0).abs() < 1e-9);

        // The next leader adopts n1 (billed from its start) and runs an hour.
        let mut second = Core::new(config);
        second.adopt("gpu", "n1", 0);
        second.created("gpu", &["n2".into()], 0);
        let mut r2 = second.report(3_600_000);
        let mut costs = Costs::default();
        costs.by_role.insert("ml".into(), 5.0);
        costs.by_pool.insert("gpu".into(), 5.0);
        saved.carry(&mut r2, &mut costs);
        r2.attribute(&costs);
        let p = &r2.pools[0];
        assert_eq!(p.nodes_created, 2);
        assert!((p.node_seconds - 3.0 * 3600.0).abs() < 1e-6, "{p:?}");
        assert!((p.cost - 108.0).abs() < 1e-9);
        assert!((r2.total_cost - 108.0).abs() < 1e-9);
        assert!((r2.costs.by_role["ml"] - 15.0).abs() < 1e-9);
        assert!((p.task_cost - 15.0).abs() < 1e-9);
        assert!((p.idle_cost - 93.0).abs() < 1e-9);
    }

    #[test]
    fn a_resumed_book_charges_a_running_task_from_where_the_last_one_stopped() {
        use crate::cost::{CostBook, NodeShape, TaskObs};
        let shape = |_: &str| {
            Some(NodeShape {
                pool: "gpu".into(),
                price_per_hour: 36.0,
                cpus: 16.0,
                mem: 65536.0,
                gpus: 2.0,
            })
        };
        let task = TaskObs {
            id: "t".into(),
            node: "n1".into(),
            role: "ml".into(),
            framework: "f".into(),
            user: "u".into(),
            cpus: 1.0,
            mem: 64.0,
            gpus: 1.0,
            staged_ms: 0,
        };
        // Half a node (1 of 2 GPUs) at 36/h: 18 per hour.
        let mut first = CostBook::new();
        first.observe(3_600_000, std::slice::from_ref(&task), shape);
        assert!((first.costs().by_role["ml"] - 18.0).abs() < 1e-9);
        let mut second = CostBook::new();
        second.resume(first.charged());
        second.observe(7_200_000, std::slice::from_ref(&task), shape);
        // The second hour only (a fresh book would charge both).
        assert!((second.costs().by_role["ml"] - 18.0).abs() < 1e-9);
        assert_eq!(second.charged()["t"], 7_200_000);
    }

    #[test]
    fn the_file_store_round_trips_and_refuses_what_is_not_totals() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = FileStore {
            path: dir.path().join("totals.json"),
        };
        assert_eq!(store.load().unwrap(), None);
        let t = Totals {
            total_cost: 12.5,
            pools: BTreeMap::from([("gpu".to_string(), PoolTotals::default())]),
            ..Totals::default()
        };
        store.save(&t).unwrap();
        assert_eq!(store.load().unwrap(), Some(t));
        std::fs::write(&store.path, b"{not json").unwrap();
        let e = store.load().unwrap_err();
        assert!(e.to_string().contains("not the autoscaler's totals"), "{e}");
        // Older or partial files read with zeros for what they lack.
        std::fs::write(&store.path, br#"{"total_cost": 3.0}"#).unwrap();
        assert_eq!(store.load().unwrap().unwrap().total_cost, 3.0);
    }
}
